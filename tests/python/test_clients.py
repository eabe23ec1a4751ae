"""Real memcache clients from PyPI (pymemcache, python-memcached) against weir.

These are the clients existing Kestrel users run; weir must work with them
unchanged, queue options in the key included (`q/open`, `q.reader`, ...).
"""

from __future__ import annotations

import threading
import time

import memcache  # python-memcached
import pytest
from pymemcache.client.base import Client as PymClient
from pymemcache.exceptions import MemcacheClientError

import harness
from harness import Conn, wait_for

BINARY = bytes(range(256)) + b"\r\nEND\r\nVALUE x 0 1\r\n\x00\r\n"


class FlagSerde:
    """Leaves bytes alone and hands back the flags the server returned."""

    def serialize(self, key, value):
        return value, 0

    def deserialize(self, key, value, flags):
        return value, flags


def pym(server, timeout_s: float = 5.0, serde=None) -> PymClient:
    return PymClient(
        server.addr, connect_timeout=5, timeout=timeout_s, default_noreply=False, serde=serde
    )


class PyMc:
    """python-memcached, with its silent 'mark server dead' turned into a test failure."""

    def __init__(self, server, timeout_s: float = 5.0):
        self.server = server
        self.mc = memcache.Client([f"{server.addr[0]}:{server.addr[1]}"], socket_timeout=timeout_s, dead_retry=0)

    def get_miss(self, key: str) -> bool:
        """Whether `get key` is a plain miss. python-memcached returns None for a miss
        and for an error reply (CLIENT_ERROR ...) alike; the server's get_misses
        counter, which only a miss moves, tells them apart."""
        before = get_misses(self.server)
        value = self.get(key)
        return value is None and get_misses(self.server) == before + 1

    def __getattr__(self, name):
        fn = getattr(self.mc, name)

        def call(*args, **kwargs):
            result = fn(*args, **kwargs)
            dead = [s for s in self.mc.servers if s.deaduntil]
            assert not dead, f"python-memcached marked the server dead during {name}{args}"
            return result

        return call

    def close(self):
        self.mc.disconnect_all()


def get_misses(server) -> int:
    """The server's get_misses counter, over a raw connection."""
    with Conn(server.addr) as c:
        c.send(b"stats\r\n")
        while True:
            line = c.read_line()
            if line == b"END\r\n":
                raise AssertionError("no get_misses in stats")
            if line.startswith(b"STAT get_misses "):
                return int(line.split()[2])


def is_miss(client, key: str) -> bool:
    """A plain miss, told from an error reply whichever client asks."""
    if isinstance(client, PyMc):
        return client.get_miss(key)
    return client.get(key) is None  # pymemcache raises on an error reply


@pytest.fixture
def pm(server):
    c = pym(server)
    yield c
    c.close()


@pytest.fixture
def pmf(server):
    c = pym(server, serde=FlagSerde())
    yield c
    c.close()


@pytest.fixture
def mc(server):
    c = PyMc(server)
    yield c
    c.close()


# -- plain memcache commands (also pass against memcached) -----------------


def test_pymemcache_round_trip_values(pm):
    values = {
        "rt_text": b"hello",
        "rt_empty": b"",
        "rt_binary": BINARY,
        "rt_large": bytes(i % 251 for i in range(100_000)),
    }
    for key, value in values.items():
        assert pm.set(key, value) is True, key
    for key, value in values.items():
        got = pm.get(key)
        assert got == value, f"{key}: {got[:40]!r}"
        assert type(got) is bytes


def test_pymemcache_flags_preserved(pmf):
    for i, flags in enumerate([0, 1, 7, 65535, 65536, 2**31, 2**32 - 1]):
        key = f"fl{i}"
        assert pmf.set(key, b"v%d" % i, flags=flags) is True
        assert pmf.get(key) == (b"v%d" % i, flags)


def test_python_memcached_round_trip_and_flags(mc):
    # python-memcached encodes the value's type in the flags; a wrong flag on
    # the way back turns into a wrong type, so this proves flags round-trip.
    values = {
        "pt_bytes": b"raw\x00bytes",
        "pt_empty": b"",
        "pt_text": "h\u00e9llo w\u00f6rld",  # _FLAG_TEXT
        "pt_int": 42,  # _FLAG_INTEGER
        "pt_obj": {"a": [1, 2, 3], "b": None},  # _FLAG_PICKLE
        "pt_binary": BINARY,
    }
    for key, value in values.items():
        assert mc.set(key, value) is True, key
    for key, value in values.items():
        got = mc.get(key)
        assert got == value, key
        assert type(got) is type(value), key


def test_version(pm, server):
    v = pm.version()
    if server.kind == "weir":
        assert v.startswith(b"weir-"), v
        major, minor, patch = v[len(b"weir-"):].split(b".")
        assert all(p.isdigit() for p in (major, minor, patch)), v
    else:
        assert v[:1].isdigit(), v


def test_pymemcache_miss_is_none(pm):
    assert pm.get("never_set") is None
    assert pm.get_many(["never_a", "never_b"]) == {}


# -- queue semantics (weir only) --------------------------------------------


@pytest.mark.weir_only
def test_fifo_and_take_once(pm, mc):
    for i in range(5):
        assert pm.set("fifo", b"item%d" % i) is True
    assert [pm.get("fifo") for _ in range(3)] == [b"item0", b"item1", b"item2"]
    # The other client shares the default reader: it continues, never repeats.
    assert mc.get("fifo") == b"item3"
    assert pm.get("fifo") == b"item4"
    assert pm.get("fifo") is None
    assert mc.get_miss("fifo")


@pytest.mark.weir_only
def test_pymemcache_multi_key_get(pm):
    assert pm.set("mk1", b"one") is True
    assert pm.set("mk3", b"three") is True
    assert pm.get_many(["mk1", "mk2", "mk3"]) == {"mk1": b"one", "mk3": b"three"}
    assert pm.get_many(["mk1", "mk2", "mk3"]) == {}


@pytest.mark.weir_only
def test_pipelined_batches(pm, mc):
    # pymemcache's set_many and python-memcached's set_multi pipeline many sets
    # in one write; the get side asks for several queues in one `get`.
    values = {f"pb{i}": b"v%d" % i for i in range(20)}
    assert pm.set_many(values) == []  # no failed keys
    assert pm.get_many(list(values)) == values
    assert pm.get_many(list(values)) == {}
    text = {f"pt{i}": f"t{i}" for i in range(20)}
    assert mc.set_multi(text) == []
    assert mc.get_multi(list(text)) == text
    assert mc.get_multi(list(text)) == {}


@pytest.mark.weir_only
def test_pymemcache_open_close(server, pm):
    for v in (b"a", b"b", b"c", b"d"):
        assert pm.set("rq", v) is True
    other = pym(server)
    try:
        assert pm.get("rq/open") == b"a"
        # "a" is leased, so another connection gets the next item.
        assert other.get("rq") == b"b"
        assert pm.get("rq/close") is None  # confirms "a"; close alone returns nothing
        assert pm.get("rq/close") is None  # nothing open: still a plain END
        assert pm.get("rq/open") == b"c"
        # One lease per connection and queue (max_open_reads = 1): a second open
        # is refused. pymemcache drops its connection on any error, which
        # releases "c" back to the queue, ahead of "d".
        with pytest.raises(MemcacheClientError, match="close current item first"):
            pm.get("rq/open")
        assert wait_for(lambda: other.get("rq/peek") == b"c", 3.0), "lease not released on disconnect"
        assert other.get("rq") == b"c"
        assert pm.get("rq/open") == b"d"  # pymemcache reconnected: a new connection
        assert pm.get("rq/close/open") is None  # confirm "d", take next: queue is empty
        pm.close()  # disconnect with nothing leased: nothing comes back
        time.sleep(0.2)
        assert other.get("rq") is None
    finally:
        other.close()


@pytest.mark.weir_only
def test_pymemcache_close_open_chains(pm):
    for v in (b"1", b"2", b"3"):
        assert pm.set("chain", v) is True
    assert pm.get("chain/open") == b"1"
    assert pm.get("chain/close/open") == b"2"
    assert pm.get("chain/open/close") == b"3"  # options in any order
    assert pm.get("chain/close") is None
    assert pm.get("chain") is None


@pytest.mark.weir_only
def test_pymemcache_abort_returns_item_first(pm):
    assert pm.set("ab", b"first") is True
    assert pm.get("ab/open") == b"first"
    assert pm.set("ab", b"second") is True
    assert pm.get("ab/abort") is None
    # Released, it comes back ahead of the newer item.
    assert pm.get("ab/open") == b"first"
    assert pm.get("ab/close") is None
    assert pm.get("ab") == b"second"
    assert pm.get("ab") is None


@pytest.mark.weir_only
def test_pymemcache_peek(pm):
    assert pm.get("pk/peek") is None
    assert pm.set("pk", b"x") is True
    assert pm.set("pk", b"y") is True
    assert pm.get("pk/peek") == b"x"
    assert pm.get("pk/peek") == b"x"
    assert pm.get("pk") == b"x"
    assert pm.get("pk/peek") == b"y"
    assert pm.get("pk") == b"y"
    assert pm.get("pk/peek") is None


@pytest.mark.weir_only
@pytest.mark.parametrize("client", ["pymemcache", "python-memcached"])
def test_fanout_readers(server, client):
    c = pym(server) if client == "pymemcache" else PyMc(server)
    try:
        # Readers come into being when first read; create both before the items.
        assert is_miss(c, "fan.r1")
        assert is_miss(c, "fan+r2")
        items = [b"i%d" % i for i in range(4)]
        for v in items:
            assert c.set("fan", v) is True
        # Each reader sees every item; QUEUE.READER and QUEUE+READER name the
        # same reader, so alternating spellings continue one position.
        assert [c.get("fan.r1"), c.get("fan+r1"), c.get("fan.r1"), c.get("fan+r1")] == items
        assert [c.get("fan+r2"), c.get("fan.r2"), c.get("fan+r2"), c.get("fan.r2")] == items
        assert is_miss(c, "fan.r1")
        assert is_miss(c, "fan+r2")
        # Leases are per reader: r1 holding one does not hide it from r2.
        assert c.set("fan", b"late") is True
        assert c.get("fan.r1/open") == b"late"
        assert c.get("fan.r2/open") == b"late"
        # close and abort alone read nothing (no miss is counted); their effect is
        # what the next two reads check.
        assert c.get("fan.r1/close") is None
        assert c.get("fan.r2/abort") is None
        assert c.get("fan.r2") == b"late"
        assert is_miss(c, "fan.r1")
    finally:
        c.close()


@pytest.mark.weir_only
def test_multi_queue_set(pm, mc):
    assert pm.set("mqa+mqb+mqc", b"everywhere") is True
    assert mc.set("mqa+mqc", b"two") is True
    assert pm.get("mqa") == b"everywhere"
    assert pm.get("mqb") == b"everywhere"
    assert pm.get("mqc") == b"everywhere"
    assert mc.get("mqa") == b"two"
    assert mc.get_miss("mqb")
    assert mc.get("mqc") == b"two"


@pytest.mark.weir_only
def test_sync_set(pm, mc):
    assert pm.set("syncq/sync", b"durable") is True
    assert mc.set("syncq/sync", b"durable2") is True
    assert pm.get("syncq") == b"durable"
    assert mc.get("syncq") == b"durable2"


@pytest.mark.weir_only
def test_blocking_read_returns_when_item_arrives(server, pm):
    writer = pym(server)

    def later():
        time.sleep(0.3)
        writer.set("blk", b"arrived")

    t = threading.Thread(target=later)
    start = time.monotonic()
    t.start()
    try:
        assert pm.get("blk/t=3000") == b"arrived"
        elapsed = time.monotonic() - start
    finally:
        t.join(5)
        writer.close()
    assert 0.25 <= elapsed < 2.0, elapsed


@pytest.mark.weir_only
def test_blocking_read_times_out(mc, pm):
    start = time.monotonic()
    assert pm.get("blkempty/t=400") is None
    elapsed = time.monotonic() - start
    assert 0.35 <= elapsed < 1.5, elapsed
    start = time.monotonic()
    assert mc.get_miss("blkempty/t=300/open")
    elapsed = time.monotonic() - start
    assert 0.25 <= elapsed < 1.5, elapsed


@pytest.mark.weir_only
def test_delete_queue(pm, mc):
    assert pm.set("del", b"x") is True
    assert pm.set("del", b"y") is True
    assert pm.delete("del") is True  # DELETED
    # DELETED also when it is gone already, as Kestrel answers.
    assert pm.delete("del") is True
    assert pm.delete("never_existed") is True
    # Its items went with it (a get may bring the queue back, empty).
    assert pm.get("del") is None
    # python-memcached: 1 on DELETED, 0 otherwise.
    assert mc.set("del2", b"z") is True
    assert mc.delete("del2") == 1
    assert mc.delete("del2") == 1
    assert mc.get("del2") is None


@pytest.mark.weir_only
def test_delete_reader_keeps_other_readers(pm):
    assert pm.get("dr.a") is None
    assert pm.get("dr.b") is None
    assert pm.set("dr", b"1") is True
    assert pm.delete("dr.a") is True
    assert pm.get("dr.b") == b"1"
    assert pm.delete("dr.a") is True


@pytest.mark.weir_only
def test_stats_pymemcache(server, pm):
    payloads = [b"aaaa", b"bbbbbb", b""]
    for p in payloads:
        assert pm.set("st", p) is True
    stats = pm.stats()
    assert stats[b"queue_st_items"] == 3
    assert stats[b"queue_st_total_items"] == 3
    # JetStream counts bytes per stream, not per queue: 0 there (docs/cluster.md).
    expected_bytes = 0 if harness.on_jetstream() else sum(len(p) for p in payloads)
    assert stats[b"queue_st_bytes"] == expected_bytes
    assert stats[b"queue_st_open_transactions"] == 0
    for suffix in (b"expired_items", b"discarded", b"waiters", b"age", b"logsize"):
        assert isinstance(stats[b"queue_st_" + suffix], int), suffix
    assert stats[b"version"].startswith(b"weir-")
    assert pm.get("st/open") == b"aaaa"
    stats = pm.stats()
    assert stats[b"queue_st_open_transactions"] == 1
    assert stats[b"queue_st_total_items"] == 3
    assert pm.get("st/close") is None
    assert pm.get("st") == b"bbbbbb"
    stats = pm.stats()
    if harness.on_jetstream():
        # The stream drops a confirmed message one Raft round after the consumer
        # recorded the confirmation (docs/cluster.md, `stats`).
        assert wait_for(lambda: pm.stats()[b"queue_st_items"] == 1, 5.0), pm.stats()
        stats = pm.stats()
    assert stats[b"queue_st_items"] == 1
    assert stats[b"queue_st_open_transactions"] == 0
    assert stats[b"queue_st_total_items"] == 3


@pytest.mark.weir_only
def test_stats_python_memcached(mc):
    assert mc.set("pst", b"12345") is True
    ((_name, stats),) = mc.get_stats()
    if harness.on_jetstream():
        # The consumers' figures can trail a set by a Raft round when the replica
        # that answers is behind (seen with the machine loaded; docs/cluster.md,
        # `stats`).
        def counted() -> bool:
            nonlocal stats
            ((_name, stats),) = mc.get_stats()
            return stats["queue_pst_items"] == "1"

        assert wait_for(counted, 5.0), stats
    assert stats["queue_pst_items"] == "1"
    assert stats["queue_pst_bytes"] == ("0" if harness.on_jetstream() else "5")
    assert stats["version"].startswith("weir-")


# -- what real clients need (found by driving seven client libraries) -------------


@pytest.mark.weir_only
def test_flush_all_works_for_generic_clients(server, pm, mc):
    assert pm.set("fa", b"x") is True
    # pymemcache raises on anything but OK (Kestrel's "Flushed all queues." broke it).
    assert pm.flush_all() is True
    assert pm.get("fa") is None
    assert mc.set("fa2", b"y") is True
    mc.flush_all()  # reads and checks OK; a stuck or dead connection fails the wrapper
    assert mc.get("fa2") is None
    assert mc.set("fa3", b"z") is True and mc.get("fa3") == b"z"


@pytest.mark.weir_only
def test_multi_gets_of_hundreds_of_keys(pm, mc):
    # gomemcache's GetMulti of 200 keys once met the 2048-byte line limit.
    keys = [f"multi_key_number_{i:04d}" for i in range(300)]
    for k in keys[::3]:
        assert pm.set(k, k.encode()) is True
    assert pm.get_many(keys) == {k: k.encode() for k in keys[::3]}
    for k in keys[1::3]:
        assert mc.set(k, k.encode())
    assert mc.get_multi(keys) == {k: k.encode() for k in keys[1::3]}


@pytest.mark.weir_only
def test_value_lines_echo_the_key_as_sent_for_clients_that_match_by_key(pm):
    # pymemcache maps each VALUE line back to the key it asked for: a key with
    # options must come back as sent (Kestrel echoed the bare queue name).
    assert pm.set("echo", b"one") is True
    assert pm.get("echo/open") == b"one"
    assert pm.get("echo/close") is None
    assert pm.set("echo", b"two") is True
    assert pm.get_many(["echo/peek", "echo.r/peek"]) == {"echo/peek": b"two", "echo.r/peek": b"two"}


@pytest.mark.weir_only
def test_storage_commands_with_user_data_never_run_it(pm, mc):
    assert pm.set("victim", b"v") is True
    injected = b"x\r\ndelete victim\r\nflush_all"
    for call in (pm.add, pm.replace, pm.append, pm.prepend):
        with pytest.raises(MemcacheClientError):
            call("k", injected)
    with pytest.raises(MemcacheClientError):
        pm.cas("k", injected, b"1")
    # python-memcached reads the reply line; anything but STORED is a failure.
    assert not mc.add("k", injected.decode())
    assert not mc.append("k", injected.decode())
    assert pm.get("victim") == b"v", "the data block ran as commands"
