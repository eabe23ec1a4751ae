"""Requests whose outcome the cluster decides after the door stopped waiting.

Two nodes of three are stopped (SIGSTOP) for a few seconds while the third, which
leads the stream, the queue's reader and the cluster's metadata, takes a request from
the door. The leader proposes the change but cannot commit it without a quorum; the
request gets no answer; once the two nodes resume, the proposal commits. Stopped for
less than an election timeout (4 s) and less than the leader's lost-quorum interval
(10 s), the leaders stay where they are, so what happens is the same on every run:

- a `set` whose publish is retried while its first attempt is "in process" ends
  `STORED`, and the item is stored once (JetStream's "duplicate message id is in
  process", which the door answered as an error before 2026-11-28 while the item was
  stored anyway);
- a `get q+r` whose reader creation got no answer within `unavailable_retry_ms`
  answers `SERVER_ERROR` saying the reader may have been made; it was, `stats` lists
  it, and `delete q+r` removes it, after which the queue keeps nothing its other
  reader confirmed (before, the error said nothing of it, and such a reader kept every
  item of its queue for ever).

Run by scripts/test's JetStream pass (WEIR_TEST_BACKEND=jetstream).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest

import harness
from harness import Conn
from test_cluster import cluster_dir, drain_patiently

pytestmark = [
    pytest.mark.jetstream_only,
    pytest.mark.weir_only,
    # Stops nodes of the shared test cluster: in the serial pass of its faults.
    pytest.mark.cluster_faults,
]

# Under nats-server's shortest election timeout (4 s): the stopped followers do not
# call an election when they resume, and the leaders keep their proposals.
STOP_S = 3.0
# The get's retry budget: shorter than the stop, so it gives up while the creation is
# still waiting for a quorum.
RETRY_MS = 1500


def base_port() -> int:
    return int(Path(cluster_dir(), "base_port").read_text().strip())


def node_url(node: int) -> str:
    return f"nats://{harness.HOST}:{base_port() + node - 1}"


def node_pid(node: int) -> int:
    return int(Path(cluster_dir(), f"n{node}", "pid").read_text().strip())


def meta_leader() -> int:
    """The node leading the cluster's metadata (the one that applies creations)."""
    deadline = time.monotonic() + 30
    while True:
        for node in (1, 2, 3):
            url = f"http://{harness.HOST}:{base_port() + 20 + node - 1}/jsz"
            try:
                with urllib.request.urlopen(url, timeout=5) as reply:
                    leader = json.load(reply).get("meta_cluster", {}).get("leader", "")
            except OSError:
                continue
            if leader in ("n1", "n2", "n3"):
                return int(leader[1])
        assert time.monotonic() < deadline, "no meta leader"
        time.sleep(0.5)


def lead_on(api: str, node: int, current) -> None:
    """Steps down the leader of `api` (a stream's or a consumer's) until `node`
    leads it."""
    import asyncio

    import nats

    async def step_down():
        nc = await nats.connect(servers=harness.NATS_URLS.split(","), connect_timeout=5)
        try:
            body = json.dumps({"placement": {"preferred": f"n{node}"}}).encode()
            await nc.request(f"$JS.API.{api}", body, timeout=10)
        finally:
            await nc.close()

    for _ in range(10):
        if current() == f"n{node}":
            return
        try:
            asyncio.run(asyncio.wait_for(step_down(), 30))
        except Exception:  # noqa: BLE001 - an election of the moment: ask again
            pass
        time.sleep(1.0)
    raise AssertionError(f"{api}: n{node} never led it")


def lead_everything_on(stream: str, queue: str, node: int) -> None:
    lead_on(f"STREAM.LEADER.STEPDOWN.{stream}", node, lambda: harness.stream_leader(stream))
    consumer = f"{queue}~"
    lead_on(
        f"CONSUMER.LEADER.STEPDOWN.{stream}.{consumer}",
        node,
        lambda: harness.consumer_leader(stream, consumer),
    )


class Followers:
    """The two nodes other than `leader`, stopped together for STOP_S."""

    def __init__(self, leader: int):
        self.pids = [node_pid(n) for n in (1, 2, 3) if n != leader]

    def __enter__(self) -> "Followers":
        for pid in self.pids:
            os.kill(pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc) -> None:
        for pid in self.pids:
            os.kill(pid, signal.SIGCONT)


def door_on(make_server, node: int, config: str = ""):
    """A door connected to `node` only (a stopped node would take its connection)."""
    door = make_server()
    door.nats_urls = node_url(node)
    door.config_toml = (door.config_toml or "") + config
    return door.start()


def stats(c: Conn) -> dict[str, str]:
    """`stats`, asked again while it answers `SERVER_ERROR` (with the short retry
    budget, the listing can time out while the new reader's group forms)."""
    deadline = time.monotonic() + 30
    while True:
        c.send(b"stats\r\n")
        out = {}
        while (line := c.read_line()) not in (b"END\r\n",) and not line.startswith(b"SERVER_ERROR"):
            _, name, value = line.decode().split(" ", 2)
            out[name] = value.strip()
        if line == b"END\r\n":
            return out
        assert time.monotonic() < deadline, f"stats: {line!r}"
        time.sleep(0.5)


@pytest.mark.timeout(180)
def test_a_set_retried_while_in_process_is_stored_once(make_server):
    leader = meta_leader()
    door = door_on(make_server, leader)
    queue = "iq"
    with Conn(door.addr, timeout_s=30.0) as c:
        assert c.set(queue, b"before") == b"STORED\r\n"
        lead_everything_on(door.stream, queue, leader)
        replies: list[bytes] = []
        with Followers(leader):
            # The first attempt waits 1 s for its PubAck; each retry under the same id
            # meets the first one "in process" until the followers resume.
            setter = threading.Thread(target=lambda: replies.append(c.set(queue, b"once")))
            setter.start()
            time.sleep(STOP_S)
        setter.join(timeout=30)
        assert replies == [b"STORED\r\n"], replies
    got = drain_patiently(door.addr, queue)
    time.sleep(2.0)
    got += drain_patiently(door.addr, queue)
    assert got == [b"before", b"once"], got
    # The first attempt waited 1 s; the retries met it in process.
    retries = harness.backend_retries(door)
    print(f"retries: {retries}")
    assert retries >= 2, retries


@pytest.mark.timeout(180)
def test_a_reader_made_without_an_answer_is_listed_and_removable(make_server):
    leader = meta_leader()
    door = door_on(make_server, leader, f"unavailable_retry_ms = {RETRY_MS}\n")
    queue = "mq"
    with Conn(door.addr, timeout_s=30.0) as c:
        assert c.set(queue, b"before") == b"STORED\r\n"
        assert c.get(queue) == b"before"
        lead_everything_on(door.stream, queue, leader)
        with Followers(leader):
            t0 = time.monotonic()
            c.send(f"get {queue}+r\r\n".encode())
            reply = c.read_line(timeout_s=30)
            time.sleep(max(0.0, STOP_S - (time.monotonic() - t0)))
        assert reply.startswith(b"SERVER_ERROR"), f"the get was answered: {reply!r}"
        text = reply.decode()
        assert f"reader {queue}.r may have been made" in text, text
        assert f"delete {queue}.r removes it" in text, text
        # The creation commits once a quorum is back: stats lists the reader, and
        # it keeps what the default reader confirms.
        deadline = time.monotonic() + 30
        while f"queue_{queue}+r_items" not in stats(c):
            assert time.monotonic() < deadline, "the reader never showed in stats"
            time.sleep(0.5)
        assert c.set(queue, b"after") == b"STORED\r\n"
        assert c.get(f"{queue}/t=3000") == b"after"
        kept = int(stats(c)[f"queue_{queue}_items"])
        assert kept >= 1, f"the made reader keeps nothing ({kept})"
        c.send(f"delete {queue}+r\r\n".encode())
        assert c.read_line() == b"DELETED\r\n"
        # Once it is gone, the sweep purges what the default reader confirmed.
        deadline = time.monotonic() + 30
        while (left := stats(c)).get(f"queue_{queue}_items") != "0":
            assert time.monotonic() < deadline, f"items kept after the delete: {left}"
            time.sleep(0.5)
        assert f"queue_{queue}+r_items" not in left
