"""The beanstalkd door (`weir serve --beanstalk-listen ADDR`, docs/beanstalk.md).

One command script is sent to Debian's beanstalkd (started here, as memcached is for
the memcache tests) and to weir, and the replies are compared byte for byte where
the protocol fixes them; ids are matched up and the stats documents compared by
their keys. Then real clients from PyPI (greenstalk, pystalk) do every operation
they offer; kill -9 during reserve and delete loses nothing acknowledged; bad input
gets beanstalkd's error and loses nothing. The embedded engine only: on JetStream
the door refuses to start (the last test).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest

import harness
from harness import HOST, Conn, free_port

embedded = pytest.mark.embedded_only(reason="tubes need the embedded engine")


def beanstalk_toml(port: int) -> str:
    return f'[beanstalk]\nlisten = "{HOST}:{port}"\n'


@pytest.fixture
def weir(make_server):
    """A weir with its beanstalkd door on `weir.bport`."""
    server = make_server()
    server.bport = free_port()
    server.config_toml = (server.config_toml or "") + beanstalk_toml(server.bport)
    server.start()
    wait_beanstalk(server.bport)
    return server


def wait_beanstalk(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with Conn((HOST, port), 2.0) as c:
                if c.request(b"list-tube-used\r\n").startswith(b"USING "):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"no beanstalk door on {port}")


@pytest.fixture
def beanstalkd():
    """Debian's beanstalkd on a free port, in memory (no binlog)."""
    binary = shutil.which("beanstalkd") or "/usr/bin/beanstalkd"
    port = free_port()
    proc = subprocess.Popen([binary, "-l", HOST, "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_beanstalk(port)
        yield port
    finally:
        proc.kill()
        proc.wait(timeout=10)


def read_reply(c: Conn) -> bytes:
    """One whole reply: its line, and the body a RESERVED, FOUND or OK line announces."""
    line = c.read_line()
    word = line.split(b" ")[0]
    if word in (b"RESERVED", b"FOUND", b"OK"):
        n = int(line[:-2].split(b" ")[-1])
        return line + c.read_exact(n + 2)
    return line


def yaml_keys(reply: bytes) -> list[bytes]:
    body = reply.split(b"\r\n", 1)[1]
    return [line.split(b":", 1)[0] for line in body.split(b"\n")[1:] if line]


# The script: (request, how to compare). `{name}` in a request is the id a previous
# `INSERTED` gave under that name (`put>name`); ids in replies are replaced back.
SCRIPT = [
    ("use t1\r\n", "exact"),
    ("put>a put 5 0 10 5\r\nhello\r\n", "exact"),
    ("put>b put 1 0 10 3\r\nabc\r\n", "exact"),
    ("peek-ready\r\n", "exact"),
    ("peek {a}\r\n", "exact"),
    ("watch t1\r\n", "exact"),
    ("ignore default\r\n", "exact"),
    ("ignore t1\r\n", "exact"),
    ("ignore nosuch\r\n", "exact"),
    ("list-tube-used\r\n", "exact"),
    ("list-tubes-watched\r\n", "exact"),
    ("reserve-with-timeout 0\r\n", "exact"),
    ("touch {b}\r\n", "exact"),
    ("release {b} 2 0\r\n", "exact"),
    ("reserve\r\n", "exact"),
    ("stats-job {b}\r\n", "keys"),
    ("bury {b} 2\r\n", "exact"),
    ("peek-buried\r\n", "exact"),
    ("kick 10\r\n", "exact"),
    ("reserve\r\n", "exact"),
    ("bury {b} 2\r\n", "exact"),
    ("kick-job {b}\r\n", "exact"),
    ("kick-job {b}\r\n", "exact"),
    ("reserve-job {b}\r\n", "exact"),
    ("delete {b}\r\n", "exact"),
    ("delete {b}\r\n", "exact"),
    ("reserve-job {a}\r\n", "exact"),
    ("release {a} 5 0\r\n", "exact"),
    ("delete {a}\r\n", "exact"),
    ("stats-job {a}\r\n", "exact"),
    ("reserve-with-timeout 0\r\n", "exact"),
    ("peek-ready\r\n", "exact"),
    ("peek-buried\r\n", "exact"),
    ("peek-delayed\r\n", "exact"),
    ("release 12345 1 0\r\n", "exact"),
    ("bury 12345 1\r\n", "exact"),
    ("touch 12345\r\n", "exact"),
    # A body holding commands is data.
    ("put>c put 0 0 10 10\r\ndelete 1\r\n\r\n", "exact"),
    ("peek {c}\r\n", "exact"),
    ("delete {c}\r\n", "exact"),
    ("stats-tube t1\r\n", "keys"),
    ("stats-tube nosuch\r\n", "exact"),
    ("stats\r\n", "keys"),
    ("pause-tube t1 0\r\n", "exact"),
    ("pause-tube nosuch 1\r\n", "exact"),
    # Delays: put and release with a delay, peek-delayed, kick of delayed jobs when
    # none is buried, kick-job and reserve-job of a delayed job.
    ("use t2\r\n", "exact"),
    ("watch t2\r\n", "exact"),
    ("put>d put 0 100 10 1\r\nd\r\n", "exact"),
    ("peek-delayed\r\n", "exact"),
    ("peek-ready\r\n", "exact"),
    ("stats-job {d}\r\n", "keys"),
    ("stats-tube t2\r\n", "keys"),
    ("kick 5\r\n", "exact"),
    ("peek-ready\r\n", "exact"),
    ("peek-delayed\r\n", "exact"),
    ("reserve-job {d}\r\n", "exact"),
    ("release {d} 0 100\r\n", "exact"),
    ("peek-delayed\r\n", "exact"),
    ("kick-job {d}\r\n", "exact"),
    ("kick-job {d}\r\n", "exact"),
    ("delete {d}\r\n", "exact"),
    ("put>e put 0 1 10 1\r\ne\r\n", "exact"),
    ("reserve-with-timeout 0\r\n", "exact"),
    ("reserve-with-timeout 3\r\n", "exact"),
    ("delete {e}\r\n", "exact"),
    ("put>f put 0 100 10 1\r\nf\r\n", "exact"),
    ("reserve-job {f}\r\n", "exact"),
    ("delete {f}\r\n", "exact"),
    ("ignore t2\r\n", "exact"),
    ("use t1\r\n", "exact"),
    ("put 0 0 10 70000\r\n" + "x" * 70000 + "\r\n", "exact"),
    ("put 0 0 10 2\r\nabcd", "exact"),
    ("foo\r\n", "exact"),
    ("use -x\r\n", "exact"),
    ("reserve-job\r\n", "exact"),
    ("watch " + "a" * 201 + "\r\n", "exact"),
    ("a" * 300 + "\r\n", "exact"),
    ("list-tube-used\r\n", "exact"),
]


def name_ids(reply: bytes, ids: dict[str, bytes]) -> bytes:
    """`reply` with the ids it carries (after INSERTED, RESERVED, FOUND, and in
    `id: `) replaced by their names."""
    names = {v: b"{" + k.encode() + b"}" for k, v in ids.items()}
    head, sep, rest = reply.partition(b"\r\n")
    words = head.split(b" ")
    if words[0] in (b"INSERTED", b"RESERVED", b"FOUND") and len(words) > 1:
        words[1] = names.get(words[1], words[1])
    lines = [b"id: " + names.get(line[4:], line[4:]) if line.startswith(b"id: ") else line for line in rest.split(b"\n")]
    return b" ".join(words) + sep + b"\n".join(lines)


def run_script(port: int) -> list[tuple[bytes, str]]:
    """The script's replies, ids named by their `put>` names."""
    ids: dict[str, bytes] = {}
    replies = []
    with Conn((HOST, port), 10.0) as c:
        for request, how in SCRIPT:
            name = None
            if request.startswith("put>"):
                name, request = request[4:].split(" ", 1)
            for k, v in ids.items():
                request = request.replace("{" + k + "}", v.decode())
            c.send(request.encode())
            reply = read_reply(c)
            if name is not None and reply.startswith(b"INSERTED "):
                ids[name] = reply[9:-2]
            replies.append((name_ids(reply, ids), how))
        c.send(b"quit\r\n")
        c.sock.settimeout(5.0)
        assert c.sock.recv(10) == b"", "quit closes the connection"
    return replies


@embedded
def test_the_script_gets_beanstalkds_replies(weir, beanstalkd):
    theirs = run_script(beanstalkd)
    ours = run_script(weir.bport)
    for (request, _), (want, how), (got, _) in zip(SCRIPT, theirs, ours):
        if how == "keys":
            assert yaml_keys(got) == yaml_keys(want), request
            assert got.split(b" ")[0] == want.split(b" ")[0]
        else:
            assert got == want, f"{request[:60]!r}: beanstalkd {want[:80]!r}, weir {got[:80]!r}"


@embedded
def test_greenstalk_does_everything_it_offers(weir):
    import greenstalk

    with greenstalk.Client((HOST, weir.bport), use="g1", watch=["g1"]) as c:
        assert c.using() == "g1"
        assert c.watching() == ["g1"]
        first = c.put("one", priority=10, ttr=30)
        second = c.put("two", priority=5)
        assert first != second
        assert c.peek(first).body == "one"
        assert c.peek_ready().id == second
        with pytest.raises(greenstalk.NotFoundError):
            c.peek_delayed()
        later = c.put("later", delay=100)
        assert c.peek_delayed().id == later
        assert c.stats_job(later)["state"] == "delayed"
        assert c.stats_tube("g1")["current-jobs-delayed"] == 1
        c.delete(later)
        job = c.reserve(timeout=1)
        assert (job.id, job.body) == (second, "two")
        c.touch(job)
        stats = c.stats_job(job)
        assert stats["state"] == "reserved" and stats["tube"] == "g1"
        c.release(job, priority=1)
        job = c.reserve(timeout=1)
        assert job.id == second
        c.bury(job)
        assert c.peek_buried().id == second
        assert c.kick(5) == 1
        job = c.reserve(timeout=1)
        c.bury(job)
        c.kick_job(job)
        job = c.reserve_job(second)
        c.delete(job)
        with pytest.raises(greenstalk.NotFoundError):
            c.peek(second)
        assert c.watch("g2") == 2
        assert c.ignore("g2") == 1
        with pytest.raises(greenstalk.NotIgnoredError):
            c.ignore("g1")
        c.use("g2")
        assert "g1" in c.tubes() and "g2" in c.tubes()
        assert c.stats_tube("g1")["current-jobs-ready"] == 1
        assert c.stats()["current-jobs-ready"] == 1
        c.pause_tube("g1", 1)
        with pytest.raises(greenstalk.TimedOutError):
            c.reserve(timeout=0)
        job = c.reserve(timeout=3)
        assert job.id == first, "reserved once the pause ended"
        c.delete(job.id)
        with pytest.raises(greenstalk.TimedOutError):
            c.reserve(timeout=0)


@embedded
def test_pystalk_does_everything_it_offers(weir):
    from pystalk import BeanstalkClient
    from pystalk.client import BeanstalkError

    c = BeanstalkClient(HOST, weir.bport, auto_decode=True)
    c.use("p1")
    c.watch("p1")  # pystalk ignores `default` on the first watch
    c.watch("p2")
    c.ignore("p2")
    assert c.watchlist == {"p1"}
    # pystalk answers a put with (status, id).
    status, a = c.put_job("alpha", pri=3, ttr=30)
    assert status == b"INSERTED"
    _, b = c.put_job_into("p1", "beta", pri=1)
    assert "p1" in c.list_tubes()
    assert c.stats()["current-jobs-ready"] == 2
    assert c.stats_tube("p1")["total-jobs"] == 2
    assert c.peek_ready().job_id == b
    # The peek iterators peek until NOT_FOUND: deleting what they yield ends them.
    assert [j.job_id for j in c.peek_delayed_iter()] == []
    job = c.reserve_job(timeout=1)
    assert (job.job_id, job.job_data) == (b, "beta")
    assert c.stats_job(b)["state"] == "reserved"
    c.release_job(b, pri=1)
    job = c.reserve_job(timeout=1)
    c.bury_job(job.job_id)
    assert c.peek_buried().job_id == b
    c.kick_job(b)
    job = c.reserve_job(timeout=1)
    c.bury_job(job.job_id)
    c.kick_jobs(1)
    c.delete_job(b)
    with pytest.raises(BeanstalkError):
        c.peek_delayed()
    c.pause_tube("p1", 1)
    c.unpause_tube("p1")
    got = []
    for job in c.reserve_iter():
        got.append(job.job_id)
        c.delete_job(job.job_id)
    assert got == [a]
    assert list(c.peek_buried_iter()) == []
    c.close()


@embedded
def test_kill_9_loses_nothing_acknowledged(weir):
    with Conn((HOST, weir.bport)) as c:
        c.send(b"use k\r\n")
        assert c.read_line() == b"USING k\r\n"
        ids = []
        for body in (b"kept", b"held", b"gone"):
            c.send(b"put 0 0 60 %d\r\n%s\r\n" % (len(body), body))
            line = c.read_line()
            assert line.startswith(b"INSERTED ")
            ids.append(int(line[9:-2]))
        assert c.request(b"watch k\r\n") == b"WATCHING 2\r\n"
        c.send(b"reserve-job %d\r\n" % ids[1])
        assert read_reply(c) == b"RESERVED %d 4\r\nheld\r\n" % ids[1]
        assert c.request(b"delete %d\r\n" % ids[2]) == b"DELETED\r\n"
        c.send(b"put 0 300 60 5\r\nlater\r\n")
        delayed = int(c.read_line()[9:-2])
        # A reserve waiting when the process dies.
        c.send(b"reserve-job %d\r\n" % ids[0])
        assert read_reply(c).startswith(b"RESERVED ")
        c.send(b"reserve\r\n")
        weir.kill9()
    weir.start()
    wait_beanstalk(weir.bport)
    with Conn((HOST, weir.bport)) as c:
        assert c.request(b"use k\r\n") == b"USING k\r\n"
        for id_, body in ((ids[0], b"kept"), (ids[1], b"held")):
            c.send(b"stats-job %d\r\n" % id_)
            assert b"state: ready\n" in read_reply(c), "a reserved job is ready after the restart"
            c.send(b"peek %d\r\n" % id_)
            assert read_reply(c) == b"FOUND %d %d\r\n%s\r\n" % (id_, len(body), body)
        assert c.request(b"peek %d\r\n" % ids[2]) == b"NOT_FOUND\r\n", "deleted stays deleted"
        c.send(b"peek-delayed\r\n")
        assert read_reply(c) == b"FOUND %d 5\r\nlater\r\n" % delayed, "a delayed job stays delayed"
        c.send(b"put 0 0 60 3\r\nnew\r\n")
        new_id = int(c.read_line()[9:-2])
        assert new_id > max(ids), "ids do not start again after a restart"


@embedded
def test_bad_input_gets_beanstalkds_errors_and_loses_nothing(weir):
    with Conn((HOST, weir.bport)) as c:
        c.send(b"put 0 0 10 4\r\nsafe\r\n")
        safe = int(c.read_line()[9:-2])
        # Too long, then binary garbage, then a NUL: each refused, the connection kept.
        assert c.request(b"x" * 5000 + b"\r\n") == b"BAD_FORMAT\r\n"
        assert c.request(b"\xff\xfe\x01garbage\r\n") == b"UNKNOWN_COMMAND\r\n"
        assert c.request(b"peek\x00 1\r\n") == b"BAD_FORMAT\r\n"
    # A put cut short: nothing stored.
    with Conn((HOST, weir.bport)) as c:
        c.send(b"put 0 0 10 100\r\nonly part")
    with Conn((HOST, weir.bport)) as c:
        c.send(b"stats-tube default\r\n")
        assert b"current-jobs-ready: 1\n" in read_reply(c)
        c.send(b"peek %d\r\n" % safe)
        assert read_reply(c) == b"FOUND %d 4\r\nsafe\r\n" % safe
        # A body that holds commands is stored, never run.
        body = b"delete %d\r\nquit\r\n" % safe
        c.send(b"put 0 0 10 %d\r\n%s\r\n" % (len(body), body))
        evil = int(c.read_line()[9:-2])
        c.send(b"peek %d\r\n" % evil)
        assert read_reply(c) == b"FOUND %d %d\r\n%s\r\n" % (evil, len(body), body)
        assert c.request(b"peek %d\r\n" % safe).startswith(b"FOUND ")
        c.read_exact(len(b"safe\r\n"))


@embedded
def test_idle_connections_and_a_waiting_reserve_do_not_stop_others(weir):
    idle = [socket.create_connection((HOST, weir.bport)) for _ in range(200)]
    try:
        waiting = Conn((HOST, weir.bport), 10.0)
        assert waiting.request(b"watch w\r\n") == b"WATCHING 2\r\n"
        waiting.send(b"reserve\r\n")
        with Conn((HOST, weir.bport)) as c:
            assert c.request(b"use other\r\n") == b"USING other\r\n"
            for _ in range(20):
                c.send(b"put 0 0 10 1\r\nx\r\n")
                id_ = int(c.read_line()[9:-2])
                assert c.request(b"delete %d\r\n" % id_) == b"DELETED\r\n"
            assert c.request(b"use w\r\n") == b"USING w\r\n"
            c.send(b"put 0 0 10 2\r\nhi\r\n")
            id_ = int(c.read_line()[9:-2])
        assert read_reply(waiting) == b"RESERVED %d 2\r\nhi\r\n" % id_
        # The holder goes away: its job is ready again.
        waiting.close()
        with Conn((HOST, weir.bport)) as c:
            assert c.request(b"watch w\r\n") == b"WATCHING 2\r\n"
            c.send(b"reserve-with-timeout 5\r\n")
            assert read_reply(c) == b"RESERVED %d 2\r\nhi\r\n" % id_
    finally:
        for s in idle:
            s.close()


@embedded
def test_deadline_soon_and_ttr(weir):
    with Conn((HOST, weir.bport), 10.0) as c:
        c.send(b"put 0 0 1 1\r\nz\r\n")
        id_ = int(c.read_line()[9:-2])
        c.send(b"reserve\r\n")
        assert read_reply(c) == b"RESERVED %d 1\r\nz\r\n" % id_
        assert c.request(b"reserve\r\n") == b"DEADLINE_SOON\r\n"
        time.sleep(1.5)
        # The ttr passed: the job is ready again, and no longer this connection's.
        c.send(b"reserve-with-timeout 2\r\n")
        assert read_reply(c) == b"RESERVED %d 1\r\nz\r\n" % id_
        assert c.request(b"delete %d\r\n" % id_) in (b"DELETED\r\n", b"NOT_FOUND\r\n")


@embedded
def test_a_waiting_reserve_is_told_deadline_soon_as_by_beanstalkd(weir, beanstalkd):
    for port in (beanstalkd, weir.bport):
        with Conn((HOST, port), 10.0) as c:
            c.send(b"use soon\r\n")
            c.read_line()
            assert c.request(b"watch soon\r\n") == b"WATCHING 2\r\n"
            c.send(b"put 0 0 3 1\r\nq\r\n")
            id_ = c.read_line()[9:-2]
            c.send(b"reserve\r\n")
            assert read_reply(c) == b"RESERVED %s 1\r\nq\r\n" % id_
            started = time.monotonic()
            assert c.request(b"reserve-with-timeout 10\r\n", 8.0) == b"DEADLINE_SOON\r\n", port
            assert 1.0 <= time.monotonic() - started <= 3.0
            assert c.request(b"delete %s\r\n" % id_) == b"DELETED\r\n"


@embedded
def test_a_pause_holds_a_reserve_already_waiting(weir):
    with Conn((HOST, weir.bport), 10.0) as waiting, Conn((HOST, weir.bport)) as c:
        waiting.send(b"reserve-with-timeout 8\r\n")
        time.sleep(0.3)
        assert c.request(b"pause-tube default 2\r\n") == b"PAUSED\r\n"
        c.send(b"put 0 0 10 1\r\np\r\n")
        id_ = int(c.read_line()[9:-2])
        started = time.monotonic()
        assert read_reply(waiting) == b"RESERVED %d 1\r\np\r\n" % id_
        assert time.monotonic() - started >= 1.0, "held until the pause ended"


@embedded
def test_sigterm_gives_held_jobs_back(weir):
    with Conn((HOST, weir.bport)) as c:
        c.send(b"put 0 0 100 4\r\nhold\r\n")
        id_ = int(c.read_line()[9:-2])
        c.send(b"reserve\r\n")
        assert read_reply(c).startswith(b"RESERVED ")
        weir.sigterm()
        assert weir.wait_exit(20) == 0
    weir.start()
    wait_beanstalk(weir.bport)
    with Conn((HOST, weir.bport)) as c:
        c.send(b"stats-job %d\r\n" % id_)
        assert b"state: ready\n" in read_reply(c)


@embedded
def test_the_drain_script_of_the_docs_moves_every_job(weir, beanstalkd):
    import greenstalk

    old = greenstalk.Client((HOST, beanstalkd))
    for tube, n in (("default", 3), ("mail.out", 2), ("x+y", 1)):
        old.use(tube)
        for i in range(n):
            old.put(f"{tube}-{i}", priority=100 + i, ttr=30)
    old.use("mail.out")
    old.watch("mail.out")
    old.bury(old.reserve_job(old.peek_ready().id))
    old.close()
    # The script of docs/beanstalk.md, "Moving from beanstalkd", as written there.
    text = (harness.REPO_ROOT / "docs" / "beanstalk.md").read_text()
    script = text.split("With greenstalk:\n\n```python\n", 1)[1].split("```", 1)[0]
    script = script.replace("11300", str(beanstalkd)).replace("11301", str(weir.bport))
    exec(compile(script, "beanstalk.md", "exec"), {})
    new = greenstalk.Client((HOST, weir.bport))
    moved = {}
    for tube in ("default", "mail.out", "x+y"):
        new.watch(tube)
    while True:
        try:
            job = new.reserve(timeout=0)
        except greenstalk.TimedOutError:
            break
        moved[job.body] = new.stats_job(job)["pri"]
        new.delete(job)
    assert moved == {
        "default-0": 100, "default-1": 101, "default-2": 102,
        # buried by greenstalk's `bury`, which gives it its default priority
        "mail.out-0": 65536, "mail.out-1": 101, "x+y-0": 100,
    }


@embedded
def test_the_limits_hold(make_server):
    server = make_server()
    server.bport = free_port()
    server.config_toml = (server.config_toml or "") + beanstalk_toml(server.bport) + (
        "connections_max = 3\nwatched_max = 2\nreserved_max = 1\n[defaults]\npriorities_max = 2\n"
    )
    server.start()
    wait_beanstalk(server.bport)
    with Conn((HOST, server.bport)) as c:
        assert c.request(b"watch a\r\n") == b"WATCHING 2\r\n"
        assert c.request(b"watch b\r\n") == b"OUT_OF_MEMORY\r\n"
        assert c.request(b"watch a\r\n") == b"WATCHING 2\r\n"
        for _ in range(2):
            c.send(b"put 0 0 30 1\r\nx\r\n")
            assert c.read_line().startswith(b"INSERTED ")
        c.send(b"reserve\r\n")
        assert read_reply(c).startswith(b"RESERVED ")
        assert c.request(b"reserve-with-timeout 0\r\n") == b"OUT_OF_MEMORY\r\n"
        # The default priority (1024) and 0 are in use: a third priority is refused.
        c.send(b"put 1024 0 30 1\r\nx\r\n")
        assert c.read_line().startswith(b"INSERTED ")
        assert c.request(b"put 8 0 30 1\r\nx\r\n") == b"OUT_OF_MEMORY\r\n"
        with Conn((HOST, server.bport)) as second, Conn((HOST, server.bport)) as third:
            assert second.request(b"list-tube-used\r\n") == b"USING default\r\n"
            fourth = socket.create_connection((HOST, server.bport), timeout=5)
            fourth.sendall(b"list-tube-used\r\n")
            try:
                assert fourth.recv(100) == b"", "past connections_max: closed at once"
            except ConnectionResetError:
                pass
            fourth.close()
            assert third.request(b"list-tube-used\r\n") == b"USING default\r\n"


@pytest.mark.jetstream_only
def test_on_jetstream_the_door_refuses_to_start(make_server):
    server = make_server()
    port = free_port()
    server.config_toml = (server.config_toml or "") + beanstalk_toml(port)
    server.start_no_wait()
    code = server.wait_exit(30)
    assert code not in (None, 0)
    log = server.log_path.read_text()
    assert "beanstalk needs the embedded backend" in log


@embedded
def test_the_flag_starts_the_door(make_server):
    server = make_server()
    port = free_port()
    argv = server.argv
    server.argv = lambda: argv() + ["--beanstalk-listen", f"{HOST}:{port}"]
    server.start()
    wait_beanstalk(port)
    assert harness.HOST
