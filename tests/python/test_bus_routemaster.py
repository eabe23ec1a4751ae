"""What existing routemaster users and operators rely on: timestamps as publishers
send them (floats, strings), HireFire's `/pulse/scaling`, `/health/ping`; and the
smaller faults found driving the bus: the root key taken as a client token, SSRF
refusals logged without the guard's words, callbacks' paths and queries (which may
hold a secret) printed in failure logs.
"""

from __future__ import annotations

import ipaddress
import socket
import time

import pytest

import harness
from test_bus import ROOT_KEY, BusServer, bus, receiver  # noqa: F401 - fixtures

pytestmark = [pytest.mark.weir_only]


def test_float_and_string_timestamps_are_taken_and_normalised(bus, receiver):  # noqa: F811
    """routemaster kept any `timestamp`; publishers send `time.time() * 1000` (a
    float) or a string of digits. They are normalised to whole milliseconds."""
    b = bus()
    pub, sub = b.token("pub"), b.token("sub")
    body = {"topics": ["t"], "callback": receiver.url(), "max": 10, "timeout": 0}
    assert b.call("POST", "/subscription", sub, body)[0] == 204
    sent = [
        (1700000000123.9876, 1700000000123),
        ("1700000000456", 1700000000456),
        ("1700000000789.5", 1700000000789),
        ("2023-11-14T22:13:20.123Z", 1700000000123),
        ("2023-11-14T23:13:20.123+01:00", 1700000000123),
        (1700000000999, 1700000000999),
    ]
    for i, (ts, _) in enumerate(sent):
        event = {"type": "noop", "url": f"https://a.example/{i}", "timestamp": ts}
        status, _, reply = b.call("POST", "/topics/t", pub, event)
        assert status == 200, (ts, reply)
    for bad in ("soon", -1, True, [1], "+5", "2023-11-14T22:13:20"):
        event = {"type": "noop", "url": "https://a.example/bad", "timestamp": bad}
        status, _, reply = b.call("POST", "/topics/t", pub, event)
        assert status == 400 and b"timestamp" in reply, (bad, status, reply)
    receiver.wait_for(lambda: len(receiver.events()) >= len(sent))
    got = [(e["url"], e["t"]) for e in receiver.events()]
    assert got == [(f"https://a.example/{i}", t) for i, (_, t) in enumerate(sent)], got


def test_health_ping_and_pulse_scaling(server_bin, receiver):  # noqa: F811
    b = BusServer(server_bin, extra="scaling_threshold = 2\n")
    b.start()
    try:
        for path in ("/health/ping", "/health/ping.json"):
            status, headers, reply = b.call("GET", path)
            assert status == 200, (path, reply)
            assert headers["content-type"] == "application/json"
            pong = __import__("json").loads(reply)["pong"]
            assert pong.startswith(time.strftime("%Y-", time.gmtime())), pong
        pub, sub = b.token("pub"), b.token("sub")
        # Credentials, as routemaster asked for them.
        assert b.call("GET", "/pulse/scaling")[0] == 401
        assert b.call("GET", "/pulse/scaling", sub)[0] == 204
        # Two events wait for a subscriber that refuses them: at the threshold the
        # answer comes a second late (what HireFire's response-time check reads).
        receiver.status = 503
        body = {"topics": ["t"], "callback": receiver.url(), "max": 10, "timeout": 0}
        assert b.call("POST", "/subscription", sub, body)[0] == 204
        for i in range(2):
            event = {"type": "noop", "url": f"https://a.example/{i}"}
            assert b.call("POST", "/topics/t", pub, event)[0] == 200
        # The count is gathered at most once a second: the one above is reused
        # until then.
        time.sleep(1.1)
        started = time.monotonic()
        assert b.call("GET", "/pulse/scaling", ROOT_KEY)[0] == 204
        slow = time.monotonic() - started
        # Only the lower bound: the quick answer's time is the machine's to decide.
        assert slow >= 1.0, slow
    finally:
        b.stop()


def test_the_root_key_cannot_be_a_client_token(bus):  # noqa: F811
    b = bus()
    status, _, reply = b.call("POST", "/api_tokens", ROOT_KEY, {"name": "x", "token": ROOT_KEY})
    assert status == 400 and b"root key" in reply, (status, reply)
    status, _, reply = b.call("GET", "/api_tokens", ROOT_KEY)
    assert status in (200, 204) and ROOT_KEY.encode() not in reply, reply


def loopback_name():
    """A host name (not `localhost`, not an address) that resolves only to addresses
    the SSRF guard refuses: the subscription takes it, the guard refuses it when
    delivering."""
    for name in (socket.gethostname(), "ip6-localhost", "ip6-loopback"):
        try:
            found = {a[4][0] for a in socket.getaddrinfo(name, 443)}
        except OSError:
            continue
        if found and all(not ipaddress.ip_address(a.split("%")[0]).is_global for a in found):
            return name
    return None


def test_ssrf_refusals_are_logged_as_such_and_callbacks_redacted(server_bin):
    name = loopback_name()
    if name is None:
        pytest.skip("no host name here resolves to loopback only")
    b = BusServer(server_bin, attempts_max=2)
    b.config.write_text(
        b.config.read_text().replace("allow_private_networks = true", "allow_private_networks = false")
    )
    b.start()
    try:
        pub, sub = b.token("pub"), b.token("sub")
        callback = f"https://{name}:9/hook/s3cr3t-path?key=s3cr3t-query"
        body = {"topics": ["t"], "callback": callback, "max": 10, "timeout": 0}
        status, _, reply = b.call("POST", "/subscription", sub, body)
        assert status == 204, reply
        assert b.call("POST", "/topics/t", pub, {"type": "noop", "url": "https://a.example/1"})[0] == 200
        assert harness.wait_for(
            lambda: "batch moved to the dead-letter queue" in b.log_path.read_text(errors="replace"), 20.0
        ), b.log_tail()
        log = b.log_path.read_text(errors="replace")
        failed = [line for line in log.splitlines() if "delivery failed" in line]
        assert failed, log[-3000:]
        for line in failed:
            assert "refused by the SSRF guard" in line, line
            assert f"https://{name}:9" in line, line
            assert "s3cr3t" not in line, line
        assert "s3cr3t" not in log, log[-3000:]
    finally:
        b.stop()
