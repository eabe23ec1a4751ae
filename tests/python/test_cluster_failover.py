"""A door leaves a NATS server that stops answering within seconds, not minutes.

A stopped (SIGSTOP) server keeps its sockets open, so the door's connection to it looks
alive until pings go unanswered. With the NATS client's default ping interval (60 s,
three unanswered pings before it gives up) a door stayed on such a server for about
three minutes, answering `SERVER_ERROR` to every request; weir sets the interval from
`ping_interval_ms` (2 s) and moves on after about three of them (docs/cluster.md,
"Failures").

Run by scripts/test's JetStream pass (WEIR_TEST_BACKEND=jetstream).
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from harness import Conn
from test_cluster import cluster_dir, drain_patiently

pytestmark = [
    pytest.mark.jetstream_only,
    pytest.mark.weir_only,
    # Stops nodes of the shared test cluster: in the serial pass of its faults.
    pytest.mark.cluster_faults,
]

# Well under the three minutes the client's default ping interval took, and above
# the worst case of the defaults: three 2 s pings, a connection attempt to the
# stopped server itself (5 s), and a leader election if it led the stream (up to 9 s).
FAILOVER_MAX_S = 30.0


def monitoring_port(node: int) -> int:
    base = int(Path(cluster_dir(), "base_port").read_text().strip())
    return base + 20 + node - 1


def node_pid(node: int) -> int:
    return int(Path(cluster_dir(), f"n{node}", "pid").read_text().strip())


def door_clients(node: int, pid: int) -> int:
    """How many clients of the door with this pid node `node` has (a door names its
    NATS connection `weir-<pid, hex>-<start>`)."""
    url = f"http://127.0.0.1:{monitoring_port(node)}/connz?limit=1024"
    with urllib.request.urlopen(url, timeout=5) as reply:
        connz = json.load(reply)
    mine = f"weir-{pid:x}-"
    return sum(1 for c in connz.get("connections") or [] if c.get("name", "").startswith(mine))


def connected_node(door, stopped: int | None = None) -> int:
    """The node the door is connected to; a stopped node is not asked."""
    found = [n for n in (1, 2, 3) if n != stopped and door_clients(n, door.proc.pid) > 0]
    assert len(found) == 1, f"the door's clients on nodes {found}"
    return found[0]


@pytest.mark.timeout(180)
def test_a_door_leaves_a_stopped_server_in_seconds(make_server):
    door = make_server()
    door.start()
    stored = []
    with Conn(door.addr, timeout_s=30.0) as c:
        assert c.set("fq", b"before") == b"STORED\r\n"
        stored.append(b"before")
        node = connected_node(door)
        pid = node_pid(node)
        os.kill(pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            back_after = None
            errors = []
            i = 0
            while time.monotonic() - t0 < 3 * FAILOVER_MAX_S:
                value = b"v%d" % i
                i += 1
                reply = c.set("fq", value)
                if reply == b"STORED\r\n":
                    stored.append(value)
                    back_after = time.monotonic() - t0
                    break
                errors.append(reply)
            print(f"first STORED {back_after} s after stopping n{node}; {len(errors)} errors before")
            assert back_after is not None, f"no set stored with n{node} stopped: {errors[-3:]}"
            assert back_after < FAILOVER_MAX_S, (
                f"the door stayed {back_after:.1f} s on a stopped server ({errors[-3:]})"
            )
            connected_node(door, stopped=node)
            for j in range(5):
                value = b"w%d" % j
                assert c.set("fq", value) == b"STORED\r\n"
                stored.append(value)
        finally:
            os.kill(pid, signal.SIGCONT)
    # Nothing STORED was lost. A set answered SERVER_ERROR may or may not have been
    # stored (its outcome is unknown): it may show up too. The resumed node can still
    # lead the reader for a moment, with a copy of the stream behind, and answer a
    # waiting get empty: so a second drain a little later.
    got = drain_patiently(door.addr, "fq")
    time.sleep(5.0)
    got += drain_patiently(door.addr, "fq")
    print(f"drained {len(got)} items")
    missing = [v for v in stored if v not in got]
    assert not missing, f"STORED items lost: {missing}"
    unexpected = [v for v in got if v not in stored and not v.startswith(b"v")]
    assert not unexpected, unexpected
