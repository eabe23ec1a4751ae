"""The proxy's edges, on the wire (issue 32, items 6, 7 and 15): what a client gets for
an `Upgrade` the route does not allow (h2c must not open a tunnel around the routes),
malformed chunked bodies, transfer codings other than `chunked`, a missing or doubled
`Host`, the header count cap, and the status line of an HTTP/1.0 target.

The clients here are raw sockets (http.client would fix up or refuse what is sent),
and so are the targets: a small threaded server that records each request's head and
answers as the test says, down to the status line.
"""

from __future__ import annotations

import socket
import threading

import pytest

import harness

pytestmark = [pytest.mark.weir_only]


# -- a raw HTTP/1.1 reader ---------------------------------------------------------


class Reader:
    """Reads HTTP/1.x messages off a socket, byte for byte as they came."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def line(self) -> bytes:
        while b"\n" not in self.buf:
            if not self._fill():
                raise EOFError("connection closed")
        line, _, self.buf = self.buf.partition(b"\n")
        return line.rstrip(b"\r")

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise EOFError("connection closed")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def until_close(self) -> bytes:
        while self._fill():
            pass
        out, self.buf = self.buf, b""
        return out

    def head(self) -> tuple[bytes, list[tuple[str, str]]]:
        first = self.line()
        headers = []
        while True:
            line = self.line()
            if not line:
                return first, headers
            name, _, value = line.partition(b":")
            headers.append((name.decode().strip().lower(), value.decode().strip()))

    def body(self, headers: list[tuple[str, str]], to_close: bool) -> bytes:
        h = dict(headers)
        if "chunked" in h.get("transfer-encoding", ""):
            out = b""
            while True:
                size = int(self.line().split(b";")[0], 16)
                if size == 0:
                    while self.line():
                        pass
                    return out
                out += self.exactly(size)
                self.line()
        if "content-length" in h:
            return self.exactly(int(h["content-length"]))
        return self.until_close() if to_close else b""


class Response:
    def __init__(self, status_line: bytes, headers, body: bytes):
        self.status_line = status_line
        self.version = status_line.split(b" ")[0].decode()
        self.status = int(status_line.split(b" ")[1])
        self.headers = headers
        self.body = body

    def header(self, name: str) -> str | None:
        return dict(self.headers).get(name)


def read_response(r: Reader, head_only: bool = False) -> Response:
    first, headers = r.head()
    status = int(first.split(b" ")[1])
    if head_only or status in (101, 204, 304) or 100 <= status < 200:
        return Response(first, headers, b"")
    return Response(first, headers, r.body(headers, to_close=True))


class Client:
    """One raw connection to the proxy."""

    def __init__(self, port: int):
        self.sock = socket.create_connection((harness.HOST, port), timeout=10)
        self.reader = Reader(self.sock)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def ask(self, data: bytes, head_only: bool = False) -> Response:
        self.send(data)
        return read_response(self.reader, head_only)

    def closed(self) -> bool:
        """Whether the proxy closed the connection (within a second)."""
        self.sock.settimeout(1.0)
        try:
            return self.sock.recv(1) == b""
        except socket.timeout:
            return False
        except OSError:
            return True

    def close(self) -> None:
        self.sock.close()


# -- a raw target ------------------------------------------------------------------


class RawTarget:
    """Records each request (request line, headers, body) and answers it by `mode`:

    - `plain`: `HTTP/1.1 200` with `plain`, keep-alive;
    - `upgrade`: to any request with an `Upgrade` header, `101` with that protocol,
      then a tunnel: whatever comes after is recorded in `tunnelled` and answered
      `HTTP/1.1 200 tunnelled` (what h2c would have let through around the routes);
    - `always101`: `101` to every request, asked or not;
    - `http10`: `HTTP/1.0 200` with `ok`, then the connection closed.
    """

    def __init__(self, mode: str = "plain"):
        self.mode = mode
        self.lock = threading.Lock()
        self.got: list[tuple[bytes, dict[str, str], bytes]] = []
        self.tunnelled: list[bytes] = []
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((harness.HOST, 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        r = Reader(conn)
        try:
            while True:
                first, headers = r.head()
                body = r.body(headers, to_close=False)
                h = dict(headers)
                with self.lock:
                    self.got.append((first, h, body))
                if self.mode == "always101" or (self.mode == "upgrade" and "upgrade" in h):
                    protocol = h.get("upgrade", "h2c")
                    conn.sendall(
                        f"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: {protocol}\r\n\r\n".encode()
                    )
                    self._tunnel(conn, r)
                    return
                if self.mode == "http10":
                    conn.sendall(b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nplain")
        except (EOFError, OSError, ValueError):
            pass
        finally:
            conn.close()

    def _tunnel(self, conn: socket.socket, r: Reader) -> None:
        data = r.buf
        while True:
            if data:
                with self.lock:
                    self.tunnelled.append(data)
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\ntunnelled")
            data = conn.recv(65536)
            if not data:
                return

    def requests(self) -> list[tuple[bytes, dict[str, str], bytes]]:
        with self.lock:
            return list(self.got)

    def close(self) -> None:
        self.sock.close()


# -- the proxy ---------------------------------------------------------------------


class EdgeProxy(harness.ServerProcess):
    """weir with a `[proxy]` of one listener, `proxy_extra` keys and `routes` (TOML)."""

    def __init__(self, binary, routes: str, proxy_extra: str = ""):
        super().__init__(binary, "weir")
        self.proxy_port = harness.free_port()
        self.config = self.root / "weir.toml"
        self.config.write_text(
            (self.config_toml or "")
            + "[proxy]\n"
            + proxy_extra
            + f'[[proxy.listen]]\nname = "main"\naddr = "{harness.HOST}:{self.proxy_port}"\n'
            + routes
        )

    def argv(self):
        return super().argv() + ["--config", str(self.config)]

    def client(self) -> Client:
        return Client(self.proxy_port)


def route(name: str, port: int, extra: str = "") -> str:
    return f'[[proxy.routes]]\nname = "{name}"\ntargets = ["http://{harness.HOST}:{port}"]\nrequest_timeout_ms = 5000\n{extra}'


@pytest.fixture
def targets():
    made = []

    def make(mode="plain"):
        t = RawTarget(mode)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


@pytest.fixture
def proxy(server_bin):
    made = []

    def make(routes, proxy_extra=""):
        p = EdgeProxy(server_bin, routes, proxy_extra)
        made.append(p)
        return p.start()

    yield make
    for p in made:
        p.stop()


H2C = (
    b"GET /public/page HTTP/1.1\r\nhost: example\r\n"
    b"connection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\nhttp2-settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n"
)
DELETE = b"POST /private/delete-everything HTTP/1.1\r\nhost: example\r\ncontent-length: 0\r\n\r\n"


# -- 6: upgrades -------------------------------------------------------------------


def test_h2c_upgrade_is_dropped_and_the_next_request_is_routed(targets, proxy):
    """Issue 32 item 6: `Upgrade: h2c` on a `GET /public/*` route reached a target that
    answers 101, and the tunnel let `POST /private/delete-everything` through."""
    target = targets("upgrade")
    p = proxy(route("public", target.port, 'methods = ["GET"]\npath = "/public/*"\n'))
    c = p.client()
    try:
        r = c.ask(H2C)
        assert r.status == 200, r.status_line
        assert r.body == b"plain"
        got = target.requests()
        assert len(got) == 1
        assert not {"upgrade", "http2-settings"} & set(got[0][1]), got[0][1]
        assert "upgrade" not in got[0][1].get("connection", "").lower()
        # The same connection: the next request is routed, and this one matches none.
        r = c.ask(DELETE)
        assert r.status == 404, (r.status_line, r.body)
        assert r.header("x-weir-proxy-error", ) is not None
        assert target.tunnelled == []
        assert len(target.requests()) == 1
    finally:
        c.close()


def test_websocket_needs_a_route_that_allows_it(targets, proxy):
    """`Upgrade: websocket` goes through only on a route with `websocket = true`; on
    others it is dropped, as is any other upgrade on every route."""
    target = targets("upgrade")
    p = proxy(
        route("ws", target.port, 'path = "/ws/*"\nwebsocket = true\n')
        + route("plain", target.port, 'path = "/*"\n')
    )
    ws = (
        b"GET /%s/chat HTTP/1.1\r\nhost: example\r\nconnection: Upgrade\r\nupgrade: websocket\r\n"
        b"sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    c = p.client()
    try:
        r = c.ask(ws % b"ws", head_only=True)
        assert r.status == 101, r.status_line
        assert r.header("upgrade") == "websocket"
        c.send(b"ping through the tunnel")
        assert read_response(c.reader).body == b"tunnelled"
    finally:
        c.close()
    # Not allowed on this route: a plain request, no tunnel.
    c = p.client()
    try:
        r = c.ask(ws % b"other")
        assert (r.status, r.body) == (200, b"plain")
        assert "upgrade" not in target.requests()[-1][1]
    finally:
        c.close()
    # h2c is dropped on a route that allows websocket too.
    c = p.client()
    try:
        r = c.ask(H2C.replace(b"/public/page", b"/ws/x"))
        assert (r.status, r.body) == (200, b"plain")
        assert "upgrade" not in target.requests()[-1][1]
    finally:
        c.close()


def test_a_101_the_client_did_not_ask_for_is_refused(targets, proxy):
    """A target answering 101 to a plain request would turn the client's connection
    into a tunnel: the client gets 502 instead."""
    target = targets("always101")
    p = proxy(route("any", target.port))
    c = p.client()
    try:
        r = c.ask(b"GET /x HTTP/1.1\r\nhost: example\r\n\r\n")
        assert r.status == 502, r.status_line
        assert r.header("x-weir-proxy-error") is not None
    finally:
        c.close()


def test_connect_is_refused(targets, proxy):
    """CONNECT would make a tunnel to wherever the client names: 405, and the target
    never sees it (before, it went to the target, and the client's connection died)."""
    target = targets()
    p = proxy(route("any", target.port))
    c = p.client()
    try:
        r = c.ask(b"CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\n\r\n")
        assert r.status == 405, r.status_line
        assert r.header("x-weir-proxy-error") is not None
        assert target.requests() == []
    finally:
        c.close()


# -- 7: request framing ------------------------------------------------------------

MALFORMED_CHUNKED = {
    "bad size": b"zz\r\nhello\r\n0\r\n\r\n",
    "0x prefix": b"0x5\r\nhello\r\n0\r\n\r\n",
    "bare LF": b"5\nhello\n0\n\n",
    "huge size": b"ffffffffffffffffffff\r\nhello\r\n0\r\n\r\n",
    "huge extension": b"5;" + b"e" * 100_000 + b"\r\nhello\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("name", list(MALFORMED_CHUNKED))
def test_a_malformed_chunked_body_is_a_400(targets, proxy, name):
    target = targets()
    p = proxy(route("any", target.port))
    c = p.client()
    try:
        c.send(b"POST /up HTTP/1.1\r\nhost: example\r\ntransfer-encoding: chunked\r\n\r\n")
        r = c.ask(MALFORMED_CHUNKED[name])
        assert r.status == 400, (r.status_line, r.body)
        assert r.header("x-weir-proxy-error") is not None, r.headers
    finally:
        c.close()


@pytest.mark.parametrize("coding", [b"gzip, chunked", b"identity, chunked", b"chunked, chunked"])
def test_a_transfer_coding_other_than_chunked_is_a_501(targets, proxy, coding):
    target = targets()
    p = proxy(route("any", target.port))
    c = p.client()
    try:
        r = c.ask(b"POST /up HTTP/1.1\r\nhost: example\r\ntransfer-encoding: " + coding + b"\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        assert r.status == 501, (r.status_line, r.body)
        assert r.header("x-weir-proxy-error") is not None
        assert target.requests() == []
    finally:
        c.close()


def test_host_is_required_once_in_http11_and_optional_in_http10(targets, proxy):
    target = targets()
    p = proxy(route("any", target.port))
    for request, status in [
        (b"GET /a HTTP/1.1\r\nhost: one\r\nhost: two\r\n\r\n", 400),
        (b"GET /a HTTP/1.1\r\n\r\n", 400),
        (b"GET /a HTTP/1.1\r\nhost: one\r\n\r\n", 200),
        (b"GET /a HTTP/1.0\r\n\r\n", 200),
        (b"GET /a HTTP/1.0\r\nhost: one\r\nhost: two\r\n\r\n", 400),
    ]:
        c = p.client()
        try:
            r = c.ask(request)
            assert r.status == status, (request, r.status_line, r.body)
            if status == 400:
                assert r.header("x-weir-proxy-error") is not None
        finally:
            c.close()
    assert len(target.requests()) == 2


def test_the_header_count_cap_is_a_setting(targets, proxy):
    target = targets()
    p = proxy(route("any", target.port), proxy_extra="headers_max = 20\n")

    def ask(n):
        extra = b"".join(b"x-h%d: v\r\n" % i for i in range(n))
        c = p.client()
        try:
            return c.ask(b"GET /a HTTP/1.1\r\nhost: example\r\n" + extra + b"\r\n").status
        finally:
            c.close()

    assert ask(15) == 200
    assert ask(25) == 431


# -- 15: the status line -----------------------------------------------------------


def test_an_http10_targets_answer_goes_out_in_the_clients_version(targets, proxy):
    target = targets("http10")
    p = proxy(route("any", target.port))
    c = p.client()
    try:
        for _ in range(3):
            r = c.ask(b"GET /a HTTP/1.1\r\nhost: example\r\n\r\n")
            assert (r.version, r.status, r.body) == ("HTTP/1.1", 200, b"ok"), r.status_line
            assert (r.header("connection") or "").lower() != "close"
        assert not c.closed()
    finally:
        c.close()
    # An HTTP/1.0 client gets HTTP/1.0.
    c = p.client()
    try:
        r = c.ask(b"GET /a HTTP/1.0\r\nhost: example\r\n\r\n")
        assert (r.version, r.status, r.body) == ("HTTP/1.0", 200, b"ok"), r.status_line
    finally:
        c.close()
