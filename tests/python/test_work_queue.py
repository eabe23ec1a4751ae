"""Work-queue features over the memcache door, on either backend: `deliveries_max`
with `dead_letter_to` (an item given back that many times moves to the dead-letter
queue instead of being handed out again) and `get q/touch` (a lease extended before
its `open_timeout_ms` passes). docs/protocol.md, docs/configuration.md."""

from __future__ import annotations

import subprocess
import time

from harness import Conn, value_reply, wait_for


def start(make_server, queues_toml: str):
    server = make_server()
    server.config_toml = (server.config_toml or "") + queues_toml
    return server.start()


def stat(conn: Conn, name: bytes) -> bytes | None:
    conn.send(b"stats\r\n")
    found = None
    while (line := conn.read_line()) != b"END\r\n":
        parts = line.split()
        if len(parts) == 3 and parts[1] == name:
            found = parts[2]
    return found


def test_an_item_given_back_deliveries_max_times_goes_to_dead_letter_to(make_server):
    server = start(make_server, '[queues."wq"]\ndeliveries_max = 2\ndead_letter_to = "wq_dead"\n')
    with Conn(server.addr) as c:
        assert c.set("wq", b"poison", flags=9) == b"STORED\r\n"
        assert c.set("wq", b"fine") == b"STORED\r\n"
        # Given back once by abort, once by a connection that ends holding it.
        c.send(b"get wq/open/t=3000\r\n")
        c.expect(value_reply(b"wq/open/t=3000", 9, b"poison"))
        c.send(b"get wq/abort\r\n")
        c.expect(b"END\r\n")
    with Conn(server.addr) as holder:
        holder.send(b"get wq/open/t=3000\r\n")
        holder.expect(value_reply(b"wq/open/t=3000", 9, b"poison"))
    with Conn(server.addr) as c:
        # The next get moves it and answers with the next item; it never comes again.
        c.send(b"get wq/t=3000\r\n")
        c.expect(value_reply(b"wq/t=3000", 0, b"fine"))
        c.send(b"get wq/t=500\r\n")
        c.expect(b"END\r\n")
        c.send(b"get wq_dead/t=3000\r\n")
        c.expect(value_reply(b"wq_dead/t=3000", 9, b"poison"))
        assert wait_for(lambda: stat(c, b"queue_wq_dead_lettered") == b"1", 5.0)


def test_without_dead_letter_to_the_item_is_dropped_and_counted(make_server):
    server = start(make_server, '[queues."drop"]\ndeliveries_max = 1\n')
    with Conn(server.addr) as c:
        assert c.set("drop", b"once") == b"STORED\r\n"
        c.send(b"get drop/open/t=3000\r\n")
        c.expect(value_reply(b"drop/open/t=3000", 0, b"once"))
        c.send(b"get drop/abort\r\n")
        c.expect(b"END\r\n")
        c.send(b"get drop/t=500\r\n")
        c.expect(b"END\r\n")
        assert wait_for(lambda: stat(c, b"queue_drop_dead_lettered") == b"1", 5.0)


def test_touch_keeps_a_lease_past_its_open_timeout(make_server):
    server = start(make_server, '[queues."slow"]\nopen_timeout_ms = 3000\n')
    with Conn(server.addr) as worker, Conn(server.addr) as other:
        assert worker.set("slow", b"job") == b"STORED\r\n"
        worker.send(b"get slow/open/t=3000\r\n")
        worker.expect(value_reply(b"slow/open/t=3000", 0, b"job"))
        time.sleep(2.0)
        worker.send(b"get slow/touch\r\n")
        worker.expect(b"END\r\n")
        time.sleep(2.0)
        # 4 s after the lease, past open_timeout_ms, but 2 s after the touch: still held.
        other.send(b"get slow\r\n")
        other.expect(b"END\r\n")
        # Not touched again, it times out and goes to the other client.
        other.send(b"get slow/t=6000\r\n")
        other.expect(value_reply(b"slow/t=6000", 0, b"job"))
        # The worker's lease is gone: its close confirms nothing.
        worker.send(b"get slow/close\r\n")
        worker.expect(b"END\r\n")


def test_touch_goes_alone_and_does_nothing_with_nothing_open(server):
    with Conn(server.addr) as c:
        c.send(b"get idle/touch\r\n")
        c.expect(b"END\r\n")
        for combined in [b"get q/touch/open\r\n", b"get q/close/touch\r\n", b"get q/peek/touch\r\n"]:
            assert c.request(combined) == b"CLIENT_ERROR touch cannot be combined\r\n", combined
        assert c.request(b"get q/touch/abort\r\n") == b"CLIENT_ERROR abort cannot be combined\r\n"


def test_a_bad_deliveries_max_or_dead_letter_to_is_refused_at_start(make_server, tmp_path):
    server = make_server()
    for bad, key in [
        ("deliveries_max = -1", "deliveries_max"),
        ('deliveries_max = "3"', "deliveries_max"),
        ('dead_letter_to = "a b"', "dead_letter_to"),
    ]:
        path = tmp_path / "bad.toml"
        path.write_text("[defaults]\n" + bad + "\n")
        done = subprocess.run(server.argv() + ["--config", str(path)], capture_output=True, timeout=30)
        err = done.stderr.decode(errors="replace")
        assert done.returncode != 0 and key in err, (bad, err)
