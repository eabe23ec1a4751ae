"""The HTTP side door: /health and Prometheus /metrics on --http-listen."""

from __future__ import annotations

import time
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


def weir_with_config(make_server, toml: str):
    server = make_server()
    path = server.root / "weir.toml"
    path.write_text(toml)
    base = server.argv
    server.argv = lambda: base() + ["--config", str(path)]
    return server.start()


def http_probe(server, request: bytes = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n") -> bytes:
    import socket

    with socket.create_connection((server.addr[0], server.http_port), timeout=5) as s:
        s.sendall(request)
        return s.recv(4096)


@pytest.mark.weir_only
def test_http_connections_are_capped_and_half_sent_headers_time_out(make_server):
    import socket
    import time

    server = weir_with_config(
        make_server, "[server]\nhttp_connections_max = 20\nhttp_header_timeout_ms = 700\n"
    )
    held = []
    try:
        for _ in range(60):
            s = socket.create_connection((server.addr[0], server.http_port), timeout=5)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never finished
            held.append(s)
        time.sleep(0.3)

        def closed(s) -> bool:
            s.settimeout(0.05)
            try:
                return s.recv(4096) == b""
            except socket.timeout:
                return False
            except OSError:
                return True

        refused = sum(closed(s) for s in held)
        # Past the cap they are closed at once; the 20 within it wait for their heads.
        assert refused >= 35, refused
        time.sleep(1.0)
        # The header deadline closes the others (hyper may answer 408 first).
        still = [s for s in held if not closed(s)]
        assert not still, f"{len(still)} half-sent requests still held"
        assert b"200 OK" in http_probe(server)
    finally:
        for s in held:
            s.close()
    assert server.alive()


@pytest.mark.parametrize("mode", ["silent", "slow-head"])
def test_idle_sockets_at_the_cap_do_not_lock_out_a_real_client(make_server, mode):
    """Issue 32: 30 connections that send nothing (or trickle a head) against
    `http_connections_max = 20` must not keep `/health` from being served. The head
    timeout (10 s) is longer than the test: only making room at the cap (closing the
    connection idle the longest) lets the real client in."""
    import harness

    server = weir_with_config(
        make_server, "[server]\nhttp_connections_max = 20\nhttp_header_timeout_ms = 10000\n"
    )
    with harness.IdleSockets(server.http_port, 30, mode) as idle:
        time.sleep(0.3)
        for _ in range(3):
            status, _ = harness.served_within(lambda: fetch(server, "/health"))
            assert status == 200
        status, body = harness.served_within(lambda: fetch(server, "/metrics"))
        assert status == 200
        evicted = [l for l in body.splitlines() if l.startswith("weir_http_connections_evicted_total ")]
        assert evicted and int(evicted[0].split()[1]) >= 10, evicted
        # Those past the cap made room by closing the oldest: at most 20 held.
        assert idle.closed() >= 10
    assert server.alive()


def test_a_request_in_flight_at_sigterm_is_answered_within_the_grace(make_server):
    """On a stop the HTTP port answers a request in flight if it is done within its
    grace (2 s, like the bus's and the proxy's): here an import whose body comes 1.5 s
    after the SIGTERM. The server used to wait 1 s for the HTTP port, then exit."""
    import socket

    key = "k" * 16
    server = weir_with_config(make_server, f'[server]\nadmin_key = "{key}"\n')
    s = socket.create_connection((server.addr[0], server.http_port), timeout=5)
    try:
        s.sendall(
            b"POST /captures/proxy:capture:drain HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {key}\r\n".encode()
            + b"Content-Length: 3\r\nConnection: close\r\n\r\n{"
        )
        time.sleep(0.3)
        server.sigterm()
        time.sleep(1.5)
        s.sendall(b"}\n")
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
        # The body is not a capture: refused, but answered.
        assert answer.startswith(b"HTTP/1.1 "), answer
    finally:
        s.close()
    assert server.wait_exit(10) == 0
