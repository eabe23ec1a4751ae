"""Reliable reads end to end: leases survive neither a dead client nor a dead
server, confirmations survive both, and nothing replied STORED is ever lost
(docs/storage.md and docs/protocol.md: at-least-once under leases, periodic durability)."""

from __future__ import annotations

import signal
import time

import pytest

from harness import Conn, Writer, after_kill9_restart, check_acked_survived, drain, value_reply, wait_for

pytestmark = pytest.mark.weir_only


def take_open(conn: Conn, key: bytes, expected: bytes) -> None:
    conn.send(b"get %s\r\n" % key)
    conn.expect(value_reply(key, 0, expected))


@pytest.mark.parametrize("how", ["fin", "rst"])
def test_lease_comes_back_when_client_disconnects(server, how):
    with Conn(server.addr) as w:
        for v in (b"first", b"second"):
            assert w.set("lq", v) == b"STORED\r\n"
    holder = Conn(server.addr)
    other = Conn(server.addr)
    try:
        take_open(holder, b"lq/open", b"first")
        # While leased, "first" is invisible to everyone else.
        assert other.get("lq/peek") == b"second"
        assert other.get("lq") == b"second"
        assert other.get("lq") is None
        if how == "fin":
            holder.close()
        else:
            holder.reset()
        assert wait_for(lambda: other.get("lq/peek") == b"first", 3.0), "lease not released after disconnect"
        other.send(b"get lq/open\r\n")
        other.expect(value_reply(b"lq/open", 0, b"first"))
        other.send(b"get lq/close\r\n")
        other.expect(b"END\r\n")
    finally:
        holder.close()
        other.close()
    # Confirmed: it must not come back after that connection ends either.
    time.sleep(0.2)
    with Conn(server.addr) as c:
        assert c.get("lq") is None


def test_confirmed_item_not_redelivered_after_disconnect(server):
    with Conn(server.addr) as c:
        assert c.set("cq", b"once") == b"STORED\r\n"
        take_open(c, b"cq/open", b"once")
        c.send(b"get cq/close\r\n")
        c.expect(b"END\r\n")
    time.sleep(0.3)
    with Conn(server.addr) as c:
        assert c.get("cq") is None
        assert c.get("cq/peek") is None


def test_waiting_client_that_disconnects_takes_nothing(server):
    waiter = Conn(server.addr)
    waiter.send(b"get wq/t=5000\r\n")
    time.sleep(0.2)
    waiter.reset()
    time.sleep(0.2)
    with Conn(server.addr) as c:
        assert c.set("wq", b"for-someone-else") == b"STORED\r\n"
        time.sleep(0.1)
        assert c.get("wq") == b"for-someone-else"


def test_kill9_leases_come_back_confirmed_do_not(make_server):
    srv = make_server().start()
    items = [b"it%d" % i for i in range(10)]
    conns = []
    with Conn(srv.addr) as w:
        for v in items:
            assert w.set("kq", v) == b"STORED\r\n"
    a, b, c, d = (Conn(srv.addr) for _ in range(4))
    conns += [a, b, c, d]
    take_open(a, b"kq/open", b"it0")  # leased at the kill
    take_open(b, b"kq/open", b"it1")  # leased at the kill
    take_open(c, b"kq/open", b"it2")
    take_open(c, b"kq/close/open", b"it3")  # it2 confirmed, it3 leased at the kill
    d.send(b"get kq\r\n")  # plain get: taken and confirmed at once
    d.expect(value_reply(b"kq", 0, b"it4"))
    take_open(d, b"kq/open", b"it5")
    d.send(b"get kq/close\r\n")  # it5 confirmed
    d.expect(b"END\r\n")

    assert srv.kill9() == -signal.SIGKILL
    for conn in conns:
        conn.close()
    srv.start()  # same data dir, same port
    after_kill9_restart()

    got = drain(srv.addr, "kq", limit=50)
    # Released leases come back ahead of newer items; confirmed ones never.
    assert got == [b"it0", b"it1", b"it3", b"it6", b"it7", b"it8", b"it9"]
    with Conn(srv.addr) as c2:
        assert c2.set("kq", b"after") == b"STORED\r\n"
        assert c2.get("kq") == b"after"


def test_kill9_reader_positions_survive(make_server):
    srv = make_server().start()
    with Conn(srv.addr) as c:
        assert c.get("fr.a") is None
        assert c.get("fr.b") is None
        for i in range(6):
            assert c.set("fr", b"f%d" % i) == b"STORED\r\n"
        assert [c.get("fr.a") for _ in range(3)] == [b"f0", b"f1", b"f2"]
        take_open(c, b"fr.b/open", b"f0")
        assert srv.kill9() == -signal.SIGKILL
    srv.start()
    after_kill9_restart()
    assert drain(srv.addr, "fr.a", limit=20) == [b"f3", b"f4", b"f5"]
    assert drain(srv.addr, "fr.b", limit=20) == [b"f%d" % i for i in range(6)]


def test_kill9_under_write_load_loses_nothing_stored(make_server):
    srv = make_server().start()
    writers = [Writer(srv.addr, "kw", f"w{i}", max_s=10.0) for i in range(4)]
    for w in writers:
        w.start()
    # Let the writers get going, then kill the server in the middle of it.
    assert wait_for(lambda: all(len(w.acked) >= 200 for w in writers), 8.0), [len(w.acked) for w in writers]
    assert srv.kill9() == -signal.SIGKILL
    for w in writers:
        w.join(10)
        assert not w.is_alive()
        assert not w.other_replies, w.other_replies
    srv.start()
    total_sent = sum(len(w.sent) for w in writers)
    got = drain(srv.addr, "kw", limit=total_sent + 10)
    check_acked_survived(writers, got)


def test_kill9_keeps_flags_empty_and_binary_items(make_server):
    srv = make_server().start()
    items = [(0, b""), (1, b"\x00\r\n\xff"), (4294967295, bytes(range(256))), (77, b"x" * 70_000)]
    with Conn(srv.addr) as c:
        for flags, data in items:
            assert c.set("fq", data, flags=flags) == b"STORED\r\n"
        assert c.set("fq/sync", b"synced", flags=9) == b"STORED\r\n"
    assert srv.kill9() == -signal.SIGKILL
    srv.start()
    with Conn(srv.addr) as c:
        got = [c.get_items("fq") for _ in range(len(items) + 2)]
    assert got == [[(b"fq", f, d)] for f, d in items] + [[(b"fq", 9, b"synced")], []]
