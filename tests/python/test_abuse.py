"""Abuse (issue 3, tests): thousands of idle connections, a client trickling one
byte a second, random bytes from many connections, over-long lines and
oversize items. Each time the server stays up and keeps serving a normal
client throughout. Every loop is bounded in count and time."""

from __future__ import annotations

import random
import re
import selectors
import socket
import struct
import threading
import time

import pytest

import harness
from harness import Conn

IDLE_CONNECTIONS = 5000


class Probe:
    """A well-behaved client: a set/get round trip must answer promptly."""

    def __init__(self, addr):
        self.conn = Conn(addr, timeout_s=3.0)
        self.n = 0
        self.worst_s = 0.0

    def check(self) -> None:
        self.n += 1
        value = b"probe-%d" % self.n
        start = time.monotonic()
        assert self.conn.set("probeq", value) == b"STORED\r\n"
        assert self.conn.get("probeq") == value
        took = time.monotonic() - start
        self.worst_s = max(self.worst_s, took)
        assert took < 2.0, f"normal client round trip took {took:.2f}s"

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def probe(server):
    p = Probe(server.addr)
    p.check()
    yield p
    p.close()


def test_5000_idle_connections(server, probe):
    limit = harness.raise_nofile_limit(65536)
    assert limit >= IDLE_CONNECTIONS + 200, f"RLIMIT_NOFILE {limit} too low for this test"
    socks: list[socket.socket] = []
    deadline = time.monotonic() + 20.0
    try:
        for i in range(IDLE_CONNECTIONS):
            assert time.monotonic() < deadline, f"only {i} connections opened in 20s"
            s = socket.create_connection(server.addr, timeout=5.0)
            socks.append(s)
            # A round trip every 100 connections keeps the normal client in the
            # picture and paces the connects to the server's accept loop.
            if i % 100 == 99:
                probe.check()
        probe.check()
        # Every one of them is a live, served connection, not just a queued SYN.
        sel = selectors.DefaultSelector()
        for s in socks:
            s.sendall(b"version\r\n")
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, bytearray())
        pending = len(socks)
        replied_ok = 0
        while pending and time.monotonic() < deadline + 10:
            for key, _ in sel.select(timeout=1.0):
                buf = key.data
                chunk = key.fileobj.recv(4096)
                if not chunk:
                    sel.unregister(key.fileobj)
                    pending -= 1
                    continue
                buf += chunk
                if buf.endswith(b"\r\n"):
                    replied_ok += buf.startswith(b"VERSION ")
                    sel.unregister(key.fileobj)
                    pending -= 1
        sel.close()
        assert replied_ok == IDLE_CONNECTIONS, f"{replied_ok} of {IDLE_CONNECTIONS} idle connections answered"
        probe.check()
        assert server.alive()
    finally:
        for s in socks:
            s.close()
    probe.check()


def test_client_sending_one_byte_a_second(server, probe):
    results: dict[str, bytes] = {}
    assert probe.conn.set("slowq", b"ok") == b"STORED\r\n"

    def trickle(name: str, payload: bytes) -> None:
        try:
            with Conn(server.addr, timeout_s=5.0) as c:
                for byte in payload:
                    c.send(bytes([byte]))
                    time.sleep(1.0)
                results[name] = c.read_exact(len(expected[name]), 5.0)
        except Exception as e:  # recorded and asserted below
            results[name] = repr(e).encode()

    expected = {
        "version": b"VERSION " if server.kind == "memcached" else b"VERSION weir-",
        "get": b"VALUE slowq 0 2\r\nok\r\nEND\r\n",
    }
    threads = [
        threading.Thread(target=trickle, args=("version", b"version\r\n")),
        threading.Thread(target=trickle, args=("get", b"get slowq\r\n")),
    ]
    for t in threads:
        t.start()
    # The trickles take ~10 s; the normal client keeps working all along.
    end = time.monotonic() + 12.0
    while any(t.is_alive() for t in threads) and time.monotonic() < end:
        probe.check()  # on probeq: only the slow client may take slowq's item
        time.sleep(0.25)
    for t in threads:
        t.join(10)
    assert results == expected
    assert probe.n >= 20, probe.n
    probe.check()


FUZZ_WORDS = [
    b"get ", b"gets ", b"set ", b"delete ", b"flush ", b"stats", b"stats ", b"dump_stats",
    b"monitor ", b"confirm ", b"version", b"flush_expired ", b"quit", b"GET ", b"SeT ",
    b"fz", b"fz1", b"fz.r", b"fz+r", b"fz+fz2", b"/open", b"/close", b"/abort", b"/peek",
    b"/t=", b"/t=100", b"/sync", b" ", b"  ", b"\r\n", b"\n", b"\r", b"\x00", b"\xff",
    b"0", b"1", b"5", b"-1", b"4294967295", b"4294967296", b"18446744073709551616",
    b"99999999999999999999999", b"noreply", b"hello", b"\r\n\r\n",
]


def valid_command(rng: random.Random) -> bytes:
    """A well-formed request on the fuzz queues, so the fuzz also drives real work."""
    key = rng.choice([b"fz", b"fz1", b"fz2"])
    kind = rng.randrange(6)
    if kind <= 1:
        data = rng.randbytes(rng.randint(0, 300))
        return b"set %s %d 0 %d\r\n%s\r\n" % (key, rng.randrange(2**32), len(data), data)
    if kind == 2:
        opts = rng.sample([b"/open", b"/close", b"/peek", b"/abort", b"/t=20"], rng.randint(0, 2))
        return b"get " + key + b"".join(opts) + b"\r\n"
    if kind == 3:
        return b"get " + key + b"." + rng.choice([b"r1", b"r2"]) + b"\r\n"
    if kind == 4:
        return rng.choice([b"stats\r\n", b"version\r\n", b"dump_stats\r\n", b"flush_expired fz\r\n"])
    return b"delete " + key + b"\r\n"


def mutate(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return data
    i = rng.randrange(len(data))
    choice = rng.randrange(3)
    if choice == 0:
        return data[:i]  # truncated
    if choice == 1:
        return data[:i] + bytes([rng.randrange(256)]) + data[i + 1 :]  # one byte changed
    return data[:i] + rng.randbytes(rng.randint(1, 8)) + data[i:]  # bytes inserted


def fuzz_payload(rng: random.Random) -> bytes:
    parts = []
    for _ in range(rng.randint(1, 60)):
        r = rng.random()
        if r < 0.3:
            parts.append(rng.choice(FUZZ_WORDS))
        elif r < 0.55:
            parts.append(valid_command(rng))
        elif r < 0.7:
            parts.append(mutate(rng, valid_command(rng)))
        elif r < 0.92:
            parts.append(rng.randbytes(rng.randint(1, 40)))
        else:
            parts.append(rng.randbytes(rng.randint(100, 4000)))
    return b"".join(parts)


def test_random_bytes_from_many_connections(server, probe):
    rng = random.Random(0x5EED_0001)
    rounds, conns_per_round = 60, 20
    deadline = time.monotonic() + 15.0
    replies = bytearray()
    done_rounds = 0
    for rnd in range(rounds):
        if time.monotonic() > deadline:
            break
        conns = []
        for _ in range(conns_per_round):
            s = socket.create_connection(server.addr, timeout=2.0)
            conns.append(s)
            payload = fuzz_payload(rng)
            pos = 0
            try:
                while pos < len(payload):
                    step = rng.randint(1, 512)
                    s.sendall(payload[pos : pos + step])
                    pos += step
                s.shutdown(socket.SHUT_WR)
            except OSError:  # the server may hang up on a stream it cannot trust
                pass
        # Collect what the server answers (bounded), then hang up, half with RST.
        sel = selectors.DefaultSelector()
        for s in conns:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
        read_until = time.monotonic() + 0.5
        open_count = len(conns)
        while open_count and time.monotonic() < read_until:
            for key, _ in sel.select(timeout=0.1):
                try:
                    chunk = key.fileobj.recv(65536)
                except OSError:
                    chunk = b""
                if chunk:
                    replies.extend(chunk[:4096])
                else:
                    sel.unregister(key.fileobj)
                    open_count -= 1
        sel.close()
        for s in conns:
            if rng.random() < 0.5:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        assert server.alive(), f"server died in fuzz round {rnd}\n{server.log_tail()}"
        probe.check()
        done_rounds += 1
    assert done_rounds >= 5, "fuzzing did too few rounds to mean anything"
    # The fuzz reached the parser's paths: unknown commands, refused lines, stores.
    for reply in (b"ERROR\r\n", b"CLIENT_ERROR ", b"STORED\r\n", b"END\r\n"):
        assert reply in replies, f"no {reply!r} among {len(replies)} reply bytes"
    assert server.alive()
    probe.check()
    # On JetStream the fuzz's stores made a few hundred queues, each a replicated
    # consumer, and `stats` pages through all of them on a loaded cluster: seconds.
    with Conn(server.addr, timeout_s=30.0 if harness.on_jetstream() else 5.0) as c:
        c.send(b"stats\r\n")
        first = c.read_line()
        assert first.startswith(b"STAT "), first


CLIENT_ERROR_LINE = re.compile(rb"CLIENT_ERROR [^\r\n]+\r\n")


def read_error_then_maybe_close(conn: Conn) -> bytes:
    line = conn.read_line(3.0)
    assert CLIENT_ERROR_LINE.fullmatch(line), line
    return line


@pytest.mark.weir_only
def test_over_long_line_is_an_error(server, probe):
    # The default limit is 64 KiB (line_bytes_max).
    with Conn(server.addr) as c:
        c.send(b"get " + b"a" * 70_000 + b"\r\n")
        read_error_then_maybe_close(c)
    probe.check()
    # A line that never ends: the server must not buffer it forever nor wait for more.
    with Conn(server.addr) as c:
        c.send(b"set " + b"x" * 70_000)
        read_error_then_maybe_close(c)
    probe.check()
    # A line just under the limit is fine (an unknown command: ERROR, connection open).
    with Conn(server.addr) as c:
        c.send(b"x" * 65_000 + b"\r\n")
        c.expect(b"ERROR\r\n")
        assert c.request(b"version\r\n").startswith(b"VERSION weir-")
    assert server.alive()


@pytest.mark.weir_only
@pytest.mark.parametrize("length", [b"536870912", b"4294967296", b"18446744073709551616", b"-1", b"x"])
def test_oversize_or_bad_item_length_is_an_error(server, probe, length):
    with Conn(server.addr) as c:
        # Only the header is sent: the server must refuse it without waiting
        # for (or allocating) the data.
        c.send(b"set big 0 0 " + length + b"\r\n")
        read_error_then_maybe_close(c)
    probe.check()
    with Conn(server.addr) as c:
        assert c.get("big") is None
    assert server.alive()


@pytest.mark.weir_only
def test_data_block_without_crlf_closes_connection(server, probe):
    with Conn(server.addr) as c:
        c.send(b"set dq 0 0 1\r\nxyz\r\n")
        read_error_then_maybe_close(c)
        # The byte stream cannot be trusted any more: the server hangs up.
        with pytest.raises(ConnectionError):
            c.read_line(3.0)
    with Conn(server.addr) as c:
        assert c.get("dq") is None
    probe.check()


def test_large_item_within_limits_still_works(server, probe):
    value = bytes(random.Random(7).randbytes(512 * 1024))
    with Conn(server.addr, timeout_s=10.0) as c:
        assert c.set("bigok", value) == b"STORED\r\n"
        assert c.get("bigok") == value
    probe.check()
