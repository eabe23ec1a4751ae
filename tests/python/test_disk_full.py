"""A full disk, end to end: the real server on a small tmpfs and a small ext4, filled
until it refuses, then asked to create a queue, killed with SIGKILL and started again.

It must start (starting never needs free space), no half-made queue may be left behind
(creating a queue is all or nothing), every acknowledged item must come back intact,
and draining them must make room for new appends.

Mounting needs root with the capability. Without it these tests skip, unless
WEIR_REQUIRE_MOUNTS=1 (scripts/test sets it where a probe mount works), where a skip would
hide a hole, so it fails.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from harness import Conn

pytestmark = [
    pytest.mark.embedded_only(reason="fills the data directory's file system; a cluster's storage is the servers'"),
    pytest.mark.weir_only,
]

FS_BYTES = 64 * 1024 * 1024
ITEM_BYTES = 64 * 1024
QUEUE = "full"


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


@contextlib.contextmanager
def mounted(kind: str, at: Path):
    """Mounts a FS_BYTES file system of `kind` (tmpfs or ext4) at `at`; unmounts after."""
    image = None
    try:
        if kind == "tmpfs":
            _run("mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", str(at))
        else:
            fd, image = tempfile.mkstemp(prefix="weir-ext4-", suffix=".img")
            os.close(fd)
            os.truncate(image, FS_BYTES)
            _run("mkfs.ext4", "-q", "-F", image)
            _run("mount", "-o", "loop", image, str(at))
    except (subprocess.CalledProcessError, FileNotFoundError, subprocess.TimeoutExpired) as e:
        if image:
            os.unlink(image)
        detail = getattr(e, "stderr", b"") or b""
        reason = f"cannot mount {kind}: {e} {detail.decode(errors='replace').strip()}"
        if os.environ.get("WEIR_REQUIRE_MOUNTS") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield at
    finally:
        subprocess.run(["umount", "-l", str(at)], capture_output=True, timeout=60)
        if image:
            os.unlink(image)


def payload(i: int) -> bytes:
    head = b"item %08d " % i
    return head + bytes((i * 7 + j) % 251 for j in range(256)) * (ITEM_BYTES // 256) + head


def fill(conn: Conn) -> int:
    """Sets items until the server refuses; returns how many were STORED."""
    stored = 0
    while stored < 10 * FS_BYTES // ITEM_BYTES:
        reply = conn.set(QUEUE, payload(stored))
        if reply == b"STORED\r\n":
            stored += 1
            continue
        assert reply == b"SERVER_ERROR disk full\r\n", reply
        return stored
    raise AssertionError(f"stored {stored} items of {ITEM_BYTES} B on a {FS_BYTES} B disk")


def queue_dirs(data_dir: Path) -> list[str]:
    return sorted(p.name for p in (data_dir / "queues").iterdir())


@pytest.mark.parametrize("kind", ["tmpfs", "ext4"])
def test_a_full_disk_then_a_new_queue_then_kill9_restarts_and_drains(make_server, kind):
    server = make_server()
    with mounted(kind, server.data_dir):
        server.start()
        try:
            with Conn(server.addr) as c:
                stored = fill(c)
                assert stored > 100, f"only {stored} items fit"
                # New queues on a full disk: refused cleanly, with one reply each.
                for key in (b"brandnew", b"brandnew/open", b"other.reader"):
                    reply = c.request(b"get %s\r\n" % key)
                    assert reply in (b"END\r\n", b"SERVER_ERROR disk full\r\n"), reply
                assert c.set("brandnew2", b"x") == b"SERVER_ERROR disk full\r\n"
                assert c.request(b"version\r\n").startswith(b"VERSION ")
            server.kill9()
            # Whatever exists is a whole queue: nothing half-made, no temporary dir.
            for name in queue_dirs(server.data_dir):
                qdir = server.data_dir / "queues" / name
                assert not name.startswith("."), f"left behind: {name}"
                files = [p.name for p in qdir.iterdir()]
                assert any(f.startswith("readers.") for f in files), (name, files)
                assert any(f.endswith(".seg") for f in files), (name, files)
            server.start()
            with Conn(server.addr) as c:
                for i in range(stored):
                    got = c.get(QUEUE)
                    assert got == payload(i), f"item {i} of {stored}: {None if got is None else got[:20]!r}"
                assert c.get(QUEUE) is None, "nothing beyond what was acknowledged"
                # Draining deleted segments: there is room again.
                for i in range(20):
                    assert c.set(QUEUE, payload(i)) == b"STORED\r\n", f"set {i} after draining"
                assert c.set("brandnew", b"fresh") == b"STORED\r\n"
                assert c.get("brandnew") == b"fresh"
        finally:
            if server.alive():
                server.kill9()
