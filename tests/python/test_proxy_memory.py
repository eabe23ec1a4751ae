"""The proxy's body memory budget (`[proxy] body_memory_bytes_max`): many concurrent slow
uploads larger than the budget all reach the primary whole and are all captured
(past the budget their copies spill to disk), and the body bytes held in memory
never pass the budget (the gauge's high-water mark says so). No timing is asserted.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time

import pytest

import harness
from test_proxy import ProxyServer, Server, metric, wait_for

pytestmark = [pytest.mark.weir_only]

BUDGET = 2 * 1024 * 1024
UPLOADS = 24
BODY = 300 * 1024
PIECES = 6


@pytest.fixture
def stack(server_bin):
    made = [server_bin]
    yield made
    made.pop(0)
    for x in reversed(made):
        x.stop() if isinstance(x, ProxyServer) else x.close()


def slow_upload(port: int, i: int, results: dict) -> None:
    """POSTs body `i` in pieces with pauses, so that the uploads are in flight
    together; records the status and the answer's body."""
    body = bytes([65 + i % 26]) * BODY
    try:
        s = socket.create_connection((harness.HOST, port), timeout=30)
        s.sendall(
            f"POST /up/{i} HTTP/1.1\r\nHost: x\r\nContent-Length: {BODY}\r\n\r\n".encode()
        )
        step = BODY // PIECES
        for k in range(PIECES):
            s.sendall(body[k * step : BODY if k == PIECES - 1 else (k + 1) * step])
            time.sleep(0.1)
        r = http.client.HTTPResponse(s)
        r.begin()
        results[i] = (r.status, r.read())
        s.close()
    except OSError as e:
        results[i] = (None, str(e).encode())


def test_concurrent_uploads_past_the_budget_are_forwarded_and_captured(stack):
    primary, shadow = Server(), Server()
    stack.extend([primary, shadow])
    p = ProxyServer(
        stack[0],
        primary.port,
        [("s", shadow.port, "")],
        proxy_settings=f"body_memory_bytes_max = {BUDGET}\n",
    )
    stack.append(p)
    p.start()
    results: dict = {}
    threads = [threading.Thread(target=slow_upload, args=(p.proxy_port, i, results)) for i in range(UPLOADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(results.get(i) == (200, b"Hello world!") for i in range(UPLOADS)), results
    expected = {f"/up/{i}": bytes([65 + i % 26]) * BODY for i in range(UPLOADS)}
    with primary.lock:
        got = {g[1]: g[3] for g in primary.got}
    assert got == expected
    # Every upload is captured and replayed whole, those past the budget by way of
    # a spill file.
    wait_for(lambda: len(shadow.paths()) == UPLOADS, timeout_s=60)
    with shadow.lock:
        replayed = {g[1]: g[3] for g in shadow.got}
    assert replayed == expected
    assert metric(p, 'weir_proxy_captures_total{route="api",outcome="captured"}') == UPLOADS
    assert metric(p, 'weir_proxy_captures_total{route="api",outcome="over_budget"}') == 0
    assert metric(p, "weir_proxy_bodies_spilled_total") > 0
    assert metric(p, "weir_proxy_body_memory_max_bytes") == BUDGET
    assert 0 < metric(p, "weir_proxy_body_bytes_in_memory_max") <= BUDGET
    wait_for(lambda: metric(p, "weir_proxy_body_bytes_in_memory") == 0)


def test_a_budget_smaller_than_a_body_forwards_it_and_counts_the_capture_skipped(stack):
    primary, shadow = Server(), Server()
    stack.extend([primary, shadow])
    p = ProxyServer(
        stack[0],
        primary.port,
        [("s", shadow.port, "")],
        proxy_settings="body_memory_bytes_max = 100000\n",
    )
    stack.append(p)
    p.start()
    results: dict = {}
    slow_upload(p.proxy_port, 0, results)
    assert results[0] == (200, b"Hello world!")
    with primary.lock:
        assert [g[3] for g in primary.got] == [b"A" * BODY]
    # Spilled, but it could never be read back within the budget to be appended.
    wait_for(
        lambda: metric(p, 'weir_proxy_captures_total{route="api",outcome="over_budget"}') == 1
    )
    assert metric(p, 'weir_proxy_captures_total{route="api",outcome="captured"}') == 0
    assert metric(p, "weir_proxy_body_bytes_in_memory_max") <= 100000

