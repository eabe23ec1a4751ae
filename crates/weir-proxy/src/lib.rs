//! weir's HTTP proxy: forwards each request to a route's primary target (one, or a
//! balanced set) and captures it, durably, into the route's engine queue, from
//! which each shadow target replays it at its own pace. The client's request never
//! waits for a shadow and never fails because of one; a shadow that is down builds a
//! backlog on disk, and a restart resumes the replays where they stood.
//!
//! The map: `config.rs` the `[proxy]` section, `route.rs` matching and a route as it
//! runs, `forward.rs` the request path, `framing.rs` the framing a request needs
//! (`Host`, transfer codings), `upstream.rs` the request a target gets and its answer,
//! `headers.rs` the headers it gets, `balance.rs` round-robin and passive health,
//! `health.rs` active health checks, `capture.rs` the captured form and the body tee,
//! `queues.rs` the queues' names, `shadow.rs` replays, `replay_request.rs` the request
//! a capture becomes, `probe.rs` a shadow's health, `dead.rs` dead letters,
//! `redrive.rs` their re-drive, `readers.rs` readers no longer configured, `record.rs`
//! routes that keep their captures, `capture_file.rs` captures as JSON lines (export,
//! import), `replay.rs` replays to any URL (`weir replay`), `upgrade.rs` WebSocket,
//! `idle.rs` stalled answers, `server.rs` the listeners, `metrics.rs` `/metrics`; the
//! toolbox below them: `body.rs` the body type, `refusal.rs` the proxy's own answers,
//! `client.rs` the outgoing HTTP client; `tools/` the capture endpoints of the HTTP
//! port and the command lines `weir capture`, `weir replay` and `weir diff`.
//!
//! It keeps its captures through `weir_backend`, the interface the memcache door
//! uses, so a route's shadows and recording run on the embedded engine or on a
//! JetStream cluster alike (a capture export walks the queue with
//! `Backend::scan`). It runs on a runtime of its own, beside the rest of the
//! process: [`start`], [`ProxyHandle::stop`].

mod balance;
mod body;
mod budget;
mod capture;
pub mod capture_file;
mod client;
pub mod config;
mod dead;
mod deliver;
mod diff;
mod differ;
mod forward;
mod framing;
mod headers;
mod health;
mod idle;
mod metrics;
mod probe;
mod queues;
mod readers;
mod record;
mod redrive;
mod refusal;
pub mod replay;
mod replay_request;
mod route;
mod server;
mod shadow;
mod tls;
pub mod tools;
mod upgrade;
mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;

pub use crate::capture::{Captured, CapturedResponse};
pub use crate::config::{ProxyConfig, ProxySettings};
pub use crate::dead::{RedriveError, DEAD_READER};
pub use crate::diff::{FieldStats, Kind as DiffKind, Sample as DiffSample, ShadowDiffStats};
pub use crate::differ::{report_text as diff_report_text, RouteReport, ShadowReport};
pub use crate::queues::{capture_queue, dead_queue};
pub use crate::record::RECORD_READER;
pub use crate::refusal::ERROR_HEADER;
pub use crate::replay_request::REPLAY_HEADER;

use crate::client::http_client;
use crate::forward::Proxy;
use crate::route::LiveRoute;
use crate::shadow::LiveShadow;

const STOP_GRACE: Duration = Duration::from_secs(3);

/// A running proxy.
pub struct ProxyHandle {
    proxy: Arc<Proxy>,
    shadows: Shadows,
    addrs: Vec<(String, SocketAddr)>,
    /// Per listener: idle connections closed at `connections_max` for a new one.
    evicted: Vec<(String, Arc<std::sync::atomic::AtomicU64>)>,
    shutdown: watch::Sender<bool>,
    thread: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The proxy's runtime, for work started from outside (a re-drive).
    runtime: tokio::runtime::Handle,
}

/// Binds every listener, opens the capture queues and starts the replays. Errors
/// (an address in use, a queue the backend refuses) come back here, except that a
/// JetStream cluster out of reach is outlived: the routes' capture queues are then
/// set up in the background, and their requests forwarded uncaptured until then.
pub fn start(
    backend: Arc<weir_backend::Backend>,
    settings: ProxySettings,
) -> anyhow::Result<ProxyHandle> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(settings.threads)
        .thread_name("weir-proxy")
        .enable_all()
        .build()
        .context("starting the proxy's runtime")?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let settings = Arc::new(settings);
    let (proxy, shadows, listeners) = runtime.block_on(setup(backend, &settings, &shutdown_rx))?;
    let proxy = Arc::new(proxy);
    for (i, r) in proxy.routes.iter().enumerate() {
        if r.settings.health_path.is_some() {
            runtime.spawn(health::run(Arc::clone(&proxy), i, shutdown_rx.clone()));
        }
    }
    let mut addrs = Vec::new();
    let mut serving = Vec::new();
    let mut evicted = Vec::new();
    for (name, listener) in listeners {
        addrs.push((name.clone(), listener.local_addr()?));
        tracing::info!(listener = %name, addr = %listener.local_addr()?, "proxy listening");
        let counter = Arc::default();
        evicted.push((name.clone(), Arc::clone(&counter)));
        serving.push(runtime.spawn(server::serve(
            listener,
            name.into(),
            Arc::clone(&proxy),
            Arc::clone(&settings),
            shutdown_rx.clone(),
            counter,
        )));
    }
    let mut done = shutdown_rx.clone();
    let draining = Arc::clone(&proxy);
    let handle = runtime.handle().clone();
    let thread = std::thread::Builder::new()
        .name("weir-proxy-main".into())
        .spawn(move || {
            runtime.block_on(async move {
                let _ = done.wait_for(|stop| *stop).await;
                // Listeners drain their requests (within their own grace), then the
                // captures of the last requests are appended.
                for s in serving {
                    let _ = s.await;
                }
                draining.captures_settled(STOP_GRACE).await;
            });
            runtime.shutdown_timeout(STOP_GRACE);
        })
        .context("starting the proxy's thread")?;
    Ok(ProxyHandle {
        proxy,
        shadows,
        addrs,
        evicted,
        shutdown: shutdown_tx,
        thread: parking_lot::Mutex::new(Some(thread)),
        runtime: handle,
    })
}

/// Each shadow, with the reader and the queue its backlog is read from: filled at
/// start, and later by a route set up in the background.
type Shadows = Arc<parking_lot::Mutex<Vec<(Arc<LiveShadow>, String, String)>>>;

type Setup = (Proxy, Shadows, Vec<(String, tokio::net::TcpListener)>);

/// How long a route whose capture queue could not be set up waits before trying
/// again, at first and at most.
const SETUP_RETRY_FIRST: Duration = Duration::from_secs(1);
const SETUP_RETRY_MAX: Duration = Duration::from_secs(30);

async fn setup(
    backend: Arc<weir_backend::Backend>,
    settings: &ProxySettings,
    shutdown: &watch::Receiver<bool>,
) -> anyhow::Result<Setup> {
    let mut listeners = Vec::new();
    for l in &settings.listen {
        let listener = tokio::net::TcpListener::bind(&l.addr)
            .await
            .with_context(|| format!("listening on {} (proxy listener {})", l.addr, l.name))?;
        listeners.push((l.name.clone(), listener));
    }
    // What a config can get wrong is refused before anything is set up, also for the
    // routes whose setup waits for the cluster below.
    for r in &settings.routes {
        record::check(r)?;
    }
    let mut routes = Vec::new();
    let shadows: Shadows = Default::default();
    // Once the backend proves unreachable, the routes left are set up in the
    // background without a try here each (every try waits `unavailable_retry_ms`).
    let mut unreachable = false;
    for r in &settings.routes {
        let slot = Arc::new(std::sync::OnceLock::new());
        match route_now(&backend, r, shutdown, &mut unreachable).await? {
            Some((queue, started)) => {
                if let Some(queue) = queue {
                    let _ = slot.set(queue);
                }
                shadows.lock().extend(started);
            }
            None => {
                tokio::spawn(route_set_up_later(
                    Arc::clone(&backend),
                    r.clone(),
                    Arc::clone(&slot),
                    Arc::clone(&shadows),
                    shutdown.clone(),
                ));
            }
        }
        routes.push(LiveRoute {
            pattern: route::Pattern::new(&r.path),
            client: http_client(r.connect_timeout, &r.tls),
            balancer: balance::Balancer::new(&r.targets),
            capture: slot,
            counters: Default::default(),
            settings: r.clone(),
        });
    }
    let spill_dir = backend.scratch_dir();
    let proxy = Proxy {
        routes,
        backend,
        captures_in_flight: Default::default(),
        budget: budget::Budget::new(settings.body_memory_max, spill_dir),
    };
    Ok((proxy, shadows, listeners))
}

/// A route's setup now, or `None` when it is left to the background because the
/// cluster cannot be reached (`unreachable` says so for the routes after it).
async fn route_now(
    backend: &Arc<weir_backend::Backend>,
    r: &config::RouteSettings,
    shutdown: &watch::Receiver<bool>,
    unreachable: &mut bool,
) -> anyhow::Result<Option<RouteSetUp>> {
    if r.shadows.is_empty() && !r.record && backend.may_be_unreachable() {
        // Only a look for readers left from an earlier config, best effort on a
        // store that may be out of reach (JetStream): no reason to hold the start
        // for it.
        let (backend, name) = (Arc::clone(backend), capture_queue(&r.name));
        tokio::spawn(async move { readers::forget_readers(&backend, &name, &[]).await });
        return Ok(Some((None, Vec::new())));
    }
    if *unreachable {
        return Ok(None);
    }
    match route_capture(backend, r, shutdown).await {
        Ok(set_up) => Ok(Some(set_up)),
        Err(e) if unreachable_cluster(backend, &e) => {
            tracing::warn!(route = %r.name, error = %format!("{e:#}"), "the cluster cannot be reached: the proxy forwards, and counts captures as not_ready, until the capture queues are set up in the background");
            *unreachable = true;
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Whether a route's setup failed only because the store (a JetStream cluster) cannot
/// be reached, which the proxy outlives; on the engine every failure stops the start.
fn unreachable_cluster(backend: &weir_backend::Backend, e: &anyhow::Error) -> bool {
    backend.may_be_unreachable()
        && e.chain().any(|c| {
            c.downcast_ref::<weir_backend::Error>()
                .is_some_and(|b| b.kind() == weir_backend::Kind::Unavailable)
        })
}

/// Sets a route's capture queue up once the cluster answers, trying again with a
/// growing pause (to [`SETUP_RETRY_MAX`]) until it is done or the proxy stops.
async fn route_set_up_later(
    backend: Arc<weir_backend::Backend>,
    r: config::RouteSettings,
    slot: Arc<std::sync::OnceLock<weir_backend::Queue>>,
    shadows: Shadows,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut pause = SETUP_RETRY_FIRST;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        match route_capture(&backend, &r, &shutdown).await {
            Ok((queue, started)) => {
                if let Some(queue) = queue {
                    let _ = slot.set(queue);
                }
                shadows.lock().extend(started);
                tracing::info!(route = %r.name, "the route's capture queue is set up: captures and replays go on");
                return;
            }
            Err(e) => {
                pause = (pause * 2).min(SETUP_RETRY_MAX);
                let (error, retry_in_s) = (format!("{e:#}"), pause.as_secs());
                if unreachable_cluster(&backend, &e) {
                    tracing::warn!(route = %r.name, error, retry_in_s, "still cannot set up the route's capture queue");
                } else {
                    // Not the cluster's absence (a limit of the cluster, say): still
                    // tried again, as it may be lifted, but said louder.
                    tracing::error!(route = %r.name, error, retry_in_s, "the cluster refuses the route's capture queue");
                }
            }
        }
    }
}

/// What a route's setup made: its capture queue (for a route with shadows or
/// `record`) and each shadow started, with its reader and the queue.
type RouteSetUp = (
    Option<weir_backend::Queue>,
    Vec<(Arc<LiveShadow>, String, String)>,
);

/// The capture queue of a route with shadows or `record`, its readers set up and its
/// shadows started; no queue and no shadow for a route with neither (whose queue, if
/// it has one, loses the `record` reader of an earlier recording on the engine; on
/// JetStream `route_now` names its readers in a warning instead, and this is not
/// reached).
async fn route_capture(
    backend: &Arc<weir_backend::Backend>,
    r: &config::RouteSettings,
    shutdown: &watch::Receiver<bool>,
) -> anyhow::Result<RouteSetUp> {
    let name = capture_queue(&r.name);
    if r.shadows.is_empty() && !r.record {
        record::forget(backend, &name)
            .await
            .with_context(|| format!("the capture queue of route {}", r.name))?;
        return Ok((None, Vec::new()));
    }
    let (queue, started) = shadow::start(backend, &name, r, shutdown)
        .await
        .with_context(|| format!("setting up the replays of route {}", r.name))?;
    let started = started
        .into_iter()
        .map(|(shadow, reader)| (shadow, reader, name.clone()))
        .collect();
    Ok((Some(queue), started))
}

impl ProxyHandle {
    /// Each listener's name and bound address (useful with port 0).
    pub fn addrs(&self) -> &[(String, SocketAddr)] {
        &self.addrs
    }

    /// The proxy's figures now; the shadows' backlogs come from `stats`, the
    /// backend's figures the rest of `/metrics` is made of (a shadow whose queue is
    /// not in them has none).
    pub fn metrics(&self, stats: &[weir_backend::QueueStats]) -> metrics::Snapshot {
        let routes = self
            .proxy
            .routes
            .iter()
            .map(|r| metrics::RouteRow::new(&r.settings.name, &r.counters))
            .collect();
        // A copy (a few `Arc`s): the list is not locked while reading, nor twice.
        let shadows = self.shadows.lock().clone();
        let shadows = shadows
            .iter()
            .map(|(s, reader, queue)| metrics::ShadowRow {
                backlog: reader_items(stats, queue, reader),
                dead_letters: reader_items(stats, s.dead.queue_name(), DEAD_READER),
                up: s.health.is_up(),
                ..metrics::ShadowRow::new(&s.route, &s.settings.name, &s.counters)
            })
            .collect();
        let budget = &self.proxy.budget;
        metrics::Snapshot {
            routes,
            shadows,
            evicted: self
                .evicted
                .iter()
                .map(|(name, n)| (name.clone(), n.load(std::sync::atomic::Ordering::Relaxed)))
                .collect(),
            budget: [
                budget.used(),
                budget.peak(),
                budget.max(),
                budget.spilled.load(std::sync::atomic::Ordering::Relaxed),
            ],
            diffs: self.diff_report(),
        }
    }

    /// The proxy's series as Prometheus text, appended to `out` (for tests and
    /// tools: `weir serve` encodes [`ProxyHandle::metrics`] with the rest of its page).
    pub fn render_metrics(&self, stats: &[weir_backend::QueueStats], out: &mut String) {
        out.push_str(&weir_backend::exposition::text(self.metrics(stats)));
    }

    /// What the diffing shadows found, route by route (routes without one are left
    /// out): the figures `/proxy/diffs` and `weir diff report` show.
    pub fn diff_report(&self) -> Vec<differ::RouteReport> {
        let mut report: Vec<differ::RouteReport> = Vec::new();
        let shadows = self.shadows.lock().clone();
        for (s, _, _) in &shadows {
            let Some(d) = &s.diff else { continue };
            let shadow = differ::ShadowReport {
                shadow: s.settings.name.clone(),
                stats: d.stats.lock().clone(),
            };
            match report.iter_mut().find(|r| r.route == s.route) {
                Some(r) => r.shadows.push(shadow),
                None => report.push(differ::RouteReport {
                    route: s.route.clone(),
                    reference: d.route.has_reference(),
                    noise_fields: d.route.noise.lock().fields(),
                    shadows: vec![shadow],
                }),
            }
        }
        report
    }

    /// Starts replaying again the dead letters of `route`'s shadow `shadow` (those
    /// there are now, oldest first, one at a time; in sequential mode to that shadow
    /// and the ones after it). Returns how many there are; the re-drive goes on in
    /// the background.
    pub async fn redrive(&self, route: &str, shadow: &str) -> Result<u64, RedriveError> {
        let found = self
            .shadows
            .lock()
            .iter()
            .find(|(s, _, _)| s.route == route && s.settings.name == shadow)
            .map(|(s, _, _)| Arc::clone(s));
        let Some(s) = found else {
            return Err(RedriveError::NotFound);
        };
        let mut chain = vec![Arc::clone(&s)];
        chain.extend(s.after.get().into_iter().flatten().cloned());
        match self.runtime.spawn(redrive::redrive(chain)).await {
            Ok(result) => result,
            Err(_) => Err(RedriveError::Stopping),
        }
    }

    /// Stops listening and replaying, and waits: requests in flight get 2 s,
    /// replays in flight are not confirmed (they come again after a restart).
    /// Blocks: call it off any async runtime's threads. Later calls do nothing.
    pub fn stop(&self) {
        let _ = self.shutdown.send(true);
        if let Some(thread) = self.thread.lock().take() {
            if thread.join().is_err() {
                tracing::error!("the proxy's thread panicked");
            }
        }
    }
}

/// The items a reader of a queue has, from the backend's figures.
fn reader_items(stats: &[weir_backend::QueueStats], queue: &str, reader: &str) -> Option<u64> {
    stats
        .iter()
        .find(|q| q.name == queue)
        .and_then(|q| q.readers.iter().find(|r| r.name == reader))
        .map(|r| r.items)
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.stop();
    }
}
