//! weir's event bus: routemaster's HTTP API on weir's queues.
//!
//! Publishers POST events to topics; subscribers get them in batches by HTTP POST
//! to a callback. Events are kept through the storage interface the other front
//! doors use ([`weir_backend::Backend`]), and through nothing else, so that the bus
//! runs on the embedded engine and on JetStream alike: each topic is a queue
//! (`bus:topic:NAME`), each subscriber a reader on each of its topics (an event is
//! written once, whatever the number of subscribers), each subscriber's dead letters
//! a queue of their own (`bus:dead:ID`). The bus's metadata (tokens, topics,
//! subscriptions, secrets) is written before the API answers, a key per item in the
//! backend's map (`meta_map.rs`): a file of the data directory on the embedded
//! engine (an earlier weir's `meta.json` imported into it once: `meta_import.rs`),
//! the cluster's map on JetStream, where one instance serves the bus and the others
//! stand by (`owner.rs`).
//!
//! The map: `api/` the HTTP endpoints, `bus.rs` the metadata and the runtime state
//! and the one way to change them, `worker.rs` the delivery of one subscriber,
//! `event.rs` the event forms, `sign.rs` Standard Webhooks signatures, `guard.rs` the
//! SSRF guard, `retry.rs` the backoff, `retention.rs` how long topics keep events,
//! `metrics.rs` per-subscriber lag on `/metrics`, `config.rs` the `[bus]` section.
//!
//! [`start`] runs the bus on a runtime of its own, on its own threads, beside
//! whatever else the process does (weir's memcache door); [`BusHandle::stop`] ends it.

#![forbid(unsafe_code)]

mod api;
mod auth;
mod bus;
mod client;
pub mod config;
mod counters;
mod error;
mod event;
mod guard;
mod live;
mod meta;
mod meta_import;
mod meta_map;
mod metrics;
mod names;
mod owner;
mod retention;
mod retry;
mod scope;
mod sign;
mod wake;
mod worker;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;

pub use crate::config::{BusConfig, BusSettings};
pub use crate::sign::signature;

use crate::bus::STOP_GRACE;
use crate::names::BUS_MAP;

/// How long [`BusHandle::stop`] waits for a change of the metadata in flight.
const CHANGE_GRACE: Duration = Duration::from_secs(10);

/// A running bus.
pub struct BusHandle {
    bus: Arc<bus::Bus>,
    shutdown: watch::Sender<bool>,
    thread: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
    local_addr: SocketAddr,
}

/// Opens the bus's metadata (the backend's map `bus`; on the embedded engine an
/// earlier weir's `meta_dir/bus/meta.json` is imported into it first), brings
/// `backend`'s bus queues in line with it, binds `settings.listen` and starts
/// serving and delivering. Errors (a damaged map or `meta.json`, a queue the backend
/// refuses, an address in use) come back here, before anything runs. On JetStream
/// `meta_dir` is not used: the metadata is in the cluster, read when this instance comes
/// to serve the bus (`owner.rs`); until then it answers 503.
pub fn start(
    backend: Arc<weir_backend::Backend>,
    meta_dir: PathBuf,
    settings: BusSettings,
) -> anyhow::Result<BusHandle> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(settings.threads)
        .thread_name("weir-bus")
        .enable_all()
        .build()
        .context("starting the bus's runtime")?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let listen = settings.listen.clone();
    let (bus, listener) = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&listen)
            .await
            .with_context(|| format!("listening on {listen} (bus)"))?;
        // The embedded engine's map is this process's alone: the bus serves at once.
        // The cluster's is shared: one instance serves, chosen there (`owner.rs`).
        let local = backend
            .local_map(BUS_MAP)
            .await
            .context("opening the bus's metadata map")?;
        let home = match local {
            Some(map) => bus::MetaHome::Local {
                map,
                data_dir: meta_dir,
            },
            None => bus::MetaHome::Cluster,
        };
        let bus = bus::Bus::open(backend, home, settings, shutdown_rx)
            .await
            .context("opening the bus")?;
        let bus = Arc::new(bus);
        bus.sync_runtime();
        anyhow::Ok((bus, listener))
    })?;
    let local_addr = listener.local_addr()?;
    tracing::info!(bus = %local_addr, "bus listening");
    let serving = Arc::clone(&bus);
    // On a shared backend one instance serves the bus and the others stand by.
    let owner = (!bus.is_active()).then(|| {
        let instance = names::new_subscriber_id();
        Arc::new(owner::Owner::new(
            instance,
            local_addr.to_string(),
            bus.settings.takeover,
        ))
    });
    let thread = std::thread::Builder::new()
        .name("weir-bus-main".into())
        .spawn(move || run(runtime, listener, serving, owner))
        .context("starting the bus's thread")?;
    Ok(BusHandle {
        bus,
        shutdown: shutdown_tx,
        thread: parking_lot::Mutex::new(Some(thread)),
        local_addr,
    })
}

/// The bus's main thread: serves until the shutdown, then stops what runs, in order.
fn run(
    runtime: tokio::runtime::Runtime,
    listener: tokio::net::TcpListener,
    serving: Arc<bus::Bus>,
    owner: Option<Arc<owner::Owner>>,
) {
    let janitor = runtime.spawn(retention::janitor(Arc::clone(&serving)));
    let owning = owner
        .as_ref()
        .map(|o| runtime.spawn(Arc::clone(o).run(Arc::clone(&serving))));
    let shutdown = serving.shutdown.clone();
    runtime.block_on(api::serve(listener, Arc::clone(&serving), shutdown));
    // No taking over from now on (nor renewing, on JetStream: the hold lapses or is
    // given up below).
    if let Some(owning) = owning {
        owning.abort();
    }
    runtime.block_on(async {
        // A change in flight (its request may be gone) finishes before the runtime
        // stops, or it could be cut between its metadata and the backend; no new
        // one starts, the API being closed.
        let waited = tokio::time::timeout(CHANGE_GRACE, serving.hold_changes()).await;
        if waited.is_err() {
            tracing::warn!("a change of the bus's metadata did not finish in time");
        }
        drop(waited);
        // Deliveries in flight get STOP_GRACE; leased events go back.
        serving.drain_workers(STOP_GRACE).await;
        janitor.abort();
        // The workers stopped: an instance standing by may take over now.
        if let Some(owner) = owner {
            let _ = tokio::time::timeout(CHANGE_GRACE, owner.resign()).await;
        }
    });
    drop(serving);
    runtime.shutdown_timeout(STOP_GRACE);
}

impl BusHandle {
    /// The address the bus listens on (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Encodes the bus's figures onto a `/metrics` page; `stats` are the backend's
    /// queue figures the page gathered (lag and dead letters are read there; a queue
    /// left out counts nothing).
    pub fn encode_metrics(
        &self,
        stats: &[weir_backend::QueueStats],
        enc: &mut weir_backend::exposition::DescriptorEncoder<'_>,
    ) -> std::fmt::Result {
        metrics::snapshot(&self.bus, stats).encode(enc)
    }

    /// The bus's figures as Prometheus text, appended to `out` (for tests and tools:
    /// `weir serve` encodes them with the rest of its page, `encode_metrics`).
    pub fn render_metrics(&self, stats: &[weir_backend::QueueStats], out: &mut String) {
        out.push_str(&weir_backend::exposition::text(metrics::snapshot(
            &self.bus, stats,
        )));
    }

    /// Stops serving and delivering, and waits for it: connections finish the
    /// request in flight, deliveries in flight get `STOP_GRACE`, leased events go
    /// back to their queues (delivered again later: at-least-once). Blocks: call it
    /// off any async runtime's threads. Later calls do nothing.
    pub fn stop(&self) {
        let _ = self.shutdown.send(true);
        let thread = self.thread.lock().take();
        if let Some(thread) = thread {
            if thread.join().is_err() {
                tracing::error!("the bus's thread panicked");
            }
        }
    }
}

impl Drop for BusHandle {
    fn drop(&mut self) {
        self.stop();
    }
}
