"""Replays to a shadow that is deploying, closing connections, rate limiting or
failing some requests: every replay is delivered once the shadow answers again, or
kept as a dead letter that a re-drive delivers later; replays resume within about a
second of the shadow's return; and a replay carries the headers the primary got.
"""

from __future__ import annotations

import collections
import http.client
import http.server
import json
import socket
import threading
import time

import pytest

import harness
from test_proxy import ProxyServer

pytestmark = [pytest.mark.weir_only]

ADMIN_KEY = "shadow-delivery-test-key-0123456789"


class Shadow:
    """A shadow whose answers the test steers: `answer(method, path)` gives a status
    and extra headers, or None to close the connection without an answer. Every
    request is recorded with its time and what it was answered."""

    def __init__(self, port=0):
        self.lock = threading.Lock()
        self.got = []  # (time, method, path, headers, body, status or None)
        self.answer = lambda method, path: (200, {})
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle_one(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                got = owner.answer(self.command, self.path)
                status = None if got is None else got[0]
                with owner.lock:
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    owner.got.append((time.monotonic(), self.command, self.path, headers, body, status))
                if got is None:
                    self.close_connection = True
                    return
                payload = b"" if self.command == "HEAD" else b"ok"
                self.send_response(status)
                for k, v in got[1].items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_HEAD = handle_one

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer((harness.HOST, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def replays(self):
        """The replays (not probes) received: (time, path, status)."""
        with self.lock:
            return [(g[0], g[2], g[5]) for g in self.got if g[1] != "HEAD"]

    def delivered(self):
        """Per path, how many replays were answered 200."""
        return collections.Counter(p for _, p, s in self.replays() if s == 200)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class Primary(Shadow):
    pass


@pytest.fixture
def made():
    things = []
    yield things
    for t in things:
        t.close() if not isinstance(t, ProxyServer) else t.stop()


def start_proxy(server_bin, made, primary_port, shadow_port, shadow_extra="", route_extra=""):
    p = ProxyServer(server_bin, primary_port, [("s", shadow_port, shadow_extra)])
    if route_extra:
        text = p.config.read_text()
        at = text.index("[[proxy.routes.shadows]]")
        p.config.write_text(text[:at] + route_extra + text[at:])
    made.append(p)
    return p.start()


def wait_for(predicate, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def metric(p, series: str) -> int | None:
    c = http.client.HTTPConnection(harness.HOST, p.http_port, timeout=10)
    try:
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
    finally:
        c.close()
    for line in text.splitlines():
        if line.startswith(series + " "):
            return int(line.split()[-1])
    return None


def send(p, n, prefix):
    for i in range(n):
        status, _, _ = p.request("POST", f"{prefix}/{i}", f"b{i}".encode())
        assert status == 200


def assert_each_delivered_once(shadow, paths):
    delivered = shadow.delivered()
    assert {p: delivered[p] for p in paths} == {p: 1 for p in paths}, delivered


def test_a_shadow_answering_503_while_it_deploys_gets_every_replay_once_back(server_bin, made):
    primary, shadow = Primary(), Shadow()
    made += [primary, shadow]
    deploying = threading.Event()
    deploying.set()
    shadow.answer = lambda m, path: (503, {}) if deploying.is_set() else (200, {})
    p = start_proxy(server_bin, made, primary.port, shadow.port)
    send(p, 40, "/d")
    wait_for(lambda: len(shadow.replays()) >= 1)
    time.sleep(3)
    back = time.monotonic()
    deploying.clear()
    paths = [f"/d/{i}" for i in range(40)]
    wait_for(lambda: set(shadow.delivered()) >= set(paths))
    time.sleep(1)  # no late duplicate
    assert_each_delivered_once(shadow, paths)
    first = min(t for t, _, s in shadow.replays() if s == 200)
    print(f"resumed {first - back:.2f} s after the shadow answered 200 again")
    assert first - back < 2.5
    assert metric(p, 'weir_proxy_replays_failed_total{route="api",shadow="s"}') == 0


def test_a_shadow_that_accepts_then_closes_gets_its_replays_retried(server_bin, made):
    primary, shadow = Primary(), Shadow()
    made += [primary, shadow]
    closing = threading.Event()
    closing.set()
    shadow.answer = lambda m, path: None if closing.is_set() else (200, {})
    p = start_proxy(server_bin, made, primary.port, shadow.port, "retries = 2\n")
    send(p, 20, "/c")
    wait_for(lambda: len(shadow.replays()) >= 1)
    time.sleep(2)
    closing.clear()
    paths = [f"/c/{i}" for i in range(20)]
    wait_for(lambda: set(shadow.delivered()) >= set(paths))
    assert_each_delivered_once(shadow, paths)
    closed = {path for _, path, status in shadow.replays() if status is None}
    assert closed and closed <= set(paths)


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_honoured(server_bin, made, status):
    primary, shadow = Primary(), Shadow()
    made += [primary, shadow]
    told = threading.Event()

    def answer(method, path):
        if method == "GET" and not told.is_set():
            told.set()
            return status, {"Retry-After": "2"}
        return 200, {}

    shadow.answer = answer
    p = start_proxy(server_bin, made, primary.port, shadow.port, "concurrency = 1\n")
    assert p.request("GET", "/later", b"")[0] == 200
    wait_for(lambda: shadow.delivered()["/later"] == 1)
    times = [t for t, path, _ in shadow.replays() if path == "/later"]
    assert len(times) == 2
    assert times[1] - times[0] >= 1.9, times


def redrive(p, route="api", shadow="s"):
    c = http.client.HTTPConnection(harness.HOST, p.http_port, timeout=10)
    try:
        c.request(
            "POST",
            f"/proxy/dead-letters/{route}/{shadow}/redrive",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        )
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"{}")
    finally:
        c.close()


def export_dead(p):
    c = http.client.HTTPConnection(harness.HOST, p.http_port, timeout=10)
    try:
        c.request(
            "GET", "/captures/proxy:capture:api:dead:s", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        )
        r = c.getresponse()
        body = r.read()
        assert r.status == 200, body
        return [json.loads(line) for line in body.splitlines() if line.strip()]
    finally:
        c.close()


def test_replays_out_of_attempts_are_dead_letters_that_a_redrive_delivers(server_bin, made, monkeypatch):
    monkeypatch.setenv("WEIR_ADMIN_KEY", ADMIN_KEY)
    primary, shadow = Primary(), Shadow()
    made += [primary, shadow]
    broken = threading.Event()
    broken.set()
    shadow.answer = lambda m, path: (500, {}) if path.startswith("/poison") and broken.is_set() else (200, {})
    p = start_proxy(
        server_bin, made, primary.port, shadow.port, "attempts_max = 3\nretry_backoff_ms = 50\n"
    )
    assert redrive(p, shadow="nope")[0] == 404
    send(p, 2, "/poison")
    send(p, 3, "/fine")
    failed = 'weir_proxy_replays_failed_total{route="api",shadow="s"}'
    wait_for(lambda: metric(p, failed) == 2)
    wait_for(lambda: metric(p, 'weir_proxy_replay_dead_letters{route="api",shadow="s"}') == 2)
    assert_each_delivered_once(shadow, [f"/fine/{i}" for i in range(3)])
    attempts = collections.Counter(path for _, path, _ in shadow.replays() if path.startswith("/poison"))
    assert attempts == {"/poison/0": 3, "/poison/1": 3}
    dead = export_dead(p)
    assert sorted(d["uri"] for d in dead) == ["/poison/0", "/poison/1"]
    assert {d["body"] for d in dead} == {"YjA=", "YjE="}
    # Dead letters outlive a restart.
    p.kill9()
    p.start()
    broken.clear()
    status, body = redrive(p)
    assert (status, body["redriving"]) == (200, 2), body
    wait_for(lambda: shadow.delivered()["/poison/1"] == 1 and shadow.delivered()["/poison/0"] == 1)
    wait_for(lambda: metric(p, 'weir_proxy_replay_dead_letters{route="api",shadow="s"}') == 0)
    assert export_dead(p) == []
    time.sleep(0.5)
    assert_each_delivered_once(shadow, ["/poison/0", "/poison/1"] + [f"/fine/{i}" for i in range(3)])


def test_replay_resumes_within_seconds_of_a_down_shadows_return(server_bin, made):
    """A shadow that refused connections for 13 s (long enough for a doubling pause
    to reach several seconds) is replayed to within about a second of its return."""
    primary = Primary()
    made.append(primary)
    placeholder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    placeholder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    placeholder.bind((harness.HOST, 0))
    port = placeholder.getsockname()[1]
    p = start_proxy(server_bin, made, primary.port, port)
    send(p, 5, "/r")
    time.sleep(13)
    placeholder.close()
    shadow = Shadow(port)
    made.append(shadow)
    back = time.monotonic()
    wait_for(lambda: set(shadow.delivered()) >= {f"/r/{i}" for i in range(5)})
    first = min(t for t, _, s in shadow.replays() if s == 200)
    print(f"resumed {first - back:.2f} s after the shadow listened again")
    assert first - back < 2.5


def test_a_replay_carries_the_headers_the_primary_got(server_bin, made):
    primary, shadow = Primary(), Shadow()
    made += [primary, shadow]
    route = (
        "preserve_host = true\n"
        'remove_headers = ["x-secret"]\n'
        'remove_query = ["debug"]\n'
        "[proxy.routes.set_headers]\n"
        'x-environment = "production"\n'
        "[proxy.routes.set_query]\n"
        'source = "proxy"\n'
    )
    p = start_proxy(server_bin, made, primary.port, shadow.port, route_extra=route)
    c = http.client.HTTPConnection(harness.HOST, p.proxy_port, timeout=10)
    c.request(
        "POST",
        "/h?debug=1&a=2",
        body=b"hello",
        headers={
            "Host": "api.example.com",
            "X-Forwarded-For": "203.0.113.9",
            "Forwarded": "for=203.0.113.9",
            "X-Secret": "s3cret",
            "X-Custom": "kept",
        },
    )
    assert c.getresponse().status == 200
    c.close()
    wait_for(lambda: shadow.delivered()["/h?a=2&source=proxy"] == 1)
    with primary.lock, shadow.lock:
        (_, _, p_path, p_headers, _, _) = primary.got[0]
        (_, _, s_path, s_headers, _, _) = next(g for g in shadow.got if g[1] == "POST")
    assert p_path == s_path == "/h?a=2&source=proxy"
    assert p_headers["x-forwarded-for"] == "203.0.113.9, 127.0.0.1"
    assert p_headers["x-environment"] == "production"
    assert "x-secret" not in p_headers
    assert s_headers.pop("x-weir-replay") == "api/s"
    assert s_headers == p_headers
