"""Record now, replay later, end to end: the built `weir` binary records through a
`[proxy]` route with `record = true`, `weir capture export` takes the captures over
the HTTP port, `weir capture import` puts them into a second weir, and `weir replay`
sends them to a Python HTTP server, which checks every request arrived whole.
Refusals: the admin key, bad JSON lines (named by number), a locked data directory.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import subprocess
import threading
import time

import pytest

import harness

pytestmark = [
    pytest.mark.embedded_only(reason="captures live in the embedded engine"),
    pytest.mark.weir_only,
]

KEY = "test-admin-key-0123456789"
QUEUE = "proxy:capture:api"


class Recorder:
    """A Python HTTP server recording (method, path, headers as a list, body) and
    answering 200 `ok`."""

    def __init__(self):
        self.lock = threading.Lock()
        self.got = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle_one(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with owner.lock:
                    owner.got.append((self.command, self.path, self.headers.items(), body))
                self.send_response(200)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = handle_one

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer((harness.HOST, 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def requests(self):
        with self.lock:
            return list(self.got)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class Weir(harness.ServerProcess):
    """`weir serve --config FILE` with an optional admin key and recording route."""

    def __init__(self, binary, key=KEY, primary_port=None):
        super().__init__(binary, "weir")
        self.proxy_port = harness.free_port()
        self.config = self.root / "weir.toml"
        text = f'[server]\nadmin_key = "{key}"\n' if key else ""
        if primary_port is not None:
            text += (
                "[[proxy.listen]]\n"
                'name = "main"\n'
                f'addr = "{harness.HOST}:{self.proxy_port}"\n'
                "[[proxy.routes]]\n"
                'name = "api"\n'
                f'targets = ["http://{harness.HOST}:{primary_port}"]\n'
                "record = true\n"
            )
        self.config.write_text(text)

    def argv(self):
        return super().argv() + ["--config", str(self.config)]

    @property
    def url(self):
        return f"http://{harness.HOST}:{self.http_port}"

    def http(self, method, path, body=None, headers=None):
        c = http.client.HTTPConnection(harness.HOST, self.http_port, timeout=10)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def through_proxy(self, method, path, headers, body):
        c = http.client.HTTPConnection(harness.HOST, self.proxy_port, timeout=10)
        try:
            c.request(method, path, body=body, headers=headers)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()


@pytest.fixture
def recorders():
    made = []

    def make():
        r = Recorder()
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


@pytest.fixture
def weirs(server_bin):
    made = []

    def make(**kw):
        w = Weir(server_bin, **kw)
        made.append(w)
        return w.start()

    yield make
    for w in made:
        w.stop()


def weir_cli(server_bin, *args, key=KEY, timeout=30):
    env = dict(os.environ)
    env.pop("WEIR_ADMIN_KEY", None)
    if key is not None:
        env["WEIR_ADMIN_KEY"] = key
    return subprocess.run(
        [str(server_bin), *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def request(i):
    """Request i of the recording: methods, paths, queries, headers and bodies that
    differ; bodies not UTF-8."""
    method = ["GET", "POST", "PUT", "DELETE", "PATCH"][i % 5]
    path = f"/orders/{i}?page={i}&q=a%20b"
    headers = {"x-test": f"t{i}", "cookie": f"session=s{i}", "authorization": f"Bearer tok{i}"}
    body = b"" if method in ("GET", "DELETE") else f"payload {i} ".encode() + bytes([0, 255, 10, i])
    return method, path, headers, body


def record(w, n):
    for i in range(n):
        method, path, headers, body = request(i)
        assert w.through_proxy(method, path, headers, body)[0] == 200


def export_lines(w, key=KEY):
    status, body = w.http("GET", f"/captures/{QUEUE}", headers={"authorization": f"Bearer {key}"})
    assert status == 200, body
    return [json.loads(line) for line in body.splitlines() if line.strip()]


def check_replayed(got, n, port, base=""):
    """Every request 0..n-1 arrived once, whole, with the replay's Host and tag."""
    assert len(got) == n, [g[1] for g in got]
    by_path = {g[1]: g for g in got}
    for i in range(n):
        method, path, headers, body = request(i)
        g = by_path[base + path]
        assert g[0] == method and g[3] == body, (i, g)
        h = {}
        for k, v in g[2]:
            h.setdefault(k.lower(), []).append(v)
        for k, v in headers.items():
            assert h[k] == [v], (k, h)
        assert h["host"] == [f"{harness.HOST}:{port}"]
        assert h["x-weir-replay"] == ["replay"]


def summary(stdout):
    """The replay's summary line as a dict: sent, 2xx, failed..."""
    line = [l for l in stdout.splitlines() if l.startswith("replay to ")][-1]
    fields = line.split(": ", 1)[1].split(", ")
    out = {}
    for f in fields:
        k, v = f.rsplit(" ", 1) if not f.startswith("elapsed") else ("elapsed", f.split()[1])
        out[k] = float(v) if k == "elapsed" else int(v)
    return out


def record_reader_items(w, queue):
    """`weir_reader_items` of the queue's `record` reader on `/metrics`; None without one."""
    status, body = w.http("GET", "/metrics")
    assert status == 200, body
    prefix = f'weir_reader_items{{queue="{queue}",reader="record"}} '
    for line in body.decode().splitlines():
        if line.startswith(prefix):
            return int(line[len(prefix):])
    return None


def test_record_export_import_and_replay(server_bin, weirs, recorders, tmp_path):
    primary = recorders()
    w1 = weirs(primary_port=primary.port)
    n = 20
    record(w1, n)
    assert harness.wait_for(lambda: len(export_lines(w1)) == n, 10), export_lines(w1)
    assert len(primary.requests()) == n
    # Export over the HTTP port; nothing is consumed by it.
    out = tmp_path / "capture.jsonl"
    r = weir_cli(server_bin, "capture", "export", "--queue", QUEUE, "--server", w1.url, "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert f"exported {n} captures" in r.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [l["seq"] for l in lines] == list(range(1, n + 1))
    assert out.stat().st_mode & 0o777 == 0o600  # it holds clients' credentials
    assert not (tmp_path / "capture.jsonl.partial").exists()
    assert lines[2]["method"] == "PUT" and lines[2]["uri"] == request(2)[1]
    assert len(export_lines(w1)) == n
    # Import into a second weir (no proxy there), then its export says the same.
    w2 = weirs()
    r = weir_cli(server_bin, "capture", "import", "--queue", "api", "--server", w2.url, "--in", str(out))
    assert r.returncode == 0, r.stderr
    assert f"imported {n} captures into {QUEUE}" in r.stderr
    again = export_lines(w2)
    strip = lambda ls: [{k: v for k, v in l.items() if k != "seq"} for l in ls]
    assert strip(again) == strip(lines)
    # What is imported is kept by the queue's `record` reader, as a recording's is
    # (the same on either backend).
    assert record_reader_items(w2, QUEUE) == n
    # Replay from the second weir's queue at speed 50, then from the file at a rate.
    target = recorders()
    r = weir_cli(
        server_bin, "replay", "--from", QUEUE, "--server", w2.url,
        "--to", f"http://{harness.HOST}:{target.port}/base", "--speed", "50",
    )
    assert r.returncode == 0, r.stderr
    s = summary(r.stdout)
    assert (s["sent"], s["2xx"], s["failed"]) == (n, n, 0), r.stdout
    check_replayed(target.requests(), n, target.port, base="/base")
    target = recorders()
    r = weir_cli(
        server_bin, "replay", "--from-file", str(out), "--to", f"http://{harness.HOST}:{target.port}",
        "--rate", "40", "--concurrency", "1",
    )
    assert r.returncode == 0, r.stderr
    s = summary(r.stdout)
    assert (s["sent"], s["2xx"], s["failed"]) == (n, n, 0), r.stdout
    assert s["elapsed"] >= (n - 1) / 40 - 0.02, s
    got = target.requests()
    check_replayed(got, n, target.port)
    assert [g[1] for g in got] == [request(i)[1] for i in range(n)]  # concurrency 1: in order


def test_speed_keeps_the_captured_gaps_and_failures_exit_non_zero(server_bin, recorders, tmp_path):
    capture = tmp_path / "gaps.jsonl"
    lines = [
        {"method": "GET", "uri": f"/g/{i}", "headers": [["x-i", str(i)]], "at_ms": 1_000_000 + 500 * i, "body": ""}
        for i in range(3)
    ]
    capture.write_text("".join(json.dumps(l) + "\n" for l in lines))
    target = recorders()
    started = time.monotonic()
    r = weir_cli(server_bin, "replay", "--from-file", str(capture), "--to", f"http://{harness.HOST}:{target.port}", "--speed", "2")
    elapsed = time.monotonic() - started
    assert r.returncode == 0, r.stderr
    assert elapsed >= 0.5 and summary(r.stdout)["elapsed"] >= 0.49, (elapsed, r.stdout)
    assert sorted(g[1] for g in target.requests()) == ["/g/0", "/g/1", "/g/2"]
    # A target that is down: every request fails, the command says so and exits 1.
    r = weir_cli(server_bin, "replay", "--from-file", str(capture), "--to", f"http://{harness.HOST}:{harness.free_port()}")
    assert r.returncode == 1
    s = summary(r.stdout)
    assert (s["sent"], s["failed"]) == (3, 3)
    assert "3 of 3 requests failed" in r.stderr
    # Flags that cannot work are refused before anything is sent.
    for bad in (["--rate", "0"], ["--speed", "-1"], ["--concurrency", "0"], ["--rate", "5", "--speed", "2"]):
        r = weir_cli(server_bin, "replay", "--from-file", str(capture), "--to", f"http://{harness.HOST}:{target.port}", *bad)
        assert r.returncode != 0, bad
    assert len(target.requests()) == 3


def test_the_admin_key_guards_the_capture_endpoints(server_bin, weirs, recorders, monkeypatch):
    primary = recorders()
    monkeypatch.delenv("WEIR_ADMIN_KEY", raising=False)
    off = weirs(key=None, primary_port=primary.port)
    status, body = off.http("GET", f"/captures/{QUEUE}")
    assert status == 403 and b"no admin key" in body, body
    r = weir_cli(server_bin, "capture", "export", "--queue", QUEUE, "--server", off.url)
    assert r.returncode == 1 and "no admin key" in r.stderr, r.stderr
    on = weirs(primary_port=primary.port)
    record(on, 2)
    for headers, reason in (
        ({}, b"Authorization: Bearer"),
        ({"authorization": "Bearer wrong-key-wrong-key"}, b"wrong admin key"),
        ({"authorization": f"Basic {KEY}"}, b"Authorization: Bearer"),
    ):
        status, body = on.http("GET", f"/captures/{QUEUE}", headers=headers)
        assert status == 401 and reason in body, (headers, status, body)
    status, body = on.http("POST", f"/captures/{QUEUE}", body=b"{}\n", headers={"authorization": "Bearer nope"})
    assert status == 401
    status, body = on.http("GET", "/captures/jobs", headers={"authorization": f"Bearer {KEY}"})
    assert status == 404 and b"only capture queues" in body
    status, body = on.http("GET", f"/captures/{QUEUE}?limit=0", headers={"authorization": f"Bearer {KEY}"})
    assert status == 400 and b"limit" in body
    r = weir_cli(server_bin, "capture", "export", "--queue", QUEUE, "--server", on.url, key="wrong-key-wrong-key")
    assert r.returncode == 1 and "401" in r.stderr and "wrong admin key" in r.stderr, r.stderr
    r = weir_cli(server_bin, "capture", "export", "--queue", QUEUE, "--server", on.url, key=None)
    assert r.returncode == 1 and "WEIR_ADMIN_KEY" in r.stderr, r.stderr
    # The key may come from the environment; one too short stops weir with a reason.
    monkeypatch.setenv("WEIR_ADMIN_KEY", KEY)
    from_env = weirs(key=None)
    assert from_env.http("GET", f"/captures/{QUEUE}", headers={"authorization": f"Bearer {KEY}"})[0] == 404
    monkeypatch.setenv("WEIR_ADMIN_KEY", "short")
    r = weir_cli(server_bin, "serve", "--data-dir", str(from_env.root / "other"), "--listen", f"{harness.HOST}:0",
                 "--http-listen", f"{harness.HOST}:0", key="short")
    assert r.returncode == 1 and "admin_key" in r.stderr, r.stderr


def test_bad_lines_are_refused_with_their_number_and_nothing_is_imported(server_bin, weirs, recorders, tmp_path):
    w = weirs()
    auth = {"authorization": f"Bearer {KEY}"}
    good = json.dumps({"method": "GET", "uri": "/a", "headers": [], "at_ms": 1, "body": ""})
    body = (good + "\n" + good + "\n" + '{"method": "GET", "uri": "no-slash", "at_ms": 1}\n').encode()
    status, answer = w.http("POST", f"/captures/{QUEUE}", body=body, headers=auth)
    assert status == 400, answer
    answer = json.loads(answer)
    assert answer["line"] == 3 and "line 3: uri" in answer["error"] and "nothing was imported" in answer["error"]
    assert w.http("GET", f"/captures/{QUEUE}", headers=auth)[0] == 404  # not even created
    status, answer = w.http("POST", f"/captures/{QUEUE}", body=b"not json\n", headers=auth)
    assert status == 400 and json.loads(answer)["line"] == 1
    # The command line checks the whole file first, and says which line.
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good + "\n\n" + good.replace('"body": ""', '"body": "%%%"') + "\n")
    r = weir_cli(server_bin, "capture", "import", "--queue", QUEUE, "--server", w.url, "--in", str(bad))
    assert r.returncode == 1 and "line 3: body: not base64" in r.stderr and "nothing was imported" in r.stderr, r.stderr
    target = recorders()
    r = weir_cli(server_bin, "replay", "--from-file", str(bad), "--to", f"http://{harness.HOST}:{target.port}")
    assert r.returncode == 1 and "line 3" in r.stderr and "nothing was replayed" in r.stderr, r.stderr
    assert target.requests() == []
    assert w.http("GET", f"/captures/{QUEUE}", headers=auth)[0] == 404
    # A body declared over the import limit is refused before it is read (413).
    with harness.Conn((harness.HOST, w.http_port)) as c:
        c.send(
            f"POST /captures/{QUEUE} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n"
            f"content-length: {33 * 1024 * 1024}\r\n\r\n".encode()
        )
        assert c.read_line(10).startswith(b"HTTP/1.1 413"), "no 413"
    # A good body goes in, all of it.
    status, answer = w.http("POST", f"/captures/{QUEUE}", body=(good + "\n") * 3, headers=auth)
    assert status == 200 and json.loads(answer)["imported"] == 3
    assert len(export_lines(w)) == 3


def test_data_dir_is_for_a_stopped_weir(server_bin, weirs, recorders, tmp_path):
    primary = recorders()
    w = weirs(primary_port=primary.port)
    record(w, 4)
    assert harness.wait_for(lambda: len(export_lines(w)) == 4, 10)
    r = weir_cli(server_bin, "capture", "export", "--queue", QUEUE, "--data-dir", str(w.data_dir))
    assert r.returncode == 1, r.stderr
    assert "in use by a running weir" in r.stderr and "--server" in r.stderr, r.stderr
    r = weir_cli(server_bin, "replay", "--from", QUEUE, "--data-dir", str(w.data_dir), "--to", "http://127.0.0.1:1")
    assert r.returncode == 1 and "--server" in r.stderr, r.stderr
    status, served = w.http("GET", f"/captures/{QUEUE}?since=0&limit=3", headers={"authorization": f"Bearer {KEY}"})
    assert status == 200, served
    w.sigterm()
    assert w.wait_exit(15) == 0
    # Stopped: the command line opens the directory itself.
    out = tmp_path / "dir.jsonl"
    r = weir_cli(server_bin, "capture", "export", "--queue", QUEUE, "--data-dir", str(w.data_dir), "--out", str(out), "--since", "1h")
    assert r.returncode == 0, r.stderr
    assert len(out.read_text().splitlines()) == 4
    # The same walk as the running weir's endpoint: the same bytes, line for line.
    r = weir_cli(server_bin, "capture", "export", "--queue", QUEUE, "--data-dir", str(w.data_dir), "--since", "0", "--limit", "3")
    assert r.returncode == 0 and "exported 3 captures from " + QUEUE in r.stderr, r.stderr
    assert r.stdout.encode() == served and len(served.splitlines()) == 3
    r = weir_cli(server_bin, "capture", "export", "--queue", "nope", "--data-dir", str(w.data_dir))
    assert r.returncode == 1 and f"no queue proxy:capture:nope in {w.data_dir}" in r.stderr, r.stderr
    r = weir_cli(server_bin, "replay", "--from", "nope", "--data-dir", str(w.data_dir), "--to", "http://127.0.0.1:1")
    assert r.returncode == 1 and f"no queue proxy:capture:nope in {w.data_dir}" in r.stderr, r.stderr
    r = weir_cli(server_bin, "capture", "import", "--queue", "copy", "--data-dir", str(w.data_dir), "--in", str(out))
    assert r.returncode == 0 and "imported 4 captures into proxy:capture:copy" in r.stderr, r.stderr
    # The same import as through a running weir: kept by a `record` reader.
    w.start()
    assert record_reader_items(w, "proxy:capture:copy") == 4
    w.sigterm()
    assert w.wait_exit(15) == 0
    target = recorders()
    r = weir_cli(server_bin, "replay", "--from", "copy", "--data-dir", str(w.data_dir), "--to", f"http://{harness.HOST}:{target.port}")
    assert r.returncode == 0, r.stderr
    check_replayed(target.requests(), 4, target.port)
    # A time in the future selects nothing; a missing directory is named.
    r = weir_cli(server_bin, "capture", "export", "--queue", QUEUE, "--data-dir", str(w.data_dir), "--since", "2999-01-01T00:00:00Z")
    assert r.returncode == 0 and r.stdout == "" and "exported 0 captures" in r.stderr, r.stderr
    r = weir_cli(server_bin, "capture", "export", "--queue", QUEUE, "--data-dir", str(tmp_path / "nowhere"))
    assert r.returncode == 1 and "no data directory" in r.stderr


def test_weir_proxy_serves_the_capture_endpoints_with_http_listen(server_bin, recorders, tmp_path):
    primary = recorders()
    port, http_port = harness.free_port(), harness.free_port()
    config = tmp_path / "proxy.toml"
    config.write_text(
        f'[server]\nadmin_key = "{KEY}"\n'
        "[[proxy.listen]]\n"
        'name = "main"\n'
        f'addr = "{harness.HOST}:{port}"\n'
        "[[proxy.routes]]\n"
        'name = "api"\n'
        f'targets = ["http://{harness.HOST}:{primary.port}"]\n'
        "record = true\n"
    )
    argv = [str(server_bin), "proxy", "--config", str(config), "--data-dir", str(tmp_path / "data"),
            "--http-listen", f"{harness.HOST}:{http_port}"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def up():
            try:
                c = http.client.HTTPConnection(harness.HOST, http_port, timeout=2)
                c.request("GET", "/health")
                ok = c.getresponse().status == 200
                c.close()
                return ok
            except OSError:
                return False

        assert harness.wait_for(up, 20), "weir proxy did not start"
        for i in range(3):
            c = http.client.HTTPConnection(harness.HOST, port, timeout=5)
            c.request("POST", f"/p/{i}", body=f"b{i}".encode())
            assert c.getresponse().status == 200
            c.close()
        url = f"http://{harness.HOST}:{http_port}"

        def exported():
            r = weir_cli(server_bin, "capture", "export", "--queue", QUEUE, "--server", url)
            return r.returncode == 0 and len(r.stdout.splitlines()) == 3

        assert harness.wait_for(exported, 10)
        proc.send_signal(15)
        assert proc.wait(timeout=15) == 0, proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
