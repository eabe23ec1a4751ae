"""The proxy end to end: the built `weir` binary with `[proxy]`, a primary and shadows
in Python (http.server), kill -9 of weir with replays queued.
"""

from __future__ import annotations

import http.client
import http.server
import os
import socket
import threading
import time
import urllib.request

import pytest

import harness

# Each test runs on either backend (WEIR_TEST_BACKEND): on JetStream the captures
# live in the test's stream, and the shadows replay from its consumers.
pytestmark = [pytest.mark.weir_only]


class Server:
    """A Python HTTP server recording (method, path, headers, body); answers `status`
    after `delay_s`, or never when `hang` is set."""

    def __init__(self, port=0):
        self.lock = threading.Lock()
        self.got = []
        self.status = 200
        self.hang = threading.Event()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle_one(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with owner.lock:
                    owner.got.append((self.command, self.path, dict(self.headers), body))
                if owner.hang.is_set():
                    time.sleep(30)
                    return
                payload = b"Hello world!"
                self.send_response(owner.status)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = handle_one

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer((harness.HOST, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def paths(self):
        with self.lock:
            return [g[1] for g in self.got]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class ProxyServer(harness.ServerProcess):
    def __init__(self, binary, primary_port, shadows, proxy_settings=""):
        super().__init__(binary, "weir")
        self.proxy_port = harness.free_port()
        self.config = self.root / "weir.toml"
        # On JetStream, the harness's own settings (short leases) come first; then
        # the test's own `[proxy]` settings, if any.
        text = (self.config_toml or "") + (f"[proxy]\n{proxy_settings}" if proxy_settings else "") + (
            "[[proxy.listen]]\n"
            'name = "main"\n'
            f'addr = "{harness.HOST}:{self.proxy_port}"\n'
            "[[proxy.routes]]\n"
            'name = "api"\n'
            f'targets = ["http://{harness.HOST}:{primary_port}"]\n'
            "request_timeout_ms = 5000\n"
        )
        for name, port, extra in shadows:
            text += f'[[proxy.routes.shadows]]\nname = "{name}"\nurl = "http://{harness.HOST}:{port}"\n{extra}'
        self.config.write_text(text)

    def argv(self):
        return super().argv() + ["--config", str(self.config)]

    def request(self, method, path, body=b""):
        c = http.client.HTTPConnection(harness.HOST, self.proxy_port, timeout=10)
        try:
            c.request(method, path, body=body)
            r = c.getresponse()
            return r.status, r.read(), r.getheader("x-weir-proxy-error")
        finally:
            c.close()


@pytest.fixture
def servers():
    made = []

    def make(port=0):
        s = Server(port)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


@pytest.fixture
def proxy(server_bin):
    made = []

    def make(*args):
        p = ProxyServer(server_bin, *args)
        made.append(p)
        return p.start()

    yield make
    for p in made:
        p.stop()


def wait_for(predicate, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def test_a_hanging_shadow_does_not_touch_the_clients_requests(servers, proxy):
    primary, fast, stuck = servers(), servers(), servers()
    stuck.hang.set()
    p = proxy(primary.port, [("fast", fast.port, ""), ("stuck", stuck.port, "timeout_ms = 60000\n")])
    latencies = []
    for i in range(50):
        started = time.monotonic()
        status, body, _ = p.request("POST", f"/orders/{i}", b"x" * 1723)
        latencies.append(time.monotonic() - started)
        assert (status, body) == (200, b"Hello world!")
    assert sorted(latencies)[len(latencies) // 2] < 0.1, latencies
    wait_for(lambda: len(fast.paths()) == 50)
    assert sorted(fast.paths()) == sorted(f"/orders/{i}" for i in range(50))
    assert all(g[3] == b"x" * 1723 for g in fast.got)


def test_kill9_with_replays_queued_delivers_them_after_restart(servers, proxy):
    primary = servers()
    # The shadow is down at first. Its port stays bound (not listening: connections
    # are refused) until the shadow starts, so that no outgoing connection takes it
    # as its own port meanwhile (a connection to a free loopback port from that very
    # port connects to itself).
    placeholder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    placeholder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    placeholder.bind((harness.HOST, 0))
    shadow_port = placeholder.getsockname()[1]
    p = proxy(primary.port, [("later", shadow_port, "concurrency = 1\n")])
    for i in range(30):
        assert p.request("PUT", f"/items/{i}", f"v{i}".encode())[0] == 200
    time.sleep(0.5)
    p.kill9()
    p.start()
    placeholder.close()
    shadow = servers(shadow_port)
    wait_for(lambda: len(set(shadow.paths())) == 30, timeout_s=40)
    if harness.on_jetstream():
        # The killed process's lease on the first request outlives it (until the
        # lease timeout, no other door being there to give it back), while its
        # successor replays the next ones: all arrive once, the first one later.
        assert sorted(shadow.paths()) == sorted(f"/items/{i}" for i in range(30))
        # The shadow's reader is the capture queue's only consumer (no default
        # reader keeps the captures), so once replayed they are gone.
        consumer = "proxy:capture:api~later"

        def freed():
            names, messages = harness.stream_consumers_and_messages(p.stream)
            assert names == [consumer], names
            return messages == 0

        wait_for(freed, timeout_s=10)
    else:
        assert shadow.paths()[:30] == [f"/items/{i}" for i in range(30)]
    assert {g[3] for g in shadow.got} == {f"v{i}".encode() for i in range(30)}


def test_refusals_carry_a_reason(servers, proxy):
    primary = servers()
    p = proxy(primary.port, [])
    primary.close()  # the primary is gone
    status, _, reason = p.request("GET", "/anything", b"")
    assert status == 502 and "failed" in reason


def test_weir_proxy_runs_the_proxy_alone_and_stops_on_sigterm(servers, server_bin, tmp_path):
    """`weir proxy --config FILE`: no memcache port, the proxy only; SIGTERM stops it
    with its captures on disk, replayed by the next run."""
    import subprocess

    primary = servers()
    shadow_port = harness.free_port()  # down during the first run
    port = harness.free_port()
    config = tmp_path / "proxy.toml"
    stream = f"WTP{os.getpid()}_{port}"
    backend = (
        "[backend]\n"
        'kind = "jetstream"\n'
        "[backend.jetstream]\n"
        f"servers = {harness.NATS_URLS.split(',')!r}\n"
        f'stream = "{stream}"\n'
        f'subject_prefix = "{stream}.q"\n'
        f"lease_timeout_ms = {int(harness.JETSTREAM_LEASE_TIMEOUT_S * 1000)}\n"
        if harness.on_jetstream()
        else ""
    )
    config.write_text(
        backend + "[[proxy.listen]]\n"
        'name = "main"\n'
        f'addr = "{harness.HOST}:{port}"\n'
        "[[proxy.routes]]\n"
        'name = "api"\n'
        f'targets = ["http://{harness.HOST}:{primary.port}"]\n'
        "[[proxy.routes.shadows]]\n"
        'name = "later"\n'
        f'url = "http://{harness.HOST}:{shadow_port}"\n'
    )
    argv = [str(server_bin), "proxy", "--config", str(config), "--data-dir", str(tmp_path / "data")]

    def run():
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                c = http.client.HTTPConnection(harness.HOST, port, timeout=2)
                c.request("GET", "/ready")
                c.getresponse().read()
                c.close()
                return proc
            except OSError:
                time.sleep(0.05)
        proc.kill()
        raise AssertionError("weir proxy did not start: " + proc.stderr.read().decode())

    proc = run()
    try:
        for i in range(5):
            c = http.client.HTTPConnection(harness.HOST, port, timeout=5)
            c.request("POST", f"/p/{i}", body=f"b{i}".encode())
            r = c.getresponse()
            assert (r.status, r.read()) == (200, b"Hello world!")
            c.close()
        proc.send_signal(15)
        assert proc.wait(timeout=15) == 0, proc.stderr.read().decode()
        shadow = servers(shadow_port)
        proc = run()
        wait_for(lambda: len([p for p in shadow.paths() if p.startswith("/p/")]) >= 5)
        assert sorted(p for p in shadow.paths() if p.startswith("/p/")) == [f"/p/{i}" for i in range(5)]
    finally:
        proc.kill()
        proc.wait()
        if harness.on_jetstream():
            harness.delete_stream(stream)


def queue_stats(p) -> dict[str, int]:
    """The `STAT queue_…` lines of weir's `stats`, by name."""
    out = {}
    with harness.Conn(p.addr) as c:
        c.send(b"stats\r\n")
        while (line := c.read_line()) != b"END\r\n":
            parts = line.decode().split()
            if len(parts) == 3 and parts[1].startswith("queue_") and parts[2].isdigit():
                out[parts[1]] = int(parts[2])
    return out


def test_a_removed_shadows_reader_goes_on_the_engine_and_is_named_on_jetstream(servers, proxy):
    """A shadow removed from the config leaves a reader that would keep every capture.
    The embedded engine deletes it at start; on JetStream, where another proxy may
    still replay from it, it stays, named in a warning, until deleted by hand."""
    primary = servers()
    a_port, b_port = harness.free_port(), harness.free_port()  # both shadows down
    p = proxy(primary.port, [("a", a_port, ""), ("b", b_port, "")])
    for i in range(3):
        assert p.request("PUT", f"/r/{i}", b"x")[0] == 200
    wait_for(lambda: queue_stats(p).get("queue_proxy:capture:api+b_items") == 3)
    p.kill9()
    text = p.config.read_text()
    # Deleting a capture queue's reader by hand needs reserved_queues_writable.
    p.config.write_text(
        text[: text.index('[[proxy.routes.shadows]]\nname = "b"')]
        + "[server]\nreserved_queues_writable = true\n"
    )
    p.start()
    b_items = "queue_proxy:capture:api+b_items"
    if harness.on_jetstream():
        assert b_items in queue_stats(p)
        wait_for(lambda: b"is no shadow of this proxy's config" in p.log_path.read_bytes())
        with harness.Conn(p.addr) as c:
            assert c.request(b"delete proxy:capture:api.b\r\n") == b"DELETED\r\n"
    wait_for(lambda: b_items not in queue_stats(p))
    # Shadow a gets the three, after which nothing keeps them.
    shadow = servers(a_port)
    wait_for(lambda: sorted(shadow.paths()) == [f"/r/{i}" for i in range(3)], timeout_s=30)
    wait_for(lambda: queue_stats(p).get("queue_proxy:capture:api_items") == 0, timeout_s=15)


def metric(p, series: str) -> int:
    """The value of `series` (name and labels, as written) on weir's `/metrics`."""
    c = http.client.HTTPConnection(harness.HOST, p.http_port, timeout=10)
    try:
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
    finally:
        c.close()
    for line in text.splitlines():
        if line.startswith(series + " "):
            return int(line.split()[-1])
    raise AssertionError(f"no {series} in /metrics")


def replays_2xx(p) -> int:
    """The proxy's 2xx replays to shadow `s` of route `api`."""
    return metric(p, 'weir_proxy_replays_total{route="api",shadow="s",class="2xx"}')


@pytest.mark.jetstream_only
def test_two_proxies_on_one_cluster_share_a_shadows_backlog(servers, server_bin):
    """Two proxies with the same route on one stream: the shadow's reader is shared,
    so each capture, whichever proxy took it, is replayed once, by one of them."""
    primary = servers()
    shadow_port = harness.free_port()  # down while both capture
    a = ProxyServer(server_bin, primary.port, [("s", shadow_port, "")])
    b = ProxyServer(server_bin, primary.port, [("s", shadow_port, "")])
    b.stream, b.shares_stream = a.stream, True
    try:
        a.start()
        b.start()
        for i in range(40):
            door = a if i % 2 == 0 else b
            assert door.request("PUT", f"/x/{i}", b"v")[0] == 200
        shadow = servers(shadow_port)
        wait_for(lambda: len(shadow.paths()) >= 40, timeout_s=40)
        time.sleep(1.0)  # a capture replayed twice would show by now
        assert sorted(shadow.paths()) == sorted(f"/x/{i}" for i in range(40))
        by_door = (replays_2xx(a), replays_2xx(b))
        # Each proxy held a capture while the shadow was down: both replayed.
        assert sum(by_door) == 40 and min(by_door) > 0, by_door
    finally:
        b.stop()  # shares a's stream: stopped first, a's stop deletes it
        a.stop()


def captures_counted(p, outcome: str) -> int:
    """The proxy's `weir_proxy_captures_total` of route `api` for `outcome`."""
    return metric(p, f'weir_proxy_captures_total{{route="api",outcome="{outcome}"}}')


@pytest.mark.jetstream_only
def test_a_proxy_whose_cluster_is_down_forwards_and_captures_once_it_is_up(servers, server_bin, tmp_path):
    """A single-node JetStream of its own, down when the proxy starts: requests are
    forwarded all along, counted `not_ready` (and never replayed) until the capture
    queue is set up in the background; then captures replay to the shadow."""
    import shutil
    import subprocess

    primary, shadow = servers(), servers()
    nats_port = harness.free_port()
    store = tmp_path / "js"
    p = ProxyServer(server_bin, primary.port, [("s", shadow.port, "")])
    p.nats_urls = f"nats://{harness.HOST}:{nats_port}"
    p.shares_stream = True  # the stream lives in this test's own NATS, removed below
    p.config.write_text(
        p.config.read_text().replace(
            "[backend.jetstream]\n", "[backend.jetstream]\nreplicas = 1\nunavailable_retry_ms = 1500\n", 1
        )
    )
    nats = None
    try:
        p.start()
        for i in range(5):
            assert p.request("PUT", f"/before/{i}", b"v")[0] == 200
        assert captures_counted(p, "not_ready") == 5
        assert captures_counted(p, "captured") == 0
        nats = subprocess.Popen(
            [str(harness.REPO_ROOT / ".tools" / "bin" / "nats-server"), "-js", "-a", harness.HOST,
             "-p", str(nats_port), "-sd", str(store)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        sent = 0
        deadline = time.monotonic() + 90
        while not any(x.startswith("/after/") for x in shadow.paths()):
            assert time.monotonic() < deadline, "captures did not resume: " + p.log_tail()
            assert p.request("PUT", f"/after/{sent}", b"v")[0] == 200
            sent += 1
            time.sleep(0.25)
        assert captures_counted(p, "captured") >= 1
        assert captures_counted(p, "not_ready") + captures_counted(p, "captured") == 5 + sent
        assert not [x for x in shadow.paths() if x.startswith("/before/")]
        assert [x for x in primary.paths() if x.startswith("/before/")] == [f"/before/{i}" for i in range(5)]
    finally:
        p.stop()
        if nats is not None:
            nats.kill()
            nats.wait(10)
        shutil.rmtree(store, ignore_errors=True)


EXPORT_KEY = "export-key-0123456789abcdef"


def export(p, query=""):
    """`GET /captures/proxy:capture:api?QUERY` with the admin key: the JSON lines."""
    import json

    c = http.client.HTTPConnection(harness.HOST, p.http_port, timeout=20)
    try:
        c.request("GET", "/captures/proxy:capture:api" + query, headers={"Authorization": f"Bearer {EXPORT_KEY}"})
        r = c.getresponse()
        status, body = r.status, r.read()
    finally:
        c.close()
    assert status == 200, (status, body)
    return [json.loads(line) for line in body.splitlines() if line.strip()]


def test_a_down_shadows_backlog_can_be_exported(servers, proxy, monkeypatch):
    """The capture export walks a shadow's backlog without consuming it, on either
    backend: every capture, in order, with `since` and `limit`; the shadow then gets
    them all, and the export is empty once they are replayed."""
    monkeypatch.setenv("WEIR_ADMIN_KEY", EXPORT_KEY)
    primary = servers()
    shadow_port = harness.free_port()  # down while the captures pile up
    p = proxy(primary.port, [("s", shadow_port, "")])
    for i in range(5):
        assert p.request("POST", f"/e/{i}", f"body {i}".encode())[0] == 200
    time.sleep(0.05)
    middle_ms = int(time.time() * 1000)
    time.sleep(0.05)
    for i in range(5, 8):
        assert p.request("POST", f"/e/{i}", f"body {i}".encode())[0] == 200
    wait_for(lambda: len(export(p)) == 8)
    lines = export(p)
    # In the queue's order (a capture is appended once its body has passed, so two
    # quick requests may land either way round).
    assert sorted(line["uri"] for line in lines) == [f"/e/{i}" for i in range(8)]
    assert [line["seq"] for line in lines] == sorted(line["seq"] for line in lines)
    assert all(line["method"] == "POST" for line in lines)
    since = export(p, f"?since={middle_ms}")
    assert sorted(line["uri"] for line in since) == ["/e/5", "/e/6", "/e/7"]
    assert export(p, "?limit=2") == lines[:2]
    assert export(p) == lines  # nothing was consumed
    shadow = servers(shadow_port)
    wait_for(lambda: len(shadow.paths()) >= 8)
    assert sorted(shadow.paths()) == [f"/e/{i}" for i in range(8)]
    wait_for(lambda: export(p) == [])


def test_a_recording_keeps_its_captures_and_a_new_shadow_starts_at_its_end(servers, proxy, monkeypatch):
    """`record = true` on either backend: captures stay after the shadow replayed
    them (the export shows them); a shadow added at a restart gets only what comes
    after; `flush QUEUE.record` drops the recording."""
    monkeypatch.setenv("WEIR_ADMIN_KEY", EXPORT_KEY)
    primary, s, t = servers(), servers(), servers()
    p = proxy(primary.port, [("s", s.port, "")])
    p.sigterm()
    assert p.wait_exit(15) == 0
    text = p.config.read_text().replace('name = "api"\n', 'name = "api"\nrecord = true\n', 1)
    p.config.write_text(text)
    p.start()
    for i in range(4):
        assert p.request("POST", f"/r/{i}", b"v")[0] == 200
    wait_for(lambda: len(s.paths()) >= 4)
    wait_for(lambda: len(export(p)) == 4)
    time.sleep(0.5)  # replays confirmed by now
    assert sorted(line["uri"] for line in export(p)) == [f"/r/{i}" for i in range(4)]
    p.sigterm()
    assert p.wait_exit(15) == 0
    p.config.write_text(text + f'[[proxy.routes.shadows]]\nname = "t"\nurl = "http://{harness.HOST}:{t.port}"\n')
    p.start()
    for i in range(4, 6):
        assert p.request("POST", f"/r/{i}", b"v")[0] == 200
    wait_for(lambda: len(t.paths()) >= 2 and len(s.paths()) >= 6)
    time.sleep(0.5)  # an old capture replayed to t would show by now
    assert sorted(t.paths()) == ["/r/4", "/r/5"]
    assert sorted(s.paths()) == [f"/r/{i}" for i in range(6)]
    assert sorted(line["uri"] for line in export(p)) == [f"/r/{i}" for i in range(6)]
    # The command line reads it over the HTTP port: export, and replay to a target.
    import subprocess

    url = f"http://{harness.HOST}:{p.http_port}"
    cli = lambda *args: subprocess.run(  # noqa: E731
        [str(p.binary), *args], capture_output=True, text=True, timeout=30
    )
    r = cli("capture", "export", "--queue", "proxy:capture:api", "--server", url)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 6, r.stderr
    target = servers()
    r = cli("replay", "--from", "proxy:capture:api", "--server", url, "--to", f"http://{harness.HOST}:{target.port}")
    assert r.returncode == 0, r.stderr
    assert sorted(target.paths()) == [f"/r/{i}" for i in range(6)]
    with harness.Conn(p.addr) as c:
        # The proxy's queues are its own: refused until the config allows it.
        assert c.request(b"flush proxy:capture:api.record\r\n").startswith(b"CLIENT_ERROR reserved queue")
        p.config.write_text(p.config.read_text() + "[server]\nreserved_queues_writable = true\n")
        assert c.request(b"reload\r\n") == b"Reloaded config.\r\n"
        assert c.request(b"flush proxy:capture:api.record\r\n") == b"END\r\n"
    wait_for(lambda: export(p) == [])


def test_a_recording_is_bounded_by_its_queues_max_age(servers, proxy, monkeypatch):
    """The bound a recording has on either backend: the capture queue's `age_ms_max`
    (on JetStream, which has no per-queue count or size limit, the only one)."""
    monkeypatch.setenv("WEIR_ADMIN_KEY", EXPORT_KEY)
    primary = servers()
    p = proxy(primary.port, [])
    p.sigterm()
    assert p.wait_exit(15) == 0
    text = p.config.read_text().replace('name = "api"\n', 'name = "api"\nrecord = true\n', 1)
    p.config.write_text(text + '[queues."proxy:capture:api"]\nage_ms_max = 1000\n')
    p.start()
    for i in range(3):
        assert p.request("POST", f"/a/{i}", b"v")[0] == 200
    wait_for(lambda: len(export(p)) == 3)
    # Gone within the age (whole seconds on JetStream, rounded up) and a margin.
    wait_for(lambda: export(p) == [], timeout_s=10)


@pytest.mark.parametrize("mode", ["silent", "slow-head"])
def test_idle_sockets_at_the_cap_do_not_lock_out_a_real_client(servers, proxy, mode):
    """Issue 32: 30 connections that send nothing (or trickle a head) against
    `connections_max = 20` must not keep a request from being proxied. The head
    timeout (10 s) is longer than the test: only making room at the cap (closing the
    connection idle the longest) lets the real client in."""
    primary = servers()
    p = proxy(primary.port, [], "connections_max = 20\nheader_timeout_ms = 10000\n")
    with harness.IdleSockets(p.proxy_port, 30, mode) as idle:
        time.sleep(0.3)
        for i in range(3):
            status, body, _ = harness.served_within(lambda: p.request("GET", f"/real/{i}"))
            assert (status, body) == (200, b"Hello world!")
        # Those past the cap made room by closing the oldest: at most 20 held.
        assert idle.closed() >= 10
    with urllib.request.urlopen(f"http://{harness.HOST}:{p.http_port}/metrics", timeout=5) as r:
        page = r.read().decode()
    assert 'weir_proxy_connections_evicted_total{listener="main"} ' in page, page[-2000:]
    assert p.alive()


def test_a_connection_that_sends_nothing_is_closed_after_the_head_timeout(servers, proxy):
    """Issue 32, item 3: hyper-util tells HTTP/1 from HTTP/2 by a read that had no
    deadline, so a socket that sent nothing was held for ever. With
    `header_timeout_ms = 700` it is closed within a few seconds, silent or not."""
    primary = servers()
    p = proxy(primary.port, [], "header_timeout_ms = 700\n")
    with harness.IdleSockets(p.proxy_port, 10, "silent") as silent, harness.IdleSockets(
        p.proxy_port, 10, "slow-head"
    ) as slow:
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and silent.closed() + slow.closed() < 20:
            time.sleep(0.2)
        assert (silent.closed(), slow.closed()) == (10, 10)
        assert p.request("GET", "/after")[0] == 200
    assert p.alive()
