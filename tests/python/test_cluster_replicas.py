"""A reader or a queue made while a NATS node is down gets every item stored after it,
whatever that node's copy of the stream does when it comes back and leads the reader.

The sequence that lost acknowledged items on interest retention: a node is killed, a
reader (or a queue) is made, items are stored and drained by the default reader, the
node comes back, and the reader's consumer leader moves to it, by a step-down or by
killing the leader. nats-server's returning replica applied the default reader's acks
before it had the new consumer and dropped the items; its leader then moved past
them and the other replicas deleted them too. weir's stream keeps every item until
weir itself purges what every reader has confirmed (docs/cluster.md, "How items are
kept"), so no replica decides alone.

Run by scripts/test's JetStream pass (WEIR_TEST_BACKEND=jetstream).
"""

from __future__ import annotations

import time

import pytest

import harness
from harness import Conn
from test_cluster import cluster, cluster_dir, cluster_of_its_own, drain_patiently, stream_leader

pytestmark = [
    pytest.mark.jetstream_only,
    pytest.mark.weir_only,
    # Kills nodes of a cluster of its own (the fixture below), beside other tests.
    pytest.mark.own_cluster,
]


@pytest.fixture(scope="module", autouse=True)
def own_cluster():
    """These tests kill nodes and wait for elections and restarts, a minute or more
    each: on a cluster of their own they overlap with the shared cluster's fault tests
    (scripts/test)."""
    with cluster_of_its_own(port_offset=2000):
        yield

ITEMS = 100
# A consumer creation on two of three nodes, with room for a loaded test machine.
FIRST_SET_MAX_S = 10.0


def node_of(name: str) -> int:
    assert name in ("n1", "n2", "n3"), f"unexpected node name {name!r}"
    return int(name[1])


def consumer_leader(stream: str, consumer: str, timeout_s: float = 30.0) -> int:
    """The node leading `consumer`, once it has one."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return node_of(harness.consumer_leader(stream, consumer))
        except Exception:  # noqa: BLE001 - no leader for the moment, or a node restarting
            if time.monotonic() > deadline:
                raise
            time.sleep(0.25)


def move_leader_to(stream: str, consumer: str, node: int, how: str) -> None:
    """Moves `consumer`'s leader to `node`: by asking the leader to step down, or by
    killing the leader (and bringing it back), until `node` is elected."""
    d = cluster_dir()
    for _ in range(12):
        leader = consumer_leader(stream, consumer)
        if leader == node:
            return
        if how == "step_down":
            try:
                harness.consumer_step_down(stream, consumer)
            except Exception:  # noqa: BLE001 - a step-down during an election
                time.sleep(0.5)
        else:
            cluster("kill", d, str(leader))
            time.sleep(1.0)
            consumer_leader(stream, consumer)
            cluster("restart", d, str(leader))
        time.sleep(0.5)
    raise AssertionError(f"the leader of {consumer} never moved to n{node}")


def a_follower(stream: str) -> int:
    """A node that leads neither the stream nor the cluster's metadata. Killing the
    metadata leader holds every creation up for its election (4 to 9 s, plus the
    request that waited on it): a new queue's first set then ran past
    unavailable_retry_ms now and then, which is not what this test is about."""
    from test_cluster_unknown import meta_leader

    avoid = {stream_leader(stream), meta_leader()}
    return next(n for n in (1, 2, 3) if n not in avoid)


def get_answered(c: Conn, key: str) -> bytes | None:
    """`get key`, asked again while it answers `SERVER_ERROR backend unavailable`.
    With a node killed, a new reader's consumer elects its first leader among the
    two nodes left, and the consumer leader of the doors' stream may be on the
    killed node too: now and then that takes longer than unavailable_retry_ms, and
    the get answers `SERVER_ERROR` with the reader maybe made (docs/cluster.md), as
    a client then asks again. A reader's creation takes no item."""
    for _ in range(3):
        c.send(f"get {key}\r\n".encode())
        line = c.read_line(timeout_s=30)
        if line.startswith(b"SERVER_ERROR backend unavailable"):
            print(f"get {key}: {line[:120]!r}; asked again")
            continue
        if line == b"END\r\n":
            return None
        parts = line.split()
        assert parts[0] == b"VALUE" and len(parts) == 4, line
        value = c.read_exact(int(parts[3]) + 2)[:-2]
        assert c.read_line() == b"END\r\n"
        return value
    raise AssertionError(f"get {key} never answered")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["step_down", "kill_leader"])
@pytest.mark.parametrize("made", ["reader", "queue"])
def test_made_while_a_node_is_down_gets_every_item(make_server, made, how):
    door = make_server()
    door.start()
    d = cluster_dir()
    queue = f"rq_{made}_{how}"
    with Conn(door.addr, timeout_s=30.0) as c:
        if made == "reader":
            # The queue exists (its default reader too) before the node goes down.
            assert c.set(queue, b"first") == b"STORED\r\n"
            assert c.get(queue) == b"first"
        down = a_follower(door.stream)
        cluster("kill", d, str(down))
        try:
            # Made now, with one replica of its consumer down.
            if made == "reader":
                assert get_answered(c, f"{queue}+r") is None
            stored = []
            t0 = time.monotonic()
            for i in range(ITEMS):
                value = b"v%d" % i
                assert c.set(queue, value) == b"STORED\r\n", f"set {i}"
                stored.append(value)
                if i == 0:
                    first_set_s = time.monotonic() - t0
            # A new queue is made while a quorum is up: its first set does not wait
            # for the killed node (which nats-server marks offline only about three
            # minutes after a kill -9; until 2026-11-28 a new queue's first set
            # waited for every replica of its reader to catch up, so for that long).
            print(f"first set of the {made}'s queue: {first_set_s:.2f} s")
            assert first_set_s < FIRST_SET_MAX_S
            if made == "queue":
                assert get_answered(c, f"{queue}+r") == stored[0]
                stored = stored[1:]
            # The default reader takes (and confirms) every item.
            taken = [c.get(queue) for _ in range(ITEMS)]
            assert taken == [b"v%d" % i for i in range(ITEMS)]
        finally:
            cluster("restart", d, str(down))
    consumer = f"{queue}~r"
    move_leader_to(door.stream, consumer, down, how)
    got = drain_patiently(door.addr, f"{queue}+r")
    assert got == stored, (
        f"reader r got {len(got)} of {len(stored)} items after its leader moved to the "
        f"node that was down (first {got[:3]})"
    )
