"""Process and socket helpers shared by the end-to-end tests.

The tests drive a real `weir` binary (and a real memcached as a reference) over
loopback TCP. Everything here is bounded: every wait has a deadline, every
process started is killed and every temp dir removed by its owner.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"

# How long a server may take to start accepting (a restart after kill -9 may
# have to recover its logs first).
START_TIMEOUT_S = 20.0


# The backend under test: "embedded" (default) or "jetstream", with the cluster's
# client URLs in WEIR_TEST_NATS_URLS (scripts/test starts a 3-node cluster for that run).
BACKEND = os.environ.get("WEIR_TEST_BACKEND", "embedded")
NATS_URLS = os.environ.get("WEIR_TEST_NATS_URLS", "")


def on_jetstream() -> bool:
    return BACKEND == "jetstream"


# The `lease_timeout_ms` the harness gives weir on JetStream (unless a test brings its
# own config; weir's default is 30 s): how long the leases of a killed
# weir (which cannot give them back) take to come back (docs/cluster.md, "Leases").
JETSTREAM_LEASE_TIMEOUT_S = 5.0


def after_kill9_restart() -> None:
    """On the embedded engine a killed server's leases are back once it restarts; on
    JetStream they come back after the lease timeout: wait that out."""
    if on_jetstream():
        time.sleep(JETSTREAM_LEASE_TIMEOUT_S + 1.0)


def jetstream_call(work, servers: str | None = None):
    """Runs `await work(js)` against the test cluster (or the cluster at `servers`,
    comma-separated URLs) with nats-py (a JetStream context); bounded to 30 s."""
    import asyncio

    import nats

    async def main():
        urls = (servers or NATS_URLS).split(",")
        nc = await nats.connect(servers=urls, connect_timeout=5, max_reconnect_attempts=5)
        try:
            return await work(nc.jetstream(timeout=10))
        finally:
            await nc.close()

    return asyncio.run(asyncio.wait_for(main(), 30))


def delete_stream(stream: str, servers: str | None = None) -> None:
    """Removes a test's JetStream stream (and its consumers), the stream its doors
    keep their registrations and lease records in (`<stream>_DOORS`), and the event
    bus's metadata map (`<stream>_MAP_BUS`), from the test cluster (or the cluster at
    `servers`)."""
    import nats.js.errors

    async def work(js):
        for name in (stream, stream + "_DOORS", stream + "_MAP_BUS"):
            try:
                await js.delete_stream(name)
            except nats.js.errors.NotFoundError:
                pass

    jetstream_call(work, servers)


def door_registrations(stream: str) -> int:
    """How many weir front doors are registered on `stream` (in `<stream>_DOORS`)."""
    import nats.js.errors

    async def work(js):
        try:
            info = await js.stream_info(stream + "_DOORS", subjects_filter=f"_weir.{stream}.rec.door.>")
        except nats.js.errors.NotFoundError:
            return 0
        return len(info.state.subjects or {})

    return jetstream_call(work)


def stream_leader(stream: str) -> str:
    """The name of the node leading `stream` ("n1".."n3" on scripts/nats-cluster)."""

    async def work(js):
        info = await js.stream_info(stream)
        return info.cluster.leader

    return jetstream_call(work)


def consumer_leader(stream: str, consumer: str) -> str:
    """The name of the node leading `consumer` of `stream`."""

    async def work(js):
        info = await js.consumer_info(stream, consumer)
        return info.cluster.leader

    return jetstream_call(work)


def consumer_pending(stream: str, consumer: str, servers: str | None = None) -> tuple[int, int]:
    """`consumer`'s (pending, ack pending): items it has yet to deliver, and items
    delivered and not acknowledged."""

    async def work(js):
        info = await js.consumer_info(stream, consumer)
        return info.num_pending, info.num_ack_pending

    return jetstream_call(work, servers)


def wait_lease_timeout_or_settled(stream: str, consumer: str, until: float, servers: str | None = None) -> bool:
    """Waits until `consumer` has nothing left to deliver and nothing delivered
    unacknowledged, or until time.monotonic() reaches `until`, whichever comes first;
    True when it settled.

    A test that drained a queue after faults and then waits out the lease timeout
    before a last drain does so for items delivered and never acknowledged (a pull
    whose reply was lost, an ack lost in an election): JetStream counts each of them
    as ack pending until its AckWait (the lease timeout) passes and it is delivered
    again. With (0, 0) there is nothing such to wait for; until then the wait is the
    whole lease timeout, as before."""

    def settled() -> bool:
        try:
            return consumer_pending(stream, consumer, servers) == (0, 0)
        except Exception:  # noqa: BLE001 - no consumer leader for the moment
            return False

    return bool(wait_for(settled, max(0.0, until - time.monotonic()), 0.5))


def stream_consumers_and_messages(stream: str) -> tuple[list[str], int]:
    """The names of `stream`'s consumers, and how many messages it holds."""

    async def work(js):
        info = await js.stream_info(stream)
        names = [c.name for c in await js.consumers_info(stream)]
        return sorted(names), info.state.messages

    return jetstream_call(work)


def consumer_step_down(stream: str, consumer: str) -> None:
    """Asks `consumer`'s leader to step down (another replica is elected)."""

    import asyncio

    import nats

    async def main():
        nc = await nats.connect(servers=NATS_URLS.split(","), connect_timeout=5, max_reconnect_attempts=5)
        try:
            subject = f"$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{consumer}"
            reply = await nc.request(subject, b"{}", timeout=10)
            assert b'"success":true' in reply.data, reply.data
        finally:
            await nc.close()

    asyncio.run(asyncio.wait_for(main(), 30))


# Ports free_port handed out in this process: the kernel may pick a port again as
# soon as the probe socket closes, and two ports of one server (its memcache, HTTP
# and proxy ports) must differ (a CI run once got the same port for --http-listen
# and a proxy listener).
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port that was free a moment ago (the kernel picks it), never one
    this process was handed before."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def raise_nofile_limit(wanted: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE towards `wanted` (children inherit it)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < wanted and os.geteuid() == 0:
        try:  # root may raise the hard limit too
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1024), wanted))
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        except (ValueError, OSError):
            pass
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def weir_bin() -> Path:
    """The binary under test: $WEIR_BIN, else target/release/weir in the repo."""
    raw = os.environ.get("WEIR_BIN", "target/release/weir")
    path = Path(raw)
    if not path.is_absolute():
        path = REPO_ROOT / path
    return path


def is_memcached(path: Path) -> bool:
    """Development aid: WEIR_BIN=/usr/bin/memcached runs the plain-protocol tests
    against memcached (weir-only tests are skipped then)."""
    return path.name == "memcached"


def memcached_bin() -> Path:
    found = shutil.which("memcached") or "/usr/bin/memcached"
    return Path(found)


class ServerProcess:
    """One server process on a fixed port and data dir; can be killed and restarted."""

    def __init__(self, binary: Path, kind: str):
        self.binary = binary
        self.kind = kind  # "weir" or "memcached"
        # root/data is the server's data dir, root/server.log its output.
        self.root = Path(tempfile.mkdtemp(prefix=f"{kind}-test-"))
        self.data_dir = self.root / "data"
        self.data_dir.mkdir()
        self.log_path = self.root / "server.log"
        self.port = free_port()
        self.http_port = free_port()
        self.proc: subprocess.Popen | None = None
        self._log = None
        self.starts = 0
        # On JetStream each server object has a stream of its own, kept across its
        # restarts (as a data dir is) and removed by stop(). Two servers that must
        # share queues (two front doors) set the same name.
        self.stream = f"WT{os.getpid()}_{self.port}" if on_jetstream() and kind == "weir" else None
        # A config file for weir (TOML text), written into root at start when set.
        self.config_toml: str | None = None
        # The NATS servers this door connects to (None: all of the test cluster's).
        self.nats_urls: str | None = None
        if self.stream is not None:
            # Short leases: the tests that kill a lone weir wait them out.
            self.config_toml = "[backend.jetstream]\nlease_timeout_ms = %d\n" % int(JETSTREAM_LEASE_TIMEOUT_S * 1000)

    # -- lifecycle ---------------------------------------------------------

    def argv(self) -> list[str]:
        if self.kind == "memcached":
            # -U 0: no UDP; -c: enough connections for the abuse tests; -u root is
            # required when running as root (CI does).
            argv = [str(self.binary), "-l", HOST, "-p", str(self.port), "-U", "0", "-c", "10000", "-m", "64"]
            if os.geteuid() == 0:
                argv += ["-u", "root"]
            return argv
        return [
            str(self.binary),
            "serve",
            "--listen",
            f"{HOST}:{self.port}",
            "--http-listen",
            f"{HOST}:{self.http_port}",
            "--data-dir",
            str(self.data_dir),
            "--log-level",
            os.environ.get("WEIR_TEST_LOG_LEVEL", "info"),
        ]

    def start(self, timeout_s: float = START_TIMEOUT_S) -> "ServerProcess":
        self.start_no_wait()
        self.wait_accepting(timeout_s)
        return self

    def start_no_wait(self) -> None:
        """Starts the process without waiting for it to accept connections."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        if self.config_toml is not None:
            (self.root / "harness.toml").write_text(self.config_toml)
        argv = self.argv()
        # The harness's config file, unless the test brings its own.
        if self.config_toml is not None and "--config" not in argv:
            argv = argv + ["--config", str(self.root / "harness.toml")]
        self._log = open(self.log_path, "ab")
        self._log.write(f"\n===== start #{self.starts}: {' '.join(argv)}\n".encode())
        self._log.flush()
        env = dict(os.environ)
        env.setdefault("RUST_BACKTRACE", "1")
        if self.stream is not None:
            env["WEIR_BACKEND"] = "jetstream"
            env["WEIR_NATS_SERVERS"] = self.nats_urls or NATS_URLS
            env["WEIR_NATS_STREAM"] = self.stream
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=str(self.root),
            env=env,
        )

    def wait_accepting(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last_err: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.kind} exited with {self.proc.returncode} before accepting\n{self.log_tail()}"
                )
            try:
                with socket.create_connection((HOST, self.port), timeout=1.0) as s:
                    s.sendall(b"version\r\n")
                    s.settimeout(2.0)
                    if recv_until(s, b"\r\n", 2.0).startswith(b"VERSION "):
                        return
            except OSError as e:
                last_err = e
            time.sleep(0.05)
        raise AssertionError(f"{self.kind} not accepting on {HOST}:{self.port} after {timeout_s}s ({last_err})\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        return self._reap(10.0)

    def sigterm(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout_s: float) -> int | None:
        """The exit code, or None if still running after timeout_s."""
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        self._close_log()
        return code

    def _reap(self, timeout_s: float) -> int:
        code = self.proc.wait(timeout=timeout_s)
        self._close_log()
        return code

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self) -> None:
        """Kill (if running) and remove everything this object created."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._close_log()
        shutil.rmtree(self.root, ignore_errors=True)
        if self.stream is not None and not getattr(self, "shares_stream", False):
            # From the cluster the door used (test_cluster_partitions.py's doors use
            # a cluster of their own, while the shared one may be having its faults).
            delete_stream(self.stream, self.nats_urls)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_bytes().decode("utf-8", "replace")
        except FileNotFoundError:
            return "(no log)"
        tail = text.splitlines()[-lines:]
        return f"--- last {len(tail)} lines of {self.kind} log ---\n" + "\n".join(tail)

    @property
    def addr(self) -> tuple[str, int]:
        return (HOST, self.port)


# -- raw protocol helpers ---------------------------------------------------


def recv_until(sock: socket.socket, terminator: bytes, timeout_s: float, buf: bytes = b"") -> bytes:
    """Read until `terminator` is in the buffer (returns all bytes read so far)."""
    deadline = time.monotonic() + timeout_s
    while terminator not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no {terminator!r} within {timeout_s}s; got {buf[:200]!r}")
        sock.settimeout(left)
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed; got {buf[:200]!r}")
        buf += chunk
    return buf


class Conn:
    """A raw memcache connection: exact bytes in, exact bytes out."""

    def __init__(self, addr: tuple[str, int], timeout_s: float = 5.0):
        self.sock = socket.create_connection(addr, timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout_s = timeout_s
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"timed out; buffered {self.buf[:200]!r}")
        self.sock.settimeout(left)
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed by server; buffered {self.buf[:200]!r}")
        self.buf += chunk

    def read_line(self, timeout_s: float | None = None) -> bytes:
        """One line including its \\r\\n."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while b"\r\n" not in self.buf:
            self._fill(deadline)
        i = self.buf.index(b"\r\n") + 2
        line, self.buf = self.buf[:i], self.buf[i:]
        return line

    def read_exact(self, n: int, timeout_s: float | None = None) -> bytes:
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while len(self.buf) < n:
            self._fill(deadline)
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def expect(self, expected: bytes, timeout_s: float | None = None) -> None:
        """The next bytes from the server are exactly `expected`."""
        try:
            got = self.read_exact(len(expected), timeout_s)
        except (TimeoutError, ConnectionError) as e:
            raise AssertionError(f"expected {expected!r}: {e}") from None
        assert got == expected, f"expected {expected!r}, got {got!r}"

    def request(self, line: bytes, timeout_s: float | None = None) -> bytes:
        """Send one command line, return one reply line."""
        self.send(line)
        return self.read_line(timeout_s)

    def set(self, key: bytes | str, value: bytes, flags: int = 0, exptime: int = 0) -> bytes:
        key = key.encode() if isinstance(key, str) else key
        self.send(b"set %s %d %d %d\r\n%s\r\n" % (key, flags, exptime, len(value), value))
        return self.read_line()

    def get_items(self, key: bytes | str, timeout_s: float | None = None) -> list[tuple[bytes, int, bytes]]:
        """`get KEY`, returning [(key, flags, data)] parsed strictly up to END."""
        key = key.encode() if isinstance(key, str) else key
        self.send(b"get %s\r\n" % key)
        return self.read_values(timeout_s)

    def read_values(self, timeout_s: float | None = None) -> list[tuple[bytes, int, bytes]]:
        items = []
        while True:
            line = self.read_line(timeout_s)
            if line == b"END\r\n":
                return items
            parts = line[:-2].split(b" ")
            assert parts[0] == b"VALUE" and len(parts) == 4, f"unexpected reply line {line!r}"
            n = int(parts[3])
            data = self.read_exact(n + 2, timeout_s)
            assert data[-2:] == b"\r\n", f"data block not followed by CRLF: {data[-10:]!r}"
            items.append((parts[1], int(parts[2]), data[:-2]))

    def get(self, key: bytes | str, timeout_s: float | None = None) -> bytes | None:
        items = self.get_items(key, timeout_s)
        assert len(items) <= 1, items
        return items[0][2] if items else None

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def reset(self) -> None:
        """Abort the connection with an RST (SO_LINGER 0), like a crashed client."""
        import struct

        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        finally:
            self.close()

    def __enter__(self) -> "Conn":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def wait_for(predicate, timeout_s: float, interval_s: float = 0.05):
    """Poll `predicate` until it returns a truthy value or time runs out; returns the last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval_s)


def value_reply(key: bytes, flags: int, data: bytes) -> bytes:
    """The exact bytes of a one-item `get KEY` reply. The key is echoed as the
    client sent it (options included): clients such as pymemcache look the
    reply up by the key they asked for."""
    return b"VALUE %s %d %d\r\n%s\r\nEND\r\n" % (key, flags, len(data), data)


class Writer(threading.Thread):
    """Sets `PREFIX-N` items into one queue on its own connection until stopped,
    recording every value the server acknowledged with STORED."""

    def __init__(self, addr, queue: str, prefix: str, max_items: int = 200_000, max_s: float = 10.0):
        super().__init__(daemon=True)
        self.addr, self.queue, self.prefix = addr, queue.encode(), prefix
        self.max_items, self.max_s = max_items, max_s
        self.stop_event = threading.Event()
        self.sent: list[bytes] = []
        self.acked: list[bytes] = []
        self.other_replies: list[bytes] = []
        self.ended_by: str = ""

    def run(self) -> None:
        deadline = time.monotonic() + self.max_s
        try:
            conn = Conn(self.addr, timeout_s=3.0)
        except OSError as e:
            self.ended_by = f"connect: {e}"
            return
        try:
            for i in range(self.max_items):
                if self.stop_event.is_set() or time.monotonic() > deadline:
                    self.ended_by = "stopped"
                    return
                value = b"%s-%d" % (self.prefix.encode(), i)
                self.sent.append(value)
                try:
                    conn.send(b"set %s 0 0 %d\r\n%s\r\n" % (self.queue, len(value), value))
                    line = conn.read_line(3.0)
                except (OSError, TimeoutError, ConnectionError) as e:
                    self.ended_by = f"connection: {type(e).__name__}"
                    return
                if line != b"STORED\r\n":
                    self.other_replies.append(line)
                    self.ended_by = f"reply {line!r}"
                    return
                self.acked.append(value)
            self.ended_by = "max_items"
        finally:
            conn.close()


def drain(addr, key: str, limit: int, batch: int = 200, timeout_s: float = 20.0) -> list[bytes]:
    """Take every item of `key` with plain gets (pipelined), up to `limit` items."""
    out: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    with Conn(addr, timeout_s=5.0) as c:
        while len(out) < limit:
            assert time.monotonic() < deadline, f"drain of {key} took over {timeout_s}s ({len(out)} items)"
            c.send(b"get %s\r\n" % key.encode() * batch)
            empty = False
            for _ in range(batch):
                items = c.read_values()
                if not items:
                    empty = True
                out.extend(d for (_k, _f, d) in items)
            if empty:
                break
    return out


def check_acked_survived(writers: list[Writer], drained: list[bytes]) -> None:
    """Every acknowledged item is there exactly once, in each writer's order;
    nothing appears that was never sent."""
    assert len(drained) == len(set(drained)), "an item was delivered twice"
    position = {v: i for i, v in enumerate(drained)}
    for w in writers:
        assert w.acked, f"writer {w.prefix} got no STORED at all ({w.ended_by})"
        missing = [v for v in w.acked if v not in position]
        assert not missing, f"{len(missing)} STORED items lost, first {missing[:3]} (writer {w.prefix})"
        order = [position[v] for v in w.acked]
        assert order == sorted(order), f"writer {w.prefix}: items out of order"
    sent = {v for w in writers for v in w.sent}
    unknown = [v for v in drained if v not in sent]
    assert not unknown, f"items never sent came back: {unknown[:3]}"


class IdleSockets:
    """`n` connections to an HTTP listener that hold their place under its connection
    cap without a request in flight (issue 32): they send nothing (`mode="silent"`),
    or the start of a request head and then one more byte every 0.2 s, never
    finishing it (`mode="slow-head"`). Closed on `close()` or leaving the `with`."""

    HEAD = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: "

    def __init__(self, port: int, n: int, mode: str = "silent"):
        assert mode in ("silent", "slow-head"), mode
        self.socks: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = None
        for _ in range(n):
            s = socket.create_connection((HOST, port), timeout=5)
            if mode == "slow-head":
                self._send(s, self.HEAD)
            self.socks.append(s)
        if mode == "slow-head":
            self.thread = threading.Thread(target=self._trickle, daemon=True)
            self.thread.start()

    @staticmethod
    def _send(s: socket.socket, data: bytes) -> None:
        try:
            s.sendall(data)
        except OSError:
            pass  # closed by the listener (evicted): that is allowed

    def _trickle(self) -> None:
        while not self.stop.wait(0.2):
            for s in self.socks:
                self._send(s, b"a")

    def closed(self) -> int:
        """How many the listener has closed (EOF or reset) by now."""
        n = 0
        for s in self.socks:
            s.settimeout(0.01)
            try:
                # Anything but EOF (a 408, say) is read and the socket checked again.
                while s.recv(65536) != b"":
                    pass
                n += 1
            except socket.timeout:
                pass
            except OSError:
                n += 1
        return n

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        for s in self.socks:
            s.close()

    def __enter__(self) -> "IdleSockets":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def served_within(request, timeout_s: float = 5.0):
    """`request()`'s result, which must come within `timeout_s` (on a loaded machine
    too; a listener locked out by idle sockets refuses or resets it instead)."""
    started = time.monotonic()
    result = request()
    took = time.monotonic() - started
    assert took < timeout_s, f"served after {took:.2f} s"
    return result


def backend_retries(server: "ServerProcess") -> float:
    """`weir_backend_retries_total` on the server's `/metrics` (JetStream)."""
    import urllib.request

    url = f"http://{HOST}:{server.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("weir_backend_retries_total")
    )
