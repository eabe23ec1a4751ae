//! The memcache door: bind, accept, run one task per connection, shut down.
//!
//! Each connection runs `handle`: execute every complete request in the read
//! buffer, write all their replies at once, read again. Limits: `connections_max`
//! (one more is told `SERVER_ERROR too many connections` and closed),
//! `request_timeout_ms` from the first byte of a request to its last (so a client
//! trickling a byte a second cannot hold a half-sent request forever), plus the
//! parser's line and item limits. Shutdown: stop accepting, let each connection
//! finish the requests it has fully received, release leases; the root closes the
//! store after.
//!
//! Threads: `threads` event loops, each a single-threaded tokio runtime on its own OS
//! thread; the accept loop hands connections to them in turn. A connection lives on
//! one thread for its whole life. Measured on the flood benchmark, this costs about as
//! much CPU per request as memcached, where tokio's work-stealing runtime spent ~50%
//! more at low concurrency (waking idle workers that find nothing to do) for no gain
//! in throughput: request/reply traffic has no long tasks to balance.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use weir_backend::exposition::DescriptorEncoder;
use weir_backend::listen::listen;

use crate::cmd::{self, Ctx, Flow, Session};
use crate::connection::Connection;
use crate::handles::Handles;
use crate::inbound::Next;
use crate::metrics::LoopMetrics;
use crate::parse::{binary_error, CommandKind, ParseLimits};
use crate::reply;
use crate::settings::{Limits, MemcacheSettings, Reload};
use crate::shared::Shared;

/// Pause after a failed accept (typically EMFILE), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// A running memcache door: its listener bound, its event loops started, its accept
/// loop on a task of the runtime that started it.
pub struct MemcacheDoor {
    shared: Arc<Shared>,
    addr: std::net::SocketAddr,
    /// The accept loop, then the event loops' stop; taken by [`MemcacheDoor::stopped`].
    running: taken_once::Slot<tokio::task::JoinHandle<()>>,
}

/// A listener bound before the door starts (the root binds every port before it
/// starts any door, so a port in use fails the start before anything runs).
pub struct BoundListener(TcpListener);

impl BoundListener {
    /// Binds the memcache port with a deep accept queue ([`weir_backend::listen`]).
    pub async fn bind(addr: &str) -> anyhow::Result<BoundListener> {
        let listener = listen(addr)
            .await
            .with_context(|| format!("listening on {addr}"))?;
        Ok(BoundListener(listener))
    }

    pub fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.0.local_addr()
    }
}

impl MemcacheDoor {
    /// Starts the event loops and the accept loop (on a task of the current runtime)
    /// on `listener`, over `backend`.
    pub fn start(
        listener: BoundListener,
        backend: Arc<weir_backend::Backend>,
        settings: MemcacheSettings,
        reload: Option<Reload>,
    ) -> anyhow::Result<MemcacheDoor> {
        let addr = listener.local_addr()?;
        let connections_max = settings.connections_max;
        let grace_ms = settings.shutdown_grace_ms;
        let workers = Workers::start(settings.threads.saturating_sub(1))?;
        let shared = Arc::new(Shared::new(backend, settings, reload));
        let serving = Arc::clone(&shared);
        let running = tokio::spawn(async move {
            accept_loop(&serving, listener.0, &workers, connections_max, grace_ms).await;
            // A blocking join, on purpose: nothing else needs this thread now, and the
            // loops stop within a second (dropping connections past the grace period).
            workers.stop();
        });
        Ok(MemcacheDoor {
            shared,
            addr,
            running: taken_once::Slot::new(running),
        })
    }

    /// The memcache port's address.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// Encodes the door's counters onto a `/metrics` page; `after_connections`
    /// encodes right after the connection counters (the HTTP port's own, where the
    /// page has always shown it).
    pub fn encode_metrics(
        &self,
        enc: &mut DescriptorEncoder<'_>,
        after_connections: impl FnOnce(&mut DescriptorEncoder<'_>) -> std::fmt::Result,
    ) -> std::fmt::Result {
        self.shared.metrics.encode(enc, after_connections)
    }

    /// Stops accepting; each connection finishes the requests it has received, then
    /// ends (see `shutdown.rs`). The root tells the backend first.
    pub fn begin_shutdown(&self) {
        self.shared.shutdown.trigger();
    }

    /// Resolves once a shutdown has begun: by [`MemcacheDoor::begin_shutdown`] or by
    /// an enabled `shutdown` command (which tells the backend itself first).
    pub async fn shutdown_requested(&self) {
        self.shared.shutdown.wait().await;
    }

    /// Resolves once the accept loop has ended, its connections have finished (or
    /// the grace period has passed) and the event loops have stopped.
    pub async fn stopped(&self) {
        if let Some(running) = self.running.take() {
            if let Err(e) = running.await {
                tracing::warn!(error = %e, "the memcache accept loop");
            }
        }
    }
}

/// Encodes the zero counters of a memcache door that does not run (`weir proxy
/// --http-listen` shows the series at zero, as it always has); `after_connections`
/// as in [`MemcacheDoor::encode_metrics`].
pub fn encode_idle_metrics(
    enc: &mut DescriptorEncoder<'_>,
    after_connections: impl FnOnce(&mut DescriptorEncoder<'_>) -> std::fmt::Result,
) -> std::fmt::Result {
    crate::metrics::Metrics::new(1).encode(enc, after_connections)
}

/// A value taken once, from behind a shared reference.
mod taken_once {
    pub struct Slot<T>(std::sync::Mutex<Option<T>>);

    impl<T> Slot<T> {
        pub fn new(value: T) -> Slot<T> {
            Slot(std::sync::Mutex::new(Some(value)))
        }

        pub fn take(&self) -> Option<T> {
            match self.0.lock() {
                Ok(mut slot) => slot.take(),
                Err(poisoned) => poisoned.into_inner().take(),
            }
        }
    }
}

/// Event loops besides the one the accept loop runs on.
struct Workers {
    handles: Vec<tokio::runtime::Handle>,
    threads: Vec<std::thread::JoinHandle<()>>,
    stop: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl Workers {
    fn start(count: usize) -> anyhow::Result<Workers> {
        let mut workers = Workers {
            handles: Vec::with_capacity(count),
            threads: Vec::with_capacity(count),
            stop: Vec::with_capacity(count),
        };
        for i in 0..count {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting an event loop")?;
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            workers.handles.push(runtime.handle().clone());
            workers.stop.push(stop_tx);
            let thread = std::thread::Builder::new()
                .name(format!("weir-loop-{}", i + 1))
                .spawn(move || {
                    let _ = runtime.block_on(stop_rx);
                    // Connections still open after the grace period are dropped here
                    // (their leases are released by `Leases`' Drop).
                    runtime.shutdown_timeout(Duration::from_secs(1));
                })
                .context("starting an event loop thread")?;
            workers.threads.push(thread);
        }
        Ok(workers)
    }

    fn stop(self) {
        for stop in self.stop {
            let _ = stop.send(());
        }
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

/// Accepts connections until shutdown, then waits up to `grace_ms` for them to end.
async fn accept_loop(
    shared: &Arc<Shared>,
    listener: TcpListener,
    workers: &Workers,
    connections_max: usize,
    grace_ms: u64,
) {
    let mut next_loop = 0usize;
    // Every connection task holds a sender; when all are dropped, all have ended.
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shared.shutdown.wait() => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let metrics = &shared.metrics;
        if metrics.connections_current.load(Relaxed) >= connections_max as u64 {
            metrics.connections_refused.fetch_add(1, Relaxed);
            tokio::spawn(refuse(stream));
            continue;
        }
        // Round robin over the event loops; index 0 is this one.
        next_loop = (next_loop + 1) % (workers.handles.len() + 1);
        spawn_connection(shared, stream, peer, workers, next_loop, done_tx.clone());
    }
    drop(listener);
    drop(done_tx);
    tracing::info!("stopped accepting; waiting for connections to finish");
    let grace = Duration::from_millis(grace_ms);
    if tokio::time::timeout(grace, done_rx.recv()).await.is_err() {
        tracing::warn!(
            open = shared.metrics.connections_current.load(Relaxed),
            "connections still open after the grace period"
        );
    }
}

/// Serves `stream`, from `peer`, on event loop `loop_index` (0 is this one). `done` is
/// dropped when the connection ends, however it ends.
fn spawn_connection(
    shared: &Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    workers: &Workers,
    loop_index: usize,
    done: mpsc::Sender<()>,
) {
    let _ = stream.set_nodelay(true);
    let slot = ConnectionSlot::take(shared);
    shared.metrics.connections_total.fetch_add(1, Relaxed);
    let shared = Arc::clone(shared);
    if loop_index == 0 {
        // `slot` and `done` are moved in, so they are dropped however the task ends,
        // a panic included.
        tokio::spawn(async move {
            // Dropped in reverse: the slot goes back before `done` says so.
            let _done = done;
            let _slot = slot;
            serve_connection(&shared, stream, peer, 0).await;
        });
        return;
    }
    // Move the socket to the other loop's reactor.
    let stream = match stream.into_std() {
        Ok(stream) => stream,
        Err(e) => {
            tracing::warn!(error = %e, "handing a connection over");
            return;
        }
    };
    workers.handles[loop_index - 1].spawn(async move {
        let _done = done;
        let _slot = slot;
        match TcpStream::from_std(stream) {
            Ok(stream) => serve_connection(&shared, stream, peer, loop_index).await,
            Err(e) => tracing::warn!(error = %e, "taking over a connection"),
        }
    });
}

/// One of `connections_max`, counted in `connections_current` for as long as it
/// lives: the count goes down on drop, so a connection task that panics gives its slot
/// back too.
struct ConnectionSlot {
    shared: Arc<Shared>,
}

impl ConnectionSlot {
    fn take(shared: &Arc<Shared>) -> ConnectionSlot {
        shared.metrics.connections_current.fetch_add(1, Relaxed);
        ConnectionSlot {
            shared: Arc::clone(shared),
        }
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let before = self
            .shared
            .metrics
            .connections_current
            .fetch_sub(1, Relaxed);
        debug_assert!(before > 0);
    }
}

async fn refuse(mut stream: TcpStream) {
    let _ = stream.write_all(reply::TOO_MANY_CONNECTIONS).await;
}

/// Serves one connection, from `peer`, on event loop `loop_index` (0 is the accept
/// loop's), whose counters it writes. Its leases name it as their holder
/// (`memcache PEER`, see [`Handles::held_by`]).
async fn serve_connection(shared: &Shared, stream: TcpStream, peer: SocketAddr, loop_index: usize) {
    let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
    let mut conn = Connection::new(stream);
    // Declared after `conn`, so it is dropped (deregistered) before the socket closes.
    let registration = shared.shutdown.register(fd);
    let mut session = Session {
        handles: Handles::held_by(peer),
        ..Session::default()
    };
    let metrics = shared.metrics.for_loop(loop_index);
    if let Err(e) = handle(shared, metrics, &mut conn, &mut session).await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
    // Before the deregistration, so a shutdown that waits for this connection sees
    // its leases back.
    session.leases.release_everything();
    drop(registration);
}

/// The connection loop: execute, write, read, until the client leaves, a request
/// says to close, or shutdown.
async fn handle(
    shared: &Shared,
    metrics: &LoopMetrics,
    conn: &mut Connection,
    session: &mut Session,
) -> io::Result<()> {
    // When the request at the front of the buffer began arriving.
    let mut request_started: Option<Instant> = None;
    loop {
        let (flow, progressed) = process(shared, metrics, conn, session).await;
        let written = conn.write_replies().await?;
        metrics.bytes_written.add(written as u64);
        if flow == Flow::Close || shared.shutdown.is_triggered() {
            return Ok(());
        }
        request_started = match (conn.is_mid_request(), progressed) {
            (false, _) => None,
            (true, true) => Some(Instant::now()),
            (true, false) => Some(request_started.unwrap_or_else(Instant::now)),
        };
        // A shutdown ends this read with end-of-file (see `shutdown.rs`).
        let read = match request_started {
            Some(started) => {
                let deadline = started + session.limits.limits.request_timeout();
                tokio::time::timeout_at(deadline.into(), conn.read()).await
            }
            None => Ok(conn.read().await),
        };
        match read {
            Ok(Ok(0)) => return Ok(()),
            Ok(Ok(n)) => {
                metrics.bytes_read.add(n as u64);
            }
            Ok(Err(e)) => return Err(e),
            Err(_elapsed) => {
                conn.halves().1.put(reply::REQUEST_TIMED_OUT);
                conn.write_replies().await?;
                return Ok(());
            }
        }
    }
}

/// The limits in force (the connection's copy, brought up to date), and what the
/// parser checks of them.
fn limits_now(shared: &Shared, session: &mut Session) -> (Limits, ParseLimits) {
    shared.limits.refresh(&mut session.limits);
    let limits = session.limits.limits;
    (limits, limits.parse())
}

/// Executes every complete request in the read buffer, appending replies to the
/// output. Returns whether to close, and whether any request completed.
async fn process(
    shared: &Shared,
    metrics: &LoopMetrics,
    conn: &mut Connection,
    session: &mut Session,
) -> (Flow, bool) {
    let (inbound, outbound) = conn.halves();
    // One copy of the limits for this read's requests (a reload swaps them whole), taken
    // again after this connection's own `reload`: what follows it sees the new ones.
    let (mut limits, mut parse_limits) = limits_now(shared, session);
    let mut progressed = false;
    let mut last_done: Option<Instant> = None;
    loop {
        let request = match inbound.next_request(&parse_limits) {
            Next::NeedMore => return (Flow::Continue, progressed),
            Next::Request(request) => request,
            Next::Refused {
                reply,
                noreply,
                close,
            } => {
                progressed = true;
                metrics.record(CommandKind::Invalid, Duration::ZERO);
                if !noreply {
                    outbound.put(reply);
                }
                if close {
                    return (Flow::Close, true);
                }
                continue;
            }
            Next::Binary { opcode, opaque } => {
                metrics.record(CommandKind::Invalid, Duration::ZERO);
                outbound.put(&binary_error(opcode, opaque));
                return (Flow::Close, true);
            }
        };
        progressed = true;
        let kind = request.kind();
        // One clock read per request: each request's time runs from the end of the one
        // before it in this read (or from the first one's start).
        let started = *last_done.get_or_insert_with(Instant::now);
        let flow = {
            let mut ctx = Ctx {
                shared,
                limits: &limits,
                session: &mut *session,
                metrics,
                out: &mut *outbound,
            };
            cmd::execute(request, &mut ctx).await
        };
        let done = Instant::now();
        metrics.record(kind, done.saturating_duration_since(started));
        last_done = Some(done);
        if kind == CommandKind::Reload {
            (limits, parse_limits) = limits_now(shared, session);
        }
        outbound.hand_over_read_ahead(inbound);
        if flow == Flow::Close {
            return (Flow::Close, true);
        }
        // A burst of gets for large items: write as we go rather than hold every reply
        // of the read in memory.
        if !outbound.write_if_over(metrics).await {
            return (Flow::Close, true);
        }
    }
}
