"""`/metrics` read by a real parser: weir with the memcache door, the bus and the proxy
on, a little traffic through each door, then the page parsed by the Prometheus
project's own Python client (`prometheus_client.parser`, the text format 0.0.4).
Every family parses, none is repeated, none is left untyped (a sample whose name
does not match its `# TYPE` line), and the documented names are there with their
documented types. A subscriber's name (the bus's `subscriber` label) may hold `"`
and `\\`, which the format escapes: one does here, and comes back whole.
"""

from __future__ import annotations

import http.client
import socket
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

import harness
from test_bus import BusServer, Receiver
from test_proxy import Server

pytestmark = [pytest.mark.weir_only]

# Queue and topic names cannot hold a character the format escapes; a token's owner
# name can (no control characters: so no newline either).
ESCAPED_NAME = 'team "a" \\ b'

# Documented families (docs/protocol.md, docs/bus.md, docs/proxy.md) by the name
# their `# TYPE` line shows, with their types.
EXPECTED = {
    # the memcache door and the server
    "weir_connections": "gauge",
    "weir_connections_total": "counter",
    "weir_connections_refused_total": "counter",
    "weir_http_connections_evicted_total": "counter",
    "weir_bytes_read_total": "counter",
    "weir_bytes_written_total": "counter",
    "weir_get_hits_total": "counter",
    "weir_get_misses_total": "counter",
    "weir_commands_total": "counter",
    "weir_request_duration_seconds": "histogram",
    "weir_queue_items": "gauge",
    "weir_queue_bytes": "gauge",
    "weir_queue_appended_total": "counter",
    "weir_queue_expired_total": "counter",
    "weir_queue_discarded_total": "counter",
    "weir_queue_dead_lettered_total": "counter",
    "weir_queue_open_leases": "gauge",
    "weir_queue_waiters": "gauge",
    "weir_queue_oldest_age_ms": "gauge",
    "weir_queue_disk_bytes": "gauge",
    "weir_reader_items": "gauge",
    "weir_reader_bytes": "gauge",
    "weir_reader_taken_total": "counter",
    "weir_reader_confirmed_total": "counter",
    "weir_reader_expired_total": "counter",
    "weir_reader_discarded_total": "counter",
    "weir_reader_dead_lettered_total": "counter",
    "weir_reader_open_leases": "gauge",
    "weir_reader_waiters": "gauge",
    "weir_reader_oldest_age_ms": "gauge",
    # the bus
    "weir_bus_topics": "gauge",
    "weir_bus_api_connections_evicted_total": "counter",
    "weir_bus_subscriber_queued": "gauge",
    "weir_bus_subscriber_oldest_age_ms": "gauge",
    "weir_bus_subscriber_dead_letters": "gauge",
    "weir_bus_subscriber_sent_total": "counter",
    "weir_bus_subscriber_failed_attempts_total": "counter",
    "weir_bus_subscriber_dead_lettered_total": "counter",
    "weir_bus_delivery_latency_ms": "histogram",
    # the proxy
    "weir_proxy_requests_total": "counter",
    "weir_proxy_responses_total": "counter",
    "weir_proxy_captures_total": "counter",
    "weir_proxy_replays_total": "counter",
    "weir_proxy_replays_failed_total": "counter",
    "weir_proxy_replay_retries_total": "counter",
    "weir_proxy_replay_dead_letters": "gauge",
    "weir_proxy_shadow_up": "gauge",
    "weir_proxy_replays_skipped_total": "counter",
    "weir_proxy_replay_backlog": "gauge",
    "weir_proxy_connections_evicted_total": "counter",
    "weir_proxy_body_bytes_in_memory": "gauge",
    "weir_proxy_body_bytes_in_memory_max": "gauge",
    "weir_proxy_body_memory_max_bytes": "gauge",
    "weir_proxy_bodies_spilled_total": "counter",
}


class AllDoors(BusServer):
    """weir with the memcache door, the bus and a proxy (route `api` to `primary`,
    shadow `s` to `shadow`)."""

    def __init__(self, binary, primary_port, shadow_port):
        self.proxy_port = harness.free_port()
        proxy = (
            "[[proxy.listen]]\n"
            'name = "main"\n'
            f'addr = "{harness.HOST}:{self.proxy_port}"\n'
            "[[proxy.routes]]\n"
            'name = "api"\n'
            f'targets = ["http://{harness.HOST}:{primary_port}"]\n'
            "[[proxy.routes.shadows]]\n"
            'name = "s"\n'
            f'url = "http://{harness.HOST}:{shadow_port}"\n'
        )
        super().__init__(binary, extra=proxy)


def memcache(port: int, command: bytes, end: bytes) -> bytes:
    with socket.create_connection((harness.HOST, port), timeout=5) as s:
        s.sendall(command)
        got = b""
        while not got.endswith(end):
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
        return got


def scrape(port: int) -> tuple[str, str]:
    """(Content-Type, body) of `/metrics`."""
    c = http.client.HTTPConnection(harness.HOST, port, timeout=10)
    try:
        c.request("GET", "/metrics")
        r = c.getresponse()
        return r.getheader("content-type"), r.read().decode()
    finally:
        c.close()


def drive_traffic(server_bin) -> tuple[str, str]:
    """Starts weir with every door, sends a little through each, and returns what
    `/metrics` then shows (Content-Type, body). Also used to compare the page of two
    builds on the same traffic."""
    primary, shadow, receiver = Server(), Server(), Receiver()
    w = AllDoors(server_bin, primary.port, shadow.port)
    try:
        w.start()
        # The memcache door: a set and two reads (a hit, a miss).
        assert memcache(w.port, b"set work 0 0 2\r\nhi\r\n", b"\r\n") == b"STORED\r\n"
        assert memcache(w.port, b"get work\r\n", b"END\r\n") == b"VALUE work 0 2\r\nhi\r\nEND\r\n"
        assert memcache(w.port, b"get work\r\n", b"END\r\n") == b"END\r\n"
        # The bus: a subscriber whose name needs escaping, one event delivered.
        pub, sub = w.token("publisher"), w.token(ESCAPED_NAME)
        status, _, _ = w.call("POST", "/subscription", sub, {"topics": ["orders"], "callback": receiver.url(), "uuid": "u"})
        assert status == 204
        assert w.call("POST", "/topics/orders", pub, {"type": "create", "url": "https://s.example/o/1"})[0] == 200
        receiver.wait_for(lambda: len(receiver.events()) >= 1)
        # The proxy: one request forwarded, captured and replayed to the shadow.
        c = http.client.HTTPConnection(harness.HOST, w.proxy_port, timeout=10)
        c.request("POST", "/orders/1", body=b"x")
        assert c.getresponse().status == 200
        c.close()
        deadline = time.monotonic() + 20
        while shadow.paths() != ["/orders/1"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert shadow.paths() == ["/orders/1"]
        # Counted once the answers are back: wait for both counts.
        def counted(page):
            return 'weir_bus_subscriber_sent_total{subscriber="team \\"a\\" \\\\ b"' in page and (
                'weir_proxy_replays_total{route="api",shadow="s",class="2xx"} 1' in page
            )

        assert harness.wait_for(lambda: counted(scrape(w.http_port)[1]), 10.0), scrape(w.http_port)[1]
        return scrape(w.http_port)
    except BaseException:
        print(w.log_tail())
        raise
    finally:
        w.stop()
        primary.close()
        shadow.close()
        receiver.close()


def exposed(family) -> str:
    """The family's name as its `# TYPE` line shows it."""
    return family.name + "_total" if family.type == "counter" else family.name


def test_the_metrics_page_parses_with_the_reference_parser(server_bin):
    content_type, page = drive_traffic(server_bin)
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    families = list(text_string_to_metric_families(page))
    untyped = [f.name for f in families if f.type in ("untyped", "unknown")]
    assert untyped == [], untyped
    # The parser names a counter family without its `_total` (as OpenMetrics does):
    # the gauge `weir_connections` and the counter `weir_connections_total` would
    # read alike. Compared by the names the page's `# TYPE` lines show.
    shown = [exposed(f) for f in families]
    assert len(shown) == len(set(shown)), sorted(n for n in shown if shown.count(n) > 1)
    types = {exposed(f): f.type for f in families}
    wrong = {n: (types.get(n), t) for n, t in EXPECTED.items() if types.get(n) != t}
    assert wrong == {}, wrong
    by_name = {exposed(f): f for f in families}

    def value(family, sample_name, **labels):
        for s in by_name[family].samples:
            if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
        raise AssertionError(f"no {sample_name} {labels} in {by_name[family].samples}")

    # What the traffic did, as the parser reads it.
    assert value("weir_commands_total", "weir_commands_total", command="set") == 1
    assert value("weir_get_hits_total", "weir_get_hits_total") == 1
    assert value("weir_get_misses_total", "weir_get_misses_total") == 1
    assert value("weir_request_duration_seconds", "weir_request_duration_seconds_count") >= 3
    assert value("weir_request_duration_seconds", "weir_request_duration_seconds_bucket", le="+Inf") >= 3
    assert value("weir_queue_appended_total", "weir_queue_appended_total", queue="work") == 1
    # The escaped label value comes back whole.
    assert value("weir_bus_subscriber_sent_total", "weir_bus_subscriber_sent_total", subscriber=ESCAPED_NAME) == 1
    assert value("weir_bus_delivery_latency_ms", "weir_bus_delivery_latency_ms_count", subscriber=ESCAPED_NAME) == 1
    assert value("weir_proxy_requests_total", "weir_proxy_requests_total", route="api") == 1
    assert value("weir_proxy_responses_total", "weir_proxy_responses_total", route="api", **{"class": "2xx"}) == 1
    assert value("weir_proxy_captures_total", "weir_proxy_captures_total", route="api", outcome="captured") == 1
    assert value("weir_proxy_replays_total", "weir_proxy_replays_total", route="api", shadow="s", **{"class": "2xx"}) == 1
    assert value("weir_proxy_shadow_up", "weir_proxy_shadow_up", route="api", shadow="s") == 1
