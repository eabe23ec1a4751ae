"""The HTTP side door: /health and Prometheus /metrics on --http-listen."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from harness import Conn

pytestmark = pytest.mark.weir_only


def fetch(server, path: str) -> tuple[int, str]:
    url = f"http://127.0.0.1:{server.http_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_health(server):
    status, _body = fetch(server, "/health")
    assert status == 200


def test_metrics_prometheus_format(server):
    with Conn(server.addr) as c:
        assert c.set("metq", b"x") == b"STORED\r\n"
    status, body = fetch(server, "/metrics")
    assert status == 200
    lines = [l for l in body.splitlines() if l and not l.startswith("#")]
    assert lines, body[:500]
    for line in lines:
        name_and_labels, _, value = line.rpartition(" ")
        assert name_and_labels, line
        float(value)  # every sample line ends in a number
    assert "metq" in body, "per-queue metrics missing"


def test_unknown_path_is_404(server):
    status, _ = fetch(server, "/no-such-page")
    assert status == 404
