"""Network faults on a cluster whose nodes each live in a network namespace of their
own (scripts/nats-cluster with NATS_NETNS=1, started here on a base port of its own):
a node isolated from everyone, a node cut from its peers while the door still reaches
it, a node the door cannot reach, and a ledger of every STORED and every confirmation
over all of them, a SIGSTOP and a kill -9 (docs/cluster.md, "Guarantees, restated" and
"Failures").

Needs root and iproute2 (network namespaces). Skipped where the machine cannot make
them, unless WEIR_REQUIRE_NETNS=1 (scripts/test sets it where it can), which turns the
skip into a failure. Run by scripts/test's JetStream pass (WEIR_TEST_BACKEND=jetstream).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from harness import Conn, wait_lease_timeout_or_settled
from test_cluster import CLUSTER_SCRIPT, PatientWriter, Reader

pytestmark = [
    pytest.mark.jetstream_only,
    pytest.mark.weir_only,
    # Cuts off, stops and kills nodes of a cluster of its own (the `net` fixture),
    # beside other tests.
    pytest.mark.own_cluster,
]

# Well above the defaults' worst case (three 2 s pings, or failover_ms of 5 s, then a
# connection attempt to a server that does not answer, 5 s, and an election of up to
# 9 s where the node led), and far under the minutes a door stayed before.
FAILOVER_MAX_S = 30.0
# A short lease timeout: a lease whose pull reply was lost with a cut node comes back
# after it; the ledger test waits that out before its last drain.
LEASE_TIMEOUT_MS = 10_000


def netns_possible() -> str | None:
    """Why network namespaces cannot be made here; None when they can."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("ip") is None:
        return "no iproute2 (ip)"
    name = f"weirprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True)
    if made.returncode != 0:
        return f"ip netns add: {made.stderr.decode(errors='replace').strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


class NetCluster:
    def __init__(self, d: str):
        self.dir = d
        self.base = int(Path(d, "base_port").read_text())
        self.urls = self.run("urls").strip()
        self.hosts = {n: u.split("//")[1].split(":")[0] for n, u in enumerate(self.urls.split(","), 1)}

    def run(self, *args: str) -> str:
        done = subprocess.run([str(CLUSTER_SCRIPT), args[0], self.dir, *args[1:]],
                              timeout=150, capture_output=True,
                              env=dict(os.environ, NATS_TIMEOUT_S="120"))
        assert done.returncode == 0, f"nats-cluster {' '.join(args)}: {done.stderr.decode(errors='replace')}"
        return done.stdout.decode()

    def monitoring(self, node: int, path: str) -> dict:
        url = f"http://{self.hosts[node]}:{self.base + 20 + node - 1}{path}"
        with urllib.request.urlopen(url, timeout=3) as reply:
            return json.load(reply)

    def door_node(self, door, skip: int | None = None) -> int:
        """The node `door` is connected to (a door names its NATS connection
        `weir-<pid, hex>-<start>`); node `skip` is not asked. A node that was cut off
        may still list a connection of an earlier door, dead since."""
        mine = f"weir-{door.proc.pid:x}-"
        found = []
        for n in (1, 2, 3):
            if n == skip:
                continue
            conns = self.monitoring(n, "/connz?limit=1024").get("connections") or []
            found += [(c.get("start", ""), n) for c in conns if c.get("name", "").startswith(mine)]
        assert found, "the door has no connection"
        # A node healed a moment ago can still list the door's connection from before
        # the cut: the newest connection is the live one (RFC 3339 sorts).
        return max(found)[1]

    def stream_leader(self, stream: str, timeout_s: float = 30.0) -> int:
        """The node leading `stream`, once it has a leader (an election may be on)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for n in (1, 2, 3):
                try:
                    jsz = self.monitoring(n, "/jsz?streams=true")
                except OSError:
                    continue
                for account in jsz.get("account_details") or []:
                    for s in account.get("stream_detail") or []:
                        leader = (s.get("cluster") or {}).get("leader", "")
                        if s.get("name") == stream and leader:
                            return int(leader[1])
            assert time.monotonic() < deadline, f"no leader of {stream} found"
            time.sleep(0.5)

    def pid(self, node: int) -> int:
        return int(Path(self.dir, f"n{node}", "pid").read_text().strip())


@pytest.fixture(scope="module")
def net():
    why = netns_possible()
    if why is not None:
        if os.environ.get("WEIR_REQUIRE_NETNS") == "1":
            pytest.fail(f"network namespaces are required here (WEIR_REQUIRE_NETNS=1): {why}")
        pytest.skip(f"network namespaces cannot be made here: {why}")
    d = tempfile.mkdtemp(prefix="weir-netns-")
    base = int(os.environ.get("WEIR_TEST_NATS_BASE", "26222")) + 1000
    env = dict(os.environ, NATS_NETNS="1")
    try:
        started = subprocess.run([str(CLUSTER_SCRIPT), "start", d, str(base)], timeout=150,
                                 env=env, capture_output=True)
        assert started.returncode == 0, started.stderr.decode(errors="replace")
        yield NetCluster(d)
    finally:
        subprocess.run([str(CLUSTER_SCRIPT), "stop", d], timeout=90, capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


def door_on(make_server, net: NetCluster, config: str = ""):
    door = make_server()
    door.nats_urls = net.urls
    door.config_toml = config or None
    return door.start()


def set_until_stored(c: Conn, queue: str, limit_s: float) -> tuple[float | None, list[bytes], list[bytes]]:
    """Sets v0, v1, ... until one is STORED: (seconds to it, STORED values, others sent)."""
    t0 = time.monotonic()
    i, maybe = 0, []
    while time.monotonic() - t0 < limit_s:
        value = b"v%d" % i
        i += 1
        if c.set(queue, value) == b"STORED\r\n":
            return time.monotonic() - t0, [value], maybe
        maybe.append(value)
    return None, [], maybe


def drain(addr, key: str, expected: tuple[bytes, ...] = ()) -> list[bytes]:
    """Waiting gets until two in a row, 2 s apart, find nothing and every `expected`
    item came (a node back from a cut can lead the reader for a while with its copy
    of the stream behind: on a loaded machine an item STORED through the others came
    after more than the two empty gets), or 90 s pass: an item lost never comes."""
    got, empty = [], 0
    deadline = time.monotonic() + 90
    with Conn(addr, timeout_s=20.0) as c:
        while time.monotonic() < deadline:
            value = c.get(f"{key}/t=2000")
            if value is not None:
                empty = 0
                got.append(value)
                continue
            empty += 1
            if empty >= 2 and all(v in got for v in expected):
                break
    return got


@pytest.mark.timeout(240)
@pytest.mark.parametrize("shape", ["all", "peers", "clients"])
def test_a_door_leaves_a_cut_off_server_in_seconds(make_server, net, shape):
    """The door's own server is cut off (from everyone, from its peers only, or from the
    door only): the door's next set is STORED within seconds, through another server,
    and nothing STORED is lost."""
    door = door_on(make_server, net)
    queue = f"cut_{shape}"
    with Conn(door.addr, timeout_s=30.0) as c:
        assert c.set(queue, b"before") == b"STORED\r\n"
        node = net.door_node(door)
        net.run("cut", str(node), shape)
        try:
            took, stored, maybe = set_until_stored(c, queue, 3 * FAILOVER_MAX_S)
            print(f"cut {shape} at n{node}: first STORED after {took} s, {len(maybe)} sets before")
            assert took is not None, f"no set stored while n{node} was cut ({shape})"
            assert took < FAILOVER_MAX_S, f"the door stayed {took:.1f} s on n{node} (cut {shape})"
            net.door_node(door, skip=node)
        finally:
            net.run("heal", str(node))
    got = drain(door.addr, queue, (b"before", *stored))
    missing = [v for v in [b"before", *stored] if v not in got]
    assert not missing, f"STORED items lost: {missing} (got {got})"
    assert set(got) <= {b"before", *stored, *maybe}


class Faults:
    """The faults of the ledger test, one after another, each healed before the next."""

    def __init__(self, net: NetCluster, stream: str):
        self.net, self.stream = net, stream

    def cut(self, node: int, shape: str, hold_s: float) -> None:
        self.net.run("cut", str(node), shape)
        try:
            time.sleep(hold_s)
        finally:
            self.net.run("heal", str(node))

    def stop(self, node: int, hold_s: float) -> None:
        pid = self.net.pid(node)
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(hold_s)
        finally:
            os.kill(pid, signal.SIGCONT)

    def kill(self, node: int, hold_s: float) -> None:
        self.net.run("kill", str(node))
        time.sleep(hold_s)
        self.net.run("restart", str(node))


@pytest.mark.timeout(420)
def test_a_ledger_over_partitions_stops_and_kills(make_server, net):
    """Writers and leasing readers through: the stream leader cut from its peers, a
    follower isolated, the door's server cut from the door, a node stopped (SIGSTOP)
    and a node killed. Every STORED item is delivered (none lost), nothing never sent
    comes out, and a confirmed item comes back only as the docs allow (a lease around
    a consumer leader's failure), which is counted."""
    config = f"[backend.jetstream]\nlease_timeout_ms = {LEASE_TIMEOUT_MS}\n"
    door = door_on(make_server, net, config)
    queue = "ledger"
    with Conn(door.addr) as c:
        assert c.set(queue, b"first") == b"STORED\r\n"
        assert c.get(queue) == b"first"
    writers = [PatientWriter(door.addr, queue, f"w{i}") for i in range(3)]
    readers = [Reader(door.addr, queue) for _ in range(2)]
    for t in (*writers, *readers):
        t.start()
    faults = Faults(net, door.stream)
    try:
        time.sleep(2.0)
        leader = net.stream_leader(door.stream)
        faults.cut(leader, "peers", 8.0)
        time.sleep(3.0)
        faults.cut(net.stream_leader(door.stream) % 3 + 1, "all", 8.0)
        time.sleep(3.0)
        faults.cut(net.door_node(door), "clients", 8.0)
        time.sleep(3.0)
        faults.stop(net.stream_leader(door.stream), 8.0)
        time.sleep(3.0)
        faults.kill(net.stream_leader(door.stream), 3.0)
        time.sleep(3.0)
    finally:
        for t in (*writers, *readers):
            t.stop_event.set()
        for t in (*writers, *readers):
            t.join(60)
    stopped = time.monotonic()
    unexpected = [line for w in writers for line in w.unexpected]
    assert not unexpected, f"replies to set other than STORED or backend unavailable: {unexpected[:3]}"
    bad_closes = [line for r in readers for line in r.bad_closes]
    assert not bad_closes, f"replies to /close other than END or backend unavailable: {bad_closes[:3]}"
    acked = {v for w in writers for v in w.acked}
    sent = {v for w in writers for v in w.sent}
    confirmed = [v for r in readers for v in r.confirmed]
    assert acked and confirmed, "the load did not run"
    # A pulled item whose reply was lost with a cut connection is held by nobody until
    # its lease times out: wait that out before the last drain, or until the reader's
    # consumer counts nothing pending and nothing ack pending (none such is left).
    rest = drain(door.addr, queue)
    wait_lease_timeout_or_settled(door.stream, f"{queue}~", stopped + LEASE_TIMEOUT_MS / 1000 + 5.0, net.urls)
    rest += drain(door.addr, queue)
    got = confirmed + rest
    unsettled = {v for r in readers for v in r.unsettled}
    missing = acked - set(got) - unsettled
    print(f"{len(acked)} STORED, {len(confirmed)} confirmed, {len(rest)} drained, "
          f"{len(unsettled)} unsettled, {len(got) - len(set(got))} delivered more than once")
    assert not missing, f"{len(missing)} STORED items lost, e.g. {sorted(missing)[:3]}"
    assert set(got) <= sent | {b"first"}, "an item nobody sent came out"
