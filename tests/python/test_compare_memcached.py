"""Byte-for-byte comparison with memcached for the part of the protocol both
share. weir is a queue, so a `get` takes the item; each exchange below is
chosen so that a cache and a queue must answer it identically."""

from __future__ import annotations

import pytest

from harness import Conn

pytestmark = pytest.mark.weir_only

# (request bytes, exact reply bytes), run in order on one fresh connection.
SHARED_EXCHANGES = [
    (b"set k 0 0 5\r\nhello\r\n", b"STORED\r\n"),
    (b"get k\r\n", b"VALUE k 0 5\r\nhello\r\nEND\r\n"),
    (b"get nothere\r\n", b"END\r\n"),
    (b"set z 4294967295 0 0\r\n\r\n", b"STORED\r\n"),  # 0 bytes, largest u32 flags
    (b"get z\r\n", b"VALUE z 4294967295 0\r\n\r\nEND\r\n"),
    (b"set n 0 0 3 noreply\r\nabc\r\n", b""),  # noreply: no reply at all
    (b"get n\r\n", b"VALUE n 0 3\r\nabc\r\nEND\r\n"),
    # Pipelined in one write: replies in order.
    (b"set a 1 0 1\r\n1\r\nset b 2 0 1\r\n2\r\nget a b\r\n",
     b"STORED\r\nSTORED\r\nVALUE a 1 1\r\n1\r\nVALUE b 2 1\r\n2\r\nEND\r\n"),
    (b"set bin 0 0 4\r\n\r\n\x00\xff\r\n", b"STORED\r\n"),
    (b"get bin\r\n", b"VALUE bin 0 4\r\n\r\n\x00\xff\r\nEND\r\n"),
    (b"set d 0 0 1\r\nx\r\ndelete d\r\n", b"STORED\r\nDELETED\r\n"),
    # (A delete of what does not exist differs: weir answers DELETED, as Kestrel.)
    (b"bogus_command\r\n", b"ERROR\r\n"),
    (b"bogus with args\r\n", b"ERROR\r\n"),
    (b"version extra\r\n", None),  # VERSION, whatever follows (checked below)
    (b"flush_all\r\n", b"OK\r\n"),
    (b"flush_all 0\r\n", b"OK\r\n"),
    (b"delete q 0 0\r\n", None),  # a CLIENT_ERROR in both (memcached adds usage)
    (b"stats bogus\r\n", b"ERROR\r\n"),
    (b"stats reset\r\n", b"RESET\r\n"),
    (b"set s 0 0 2 noreply\r\nhi\r\nget s\r\n", b"VALUE s 0 2\r\nhi\r\nEND\r\n"),
    # The connection stays open after ERROR.
    (b"set after 0 0 2\r\nok\r\n", b"STORED\r\n"),
    (b"get after\r\n", b"VALUE after 0 2\r\nok\r\nEND\r\n"),
]


def run_exchanges(addr) -> list[bytes]:
    replies = []
    with Conn(addr) as c:
        for request, expected in SHARED_EXCHANGES:
            c.send(request)
            # Read exactly as many bytes as the expected reply, then make sure
            # nothing more follows (a version round trip marks the end).
            if expected is None:
                got = c.read_line(3.0)
            else:
                got = c.read_exact(len(expected), 3.0) if expected else b""
            c.send(b"version\r\n")
            tail = c.read_line(3.0)
            assert tail.startswith(b"VERSION "), (request, got, tail)
            replies.append(got)
    return replies


def test_shared_replies_identical_to_memcached(server, memcached):
    weir = run_exchanges(server.addr)
    reference = run_exchanges(memcached.addr)
    for (request, expected), w, m in zip(SHARED_EXCHANGES, weir, reference):
        if expected is None:
            # The same kind of line: the first word matches.
            assert w.split(b" ")[0] == m.split(b" ")[0], f"{request!r}: weir {w!r} != memcached {m!r}"
            continue
        assert m == expected, f"reference memcached answered {request!r} with {m!r} (test is wrong)"
        assert w == m, f"{request!r}: weir {w!r} != memcached {m!r}"


def test_version_line_shape(server, memcached):
    with Conn(server.addr) as w, Conn(memcached.addr) as m:
        wl, ml = w.request(b"version\r\n"), m.request(b"version\r\n")
    assert ml.startswith(b"VERSION ") and ml.endswith(b"\r\n")
    assert wl.startswith(b"VERSION weir-") and wl.endswith(b"\r\n")
    assert b" " not in wl[len(b"VERSION "):-2]
