//! The server: open the store, bind, accept, run one task per connection, shut down.
//!
//! Each connection runs [`handle`]: execute every complete request in the read
//! buffer, write all their replies at once, read again. Limits: `max_connections`
//! (one more is told `SERVER_ERROR too many connections` and closed),
//! `request_timeout_ms` from the first byte of a request to its last (so a client
//! trickling a byte a second cannot hold a half-sent request forever), plus the
//! parser's line and item limits. Shutdown: stop accepting, let each connection
//! finish the requests it has fully received, release leases, close the store.
//!
//! Threads: `threads` event loops, each a single-threaded tokio runtime on its own OS
//! thread; the accept loop hands connections to them in turn. A connection lives on
//! one thread for its whole life. Measured on the flood benchmark, this costs about as
//! much CPU per request as memcached, where tokio's work-stealing runtime spent ~50%
//! more at low concurrency (waking idle workers that find nothing to do) for no gain
//! in throughput: request/reply traffic has no long tasks to balance.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::cmd::{self, Ctx, Flow, Session};
use crate::config::{BackendSettings, Settings};
use crate::connection::Connection;
use crate::inbound::Next;
use crate::metrics::{LoopMetrics, Metrics};
use crate::parse::{binary_error, CommandKind};
use crate::reply;
use crate::shared::{RuntimeLimits, Shared};
use crate::shutdown::Shutdown;
use crate::signals::Signals;

/// Pause after a failed accept (typically EMFILE), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// Pending connections the kernel queues for `accept` (capped by
/// `net.core.somaxconn`). The default of `TcpListener::bind` is 128, which makes a
/// burst of thousands of connects wait for SYN retries.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds the memcache listener with a [`LISTEN_BACKLOG`]-deep accept queue.
async fn listen(addr: &str) -> io::Result<TcpListener> {
    let mut last = None;
    for sa in tokio::net::lookup_host(addr).await? {
        let socket = if sa.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(sa).and_then(|()| socket.listen(LISTEN_BACKLOG)) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last
        .unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address to listen on")))
}

/// What a start opens after the store, before it serves the first client.
struct Doors {
    listener: TcpListener,
    http_listener: TcpListener,
    bus: Option<weir_bus::BusHandle>,
    proxy: Option<Arc<weir_proxy::ProxyHandle>>,
}

/// Binds the listeners and starts the bus and the proxy.
async fn open_doors(
    settings: &Settings,
    backend: &Arc<weir_backend::Backend>,
) -> anyhow::Result<Doors> {
    let listener = listen(&settings.listen)
        .await
        .with_context(|| format!("listening on {}", settings.listen))?;
    let http_listener = TcpListener::bind(&settings.http_listen)
        .await
        .with_context(|| format!("listening on {} (HTTP)", settings.http_listen))?;
    let bus = start_bus(settings, backend).await?;
    let proxy = start_proxy(settings, backend).await?;
    Ok(Doors {
        listener,
        http_listener,
        bus,
        proxy,
    })
}

/// Opens the store and the doors. A signal meanwhile does not cut the start short
/// (an open cancelled half-way would go on on the blocking pool, unclosed, and a
/// bus or proxy starting would race the store's close): it is returned, and the
/// server shuts down as soon as it is started, by the graceful path. A failed
/// start closes the store.
async fn start(
    settings: &Settings,
    files_open_max: usize,
    signals: &mut Signals,
) -> anyhow::Result<(Arc<weir_backend::Backend>, Doors, Option<&'static str>)> {
    let work = async {
        let backend = Arc::new(open_backend(settings, files_open_max).await?);
        match open_doors(settings, &backend).await {
            Ok(doors) => Ok((backend, doors)),
            Err(e) => {
                if let Err(closing) = backend.close().await {
                    tracing::warn!(error = %closing, "closing the store after a failed start");
                }
                Err(e)
            }
        }
    };
    tokio::pin!(work);
    let mut signalled = None;
    loop {
        tokio::select! {
            biased;
            started = &mut work => {
                let (backend, doors) = started?;
                return Ok((backend, doors, signalled));
            }
            why = signals.recv(), if signalled.is_none() => {
                tracing::info!("{why} during start-up: stopping as soon as started");
                signalled = Some(why);
            }
        }
    }
}

/// Runs the server until it is shut down; returns once the store is closed.
pub async fn run(settings: Settings, config_path: Option<PathBuf>) -> anyhow::Result<()> {
    // First of all: a signal from here on stops the start gracefully.
    let mut signals = Signals::install().context("installing the SIGTERM and SIGINT handlers")?;
    let files_open_max = files_open_max(settings.max_connections);
    let (backend, doors, signalled) = start(&settings, files_open_max, &mut signals).await?;
    let Doors {
        listener,
        http_listener,
        bus,
        proxy,
    } = doors;
    let shared = Arc::new(Shared {
        backend,
        files_open_max,
        settings: settings.clone(),
        limits: RuntimeLimits::new(settings.limits),
        metrics: Metrics::new(settings.threads),
        config_path,
        shutdown: Shutdown::default(),
        started: Instant::now(),
        bus,
        proxy,
        metrics_gathering: Default::default(),
    });
    let workers = Workers::start(settings.threads.saturating_sub(1))?;
    log_listening(&listener, &http_listener, &settings)?;
    if signalled.is_some() {
        // The graceful stop at once: the accept loop ends (a connection already
        // waiting may get its requests answered first), then the usual stop.
        shared.begin_shutdown();
    }
    tokio::spawn(on_signals(Arc::clone(&shared), signals));
    let http_limits = crate::http::HttpLimits {
        max_connections: settings.http_max_connections,
        header_timeout: Duration::from_millis(settings.http_header_timeout_ms),
    };
    let http = tokio::spawn(crate::http::serve(
        http_listener,
        Arc::clone(&shared),
        http_limits,
    ));

    accept_loop(
        &shared,
        listener,
        &workers,
        settings.max_connections,
        settings.shutdown_grace_ms,
    )
    .await;
    // A blocking join, on purpose: nothing else needs this thread now, and the loops
    // stop within a second (dropping connections past the grace period).
    workers.stop();

    // The HTTP port began its drain at the shutdown, and ends it within its grace.
    match tokio::time::timeout(crate::http::STOP_WAIT, http).await {
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "HTTP server"),
        Err(_) => tracing::warn!("HTTP server did not stop in time"),
        _ => {}
    }
    stop_bus(&shared).await;
    tracing::info!(backend = shared.backend.kind_name(), "closing the store");
    shared.backend.close().await.context("closing the store")?;
    tracing::info!("stopped");
    Ok(())
}

/// Starts the event bus when the settings enable it, on its own runtime (started
/// from the blocking pool: a runtime cannot be built on this one's thread). Its
/// queues are the backend's; its metadata is a file in the data directory on the
/// embedded engine, and in the cluster on JetStream (where one door serves it).
async fn start_bus(
    settings: &Settings,
    backend: &Arc<weir_backend::Backend>,
) -> anyhow::Result<Option<weir_bus::BusHandle>> {
    let Some(bus_settings) = settings.bus.clone() else {
        return Ok(None);
    };
    let backend = Arc::clone(backend);
    let meta_dir = settings.data_dir.clone();
    let handle =
        tokio::task::spawn_blocking(move || weir_bus::start(backend, meta_dir, bus_settings))
            .await
            .context("starting the bus")??;
    Ok(Some(handle))
}

/// The one `listening` line, once both ports are bound.
fn log_listening(
    listener: &TcpListener,
    http: &TcpListener,
    settings: &Settings,
) -> io::Result<()> {
    tracing::info!(
        memcache = %listener.local_addr()?,
        http = %http.local_addr()?,
        data_dir = %settings.data_dir.display(),
        threads = settings.threads,
        max_connections = settings.max_connections,
        "listening"
    );
    Ok(())
}

/// Stops the event bus and the proxy, if they run, before the store closes:
/// deliveries and replays in flight end, leased items go back to their queues.
async fn stop_bus(shared: &Arc<Shared>) {
    if shared.bus.is_none() && shared.proxy.is_none() {
        return;
    }
    tracing::info!("stopping the bus and the proxy");
    let stopping = Arc::clone(shared);
    // Joins their threads: off this runtime's thread.
    let _ = tokio::task::spawn_blocking(move || {
        if let Some(bus) = &stopping.bus {
            bus.stop();
        }
        if let Some(proxy) = &stopping.proxy {
            proxy.stop();
        }
    })
    .await;
}

/// Starts the proxy when the settings configure it (from the blocking pool, as
/// the bus).
async fn start_proxy(
    settings: &Settings,
    backend: &Arc<weir_backend::Backend>,
) -> anyhow::Result<Option<Arc<weir_proxy::ProxyHandle>>> {
    let Some(proxy_settings) = settings.proxy.clone() else {
        return Ok(None);
    };
    let backend = Arc::clone(backend);
    let handle = tokio::task::spawn_blocking(move || weir_proxy::start(backend, proxy_settings))
        .await
        .context("starting the proxy")??;
    Ok(Some(Arc::new(handle)))
}

/// Opens the backend the settings name: the embedded store on the blocking pool
/// (recovery reads the disk), or a connection to the JetStream cluster.
pub async fn open_backend(
    settings: &Settings,
    files_open_max: usize,
) -> anyhow::Result<weir_backend::Backend> {
    let mut options = settings.store.clone();
    options.files_open_max = files_open_max;
    if let BackendSettings::JetStream(js) = &settings.backend {
        return connect_jetstream(settings, js, options).await;
    }
    let dir = settings.data_dir.clone();
    let store = tokio::task::spawn_blocking(move || weir::Store::open_with(&dir, options))
        .await
        .context("opening the store")?
        .with_context(|| format!("opening the data directory {}", settings.data_dir.display()))?;
    Ok(weir_backend::Backend::Embedded(
        weir_backend::Embedded::new(store),
    ))
}

/// A connection to the JetStream cluster the settings name.
#[cfg(feature = "jetstream")]
async fn connect_jetstream(
    settings: &Settings,
    js: &weir_backend::JetStreamConfig,
    options: weir::StoreOptions,
) -> anyhow::Result<weir_backend::Backend> {
    for key in &settings.ignored {
        tracing::warn!(
            key,
            "ignored on the jetstream backend: the cluster's settings decide"
        );
    }
    let servers = js.servers.join(",");
    let backend = weir_backend::jetstream::JetStream::connect(js.clone(), options)
        .await
        .with_context(|| format!("connecting to JetStream at {servers}"))?;
    Ok(weir_backend::Backend::JetStream(backend))
}

/// A build without JetStream: the settings are refused when resolved
/// (`config::resolve_backend`); this is never reached, but answers as they do.
#[cfg(not(feature = "jetstream"))]
async fn connect_jetstream(
    _settings: &Settings,
    _js: &weir_backend::JetStreamConfig,
    _options: weir::StoreOptions,
) -> anyhow::Result<weir_backend::Backend> {
    anyhow::bail!(weir_backend::NO_JETSTREAM)
}

/// Descriptors the process keeps for other things than queue files and memcache
/// connections: the listeners, HTTP connections, the log, short-lived opens.
const FILES_RESERVED: usize = 256;
/// The least budget of queue files, however few descriptors are left.
const FILES_FOR_QUEUES_MIN: usize = 64;

/// The store's descriptor budget (`StoreOptions::files_open_max`): the open-files
/// limit (raised to the hard limit at start) less what `max_connections` and the rest
/// of the server may need, so that queues and clients cannot together run out.
fn files_open_max(max_connections: usize) -> usize {
    let limit = weir::open_files_limit();
    let left = limit.saturating_sub(max_connections.saturating_add(FILES_RESERVED));
    if left < FILES_FOR_QUEUES_MIN {
        tracing::warn!(
            open_files_limit = limit,
            max_connections,
            "few descriptors left for queue files: queues will close and reopen their files often; raise the open-files hard limit or lower max_connections"
        );
    }
    let budget = left.max(FILES_FOR_QUEUES_MIN);
    tracing::info!(
        open_files_limit = limit,
        queue_files_max = budget,
        "descriptor budget"
    );
    budget
}

/// SIGTERM and SIGINT start a graceful shutdown.
async fn on_signals(shared: Arc<Shared>, mut signals: Signals) {
    let why = signals.recv().await;
    tracing::info!("{why}: shutting down");
    shared.begin_shutdown();
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
    max_connections: usize,
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
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let metrics = &shared.metrics;
        if metrics.connections_current.load(Relaxed) >= max_connections as u64 {
            metrics.connections_refused.fetch_add(1, Relaxed);
            tokio::spawn(refuse(stream));
            continue;
        }
        // Round robin over the event loops; index 0 is this one.
        next_loop = (next_loop + 1) % (workers.handles.len() + 1);
        spawn_connection(shared, stream, workers, next_loop, done_tx.clone());
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

/// Serves `stream` on event loop `loop_index` (0 is this one). `done` is dropped when
/// the connection ends, however it ends.
fn spawn_connection(
    shared: &Arc<Shared>,
    stream: TcpStream,
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
            serve_connection(&shared, stream, 0).await;
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
            Ok(stream) => serve_connection(&shared, stream, loop_index).await,
            Err(e) => tracing::warn!(error = %e, "taking over a connection"),
        }
    });
}

/// One of `max_connections`, counted in `connections_current` for as long as it
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

/// Serves one connection on event loop `loop_index` (0 is the accept loop's), whose
/// counters it writes.
async fn serve_connection(shared: &Shared, stream: TcpStream, loop_index: usize) {
    let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
    let mut conn = Connection::new(stream);
    // Declared after `conn`, so it is dropped (deregistered) before the socket closes.
    let registration = shared.shutdown.register(fd);
    let mut session = Session::default();
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
                let deadline = started + shared.limits.request_timeout();
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

/// Executes every complete request in the read buffer, appending replies to the
/// output. Returns whether to close, and whether any request completed.
async fn process(
    shared: &Shared,
    metrics: &LoopMetrics,
    conn: &mut Connection,
    session: &mut Session,
) -> (Flow, bool) {
    let (inbound, outbound) = conn.halves();
    let limits = shared.limits.parse_limits();
    let mut progressed = false;
    let mut last_done: Option<Instant> = None;
    loop {
        let request = match inbound.next_request(&limits) {
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
                session: &mut *session,
                metrics,
                out: &mut *outbound,
            };
            cmd::execute(request, &mut ctx).await
        };
        let done = Instant::now();
        metrics.record(kind, done.saturating_duration_since(started));
        last_done = Some(done);
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
