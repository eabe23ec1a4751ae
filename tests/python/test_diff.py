"""Response diffing end to end, with the built `weir` binary and Python servers: a
primary and a reference of one version (they differ only in a timestamp), a candidate
that changes one JSON field. `weir diff report` (over the HTTP port, with the admin
key) names exactly that field; the timestamp is learned as noise; /metrics counts it;
a wrong key is refused.
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

# On either backend (WEIR_TEST_BACKEND): on JetStream the captures live in the test's
# stream, and the report comes from the proxy's memory as on the engine.
pytestmark = [pytest.mark.weir_only]

KEY = "test-admin-key-0123456789"


class Service:
    """A JSON service of version `version`: `{"path", "version", "ts", "items"}`,
    `ts` different on every answer."""

    def __init__(self, version):
        self.count = 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                owner.count += 1
                body = json.dumps(
                    {
                        "path": self.path,
                        "version": version,
                        "ts": f"{time.time_ns()}-{owner.count}",
                        "items": [{"id": 1}, {"id": 2}],
                    }
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer((harness.HOST, 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class Weir(harness.ServerProcess):
    def __init__(self, binary, primary, reference, candidate):
        super().__init__(binary, "weir")
        self.proxy_port = harness.free_port()
        self.config = self.root / "weir.toml"
        h = harness.HOST
        # On JetStream, the harness's own settings (short leases) come first.
        self.config.write_text(
            (self.config_toml or "")
            + f'[server]\nadmin_key = "{KEY}"\n'
            f'[[proxy.listen]]\nname = "main"\naddr = "{h}:{self.proxy_port}"\n'
            f'[[proxy.routes]]\nname = "api"\ntargets = ["http://{h}:{primary}"]\n'
            f'reference = "http://{h}:{reference}"\n'
            f'[[proxy.routes.shadows]]\nname = "candidate"\nurl = "http://{h}:{candidate}"\n'
            "diff = true\n"
        )

    def argv(self):
        return super().argv() + ["--config", str(self.config)]

    def get(self, port, path, headers=None):
        c = http.client.HTTPConnection(harness.HOST, port, timeout=10)
        try:
            c.request("GET", path, headers=headers or {})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()


@pytest.fixture
def setup(server_bin):
    services = [Service("v1"), Service("v1"), Service("v2")]
    w = Weir(server_bin, *(s.port for s in services)).start()
    yield w, services
    w.stop()
    for s in services:
        s.close()


def diff_cli(server_bin, w, *extra, key=KEY):
    env = dict(os.environ)
    env.pop("WEIR_ADMIN_KEY", None)
    return subprocess.run(
        [str(server_bin), "diff", "report", "--server", f"http://{harness.HOST}:{w.http_port}",
         "--key", key, *extra],
        capture_output=True, text=True, timeout=30, env=env,
    )


def test_the_changed_field_is_reported_and_the_timestamp_is_noise(server_bin, setup):
    w, (primary, reference, candidate) = setup
    for i in range(5):
        status, body = w.get(w.proxy_port, f"/items/{i}")
        assert status == 200 and json.loads(body)["version"] == "v1"
    deadline = time.monotonic() + 15
    while True:
        r = diff_cli(server_bin, w, "--json")
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        if report and report[0]["shadows"][0]["compared"] == 5:
            break
        assert time.monotonic() < deadline, report
        time.sleep(0.1)
    route = report[0]
    assert route["route"] == "api" and route["reference"] is True
    assert route["noise_fields"] == ["body.ts"]
    shadow = route["shadows"][0]
    assert shadow["shadow"] == "candidate"
    assert (shadow["different"], shadow["same"], shadow["skipped"]) == (5, 0, 0)
    assert list(shadow["fields"]) == ["body.version"]
    changed = shadow["fields"]["body.version"]["changed"]
    assert changed["count"] == 5
    assert changed["samples"][-1]["primary"] == '"v1"'
    assert changed["samples"][-1]["shadow"] == '"v2"'
    assert reference.count == 5, "the reference was asked about each differing answer"
    text = diff_cli(server_bin, w)
    assert text.returncode == 0, text.stderr
    assert "body.version changed: 5" in text.stdout, text.stdout
    assert "noise: body.ts" in text.stdout
    status, metrics = w.get(w.http_port, "/metrics")
    assert status == 200
    assert (
        'weir_proxy_diffs_total{route="api",shadow="candidate",field="body.version",'
        'kind="changed"} 5' in metrics.decode()
    )


def test_the_report_wants_the_admin_key(server_bin, setup):
    w, _ = setup
    r = diff_cli(server_bin, w, key="wrong-key-0123456789abc")
    assert r.returncode != 0
    assert "401" in r.stderr and "wrong admin key" in r.stderr, r.stderr
    status, body = w.get(w.http_port, "/proxy/diffs")
    assert status == 401, body


def test_captures_import_and_export_on_either_backend(setup):
    """An import appends a file's captures (all or nothing on the engine; on JetStream
    kept by the queue's `record` reader, one publish each), a bad line imports nothing,
    and an export gives back what was imported, in order."""
    w, _ = setup
    queue = "proxy:capture:imported"

    def call(method, body=None):
        c = http.client.HTTPConnection(harness.HOST, w.http_port, timeout=10)
        try:
            c.request(method, f"/captures/{queue}", body=body, headers={"Authorization": f"Bearer {KEY}"})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    lines = [json.dumps({"method": "GET", "uri": f"/a{i}", "headers": [], "at_ms": 1000 + i, "body": ""}) for i in range(3)]
    status, body = call("POST", ("\n".join(lines) + "\n").encode())
    assert status == 200, body
    assert json.loads(body)["imported"] == 3
    bad = (lines[0] + "\n" + '{"method": "GET", "uri": "no-slash", "at_ms": 1}\n').encode()
    status, body = call("POST", bad)
    assert status == 400 and json.loads(body)["line"] == 2, body
    status, body = call("GET")
    assert status == 200, body
    exported = [json.loads(l) for l in body.decode().splitlines()]
    assert [e["uri"] for e in exported] == ["/a0", "/a1", "/a2"], exported
