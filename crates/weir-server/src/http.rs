//! The HTTP port, beside the doors: `/health` for load balancers and `/metrics` in
//! Prometheus's text format, rendered at scrape time from every running door's
//! counters and the backend's stats (see `metrics.rs`); with an admin key, the proxy's
//! capture endpoints (`weir_proxy::tools::captures`).
//!
//! Served by `weir_http::Listener`, like the bus's API and the proxy: at most
//! `http_connections_max` connections at once (at the cap, the connection idle the
//! longest is closed for the newcomer, so idle sockets cannot lock clients out; one
//! more is refused only when all are in the middle of a request), and
//! `http_header_timeout_ms` for a client to send a request head (the connection is
//! closed after that), so that half-sent requests cannot pile up and hold memory.
//! On shutdown every connection is told to close once its request in flight is
//! answered; idle keep-alive connections close at once; what is still open after
//! `weir_http::STOP_GRACE` (2 s) is dropped.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;
use weir_backend::exposition::{self, Collector, DescriptorEncoder};
use weir_http::Listener;
use weir_proxy::tools::captures::{self, CaptureApi};

use crate::doors::Door;

/// How long a stop waits for the HTTP port's task: its drain's grace, and a little
/// for dropping what the grace left.
pub const STOP_WAIT: Duration = weir_http::STOP_GRACE.saturating_add(Duration::from_millis(250));

/// The HTTP port's limits.
#[derive(Clone, Copy, Debug)]
pub struct HttpLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// What the HTTP port serves from: the backend and the running doors, for `/health`
/// and `/metrics`; the proxy's capture endpoints bring their own state.
pub struct HttpPort {
    pub backend: Arc<weir_backend::Backend>,
    /// The memcache door, when it runs (its series come first; at zero without it).
    pub memcache: Option<Arc<weir_memcache::MemcacheDoor>>,
    /// The other running doors (the bus, the proxy), in the order of their series.
    pub doors: Vec<Arc<dyn Door>>,
    /// The capture endpoints' state (merged into this port's router).
    pub captures: Arc<CaptureApi>,
    /// Turns true when the process begins to stop.
    pub stopping: watch::Receiver<bool>,
    /// Idle connections closed at `http_connections_max` for a new one (shared with
    /// the port's `weir_http::http_conns::Slots`).
    pub evicted: Arc<AtomicU64>,
    /// A `/metrics` gathering of the backend's figures is running (at most one).
    pub gathering: Arc<AtomicBool>,
}

/// Serves the HTTP port on `listener` until `port.stopping` turns true.
pub async fn serve(
    listener: TcpListener,
    port: Arc<HttpPort>,
    limits: HttpLimits,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(Arc::clone(&port))
        .merge(captures::router(Arc::clone(&port.captures)));
    let serving = Listener::new(
        "HTTP",
        limits.max_connections,
        limits.header_timeout,
        Arc::clone(&port.evicted),
    );
    let mut stopping = port.stopping.clone();
    let captures = Arc::clone(&port.captures);
    let stop = async move {
        let _ = stopping.wait_for(|v| *v).await;
        captures.begin_shutdown();
    };
    serving.serve_http1(listener, stop, app).await;
    Ok(())
}

async fn health(State(port): State<Arc<HttpPort>>) -> impl IntoResponse {
    if *port.stopping.borrow() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
    } else if !port.backend.is_up() {
        // A readiness check: on JetStream with the cluster out of reach every
        // command waits, then fails; a load balancer should send clients elsewhere.
        (StatusCode::SERVICE_UNAVAILABLE, "backend unavailable\n")
    } else {
        (StatusCode::OK, "ok\n")
    }
}

/// How long `/metrics` waits for the backend's queue figures.
const METRICS_STATS_WAIT: Duration = Duration::from_secs(2);

type Gathering = tokio::task::JoinHandle<weir_backend::Result<Vec<weir_backend::QueueStats>>>;

/// Clears the "gathering" mark when its task ends, however it ends.
struct GatheringMark(Arc<std::sync::atomic::AtomicBool>);

impl Drop for GatheringMark {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
}

/// Starts gathering the backend's queue figures on a task of its own, unless one
/// runs already.
fn gather_stats(port: &Arc<HttpPort>) -> Option<Gathering> {
    let mark = &port.gathering;
    if mark.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return None;
    }
    let mark = GatheringMark(Arc::clone(mark));
    let backend = Arc::clone(&port.backend);
    Some(tokio::spawn(async move {
        let _mark = mark;
        backend.stats(None).await
    }))
}

/// The gathered figures, if they come within [`METRICS_STATS_WAIT`]; none otherwise.
async fn stats_within(gathering: Gathering) -> Vec<weir_backend::QueueStats> {
    match tokio::time::timeout(METRICS_STATS_WAIT, gathering).await {
        Ok(Ok(Ok(stats))) => stats,
        Ok(Ok(Err(e))) => {
            tracing::warn!(error = %e, "/metrics: the backend's queue figures");
            Vec::new()
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "/metrics: gathering the backend's queue figures failed");
            Vec::new()
        }
        Err(_) => {
            tracing::warn!(
                wait_ms = METRICS_STATS_WAIT.as_millis() as u64,
                "/metrics: the backend's queue figures did not come in time"
            );
            Vec::new()
        }
    }
}

async fn metrics(State(port): State<Arc<HttpPort>>) -> Result<impl IntoResponse, Infallible> {
    // A backend out of reach would have `stats` retry for `unavailable_retry_ms` (10 s
    // by default), past a scraper's timeout: the page waits at most
    // METRICS_STATS_WAIT, and renders the door's own series without the queues'
    // then. The figures are gathered on a task of their own, which goes on past that
    // wait: on a cluster whose listing takes longer, it still fills the backend's
    // snapshot cache for the scrapes that follow. One runs at a time: a scrape that
    // finds one running renders without the queues' figures.
    let stats = match gather_stats(&port) {
        None => {
            tracing::warn!(
                "/metrics: an earlier gathering of the backend's queue figures still runs"
            );
            Vec::new()
        }
        Some(gathering) => stats_within(gathering).await,
    };
    // Thousands of queues make a large page: encoded off the event loop.
    let body = tokio::task::spawn_blocking(move || exposition::text(Page { port, stats }))
        .await
        .unwrap_or_else(|e| format!("# rendering failed: {e}\n"));
    Ok(([(header::CONTENT_TYPE, exposition::CONTENT_TYPE)], body))
}

/// The page at one scrape: the memcache door's series (at zero when it does not
/// run) with the HTTP port's among them, every queue's and reader's, the backend's,
/// then each other door's; in the order the page has always had. One collector
/// over all of them, so one encoder writes the page.
struct Page {
    port: Arc<HttpPort>,
    stats: Vec<weir_backend::QueueStats>,
}

impl std::fmt::Debug for Page {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Page")
            .field("queues", &self.stats.len())
            .finish_non_exhaustive()
    }
}

impl Collector for Page {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let (port, stats) = (&self.port, &self.stats);
        let evicted = port.evicted.load(Ordering::Relaxed);
        let http =
            |enc: &mut DescriptorEncoder<'_>| crate::metrics::encode_http_evicted(evicted, enc);
        match &port.memcache {
            Some(memcache) => memcache.encode_metrics(&mut enc, http)?,
            None => weir_memcache::encode_idle_metrics(&mut enc, http)?,
        }
        crate::metrics::encode_queues(stats, &mut enc)?;
        port.backend.encode_metrics(&mut enc)?;
        for door in &port.doors {
            door.encode_metrics(stats, &mut enc)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The families of a page without the memcache door and the other doors, in the
    /// order `weir serve` and `weir proxy --http-listen` have always shown them.
    const FAMILIES: [&str; 30] = [
        "weir_connections",
        "weir_connections_total",
        "weir_connections_refused_total",
        "weir_http_connections_evicted_total",
        "weir_bytes_read_total",
        "weir_bytes_written_total",
        "weir_get_hits_total",
        "weir_get_misses_total",
        "weir_commands_total",
        "weir_request_duration_seconds",
        "weir_queue_items",
        "weir_queue_bytes",
        "weir_queue_appended_total",
        "weir_queue_expired_total",
        "weir_queue_discarded_total",
        "weir_queue_dead_lettered_total",
        "weir_queue_open_leases",
        "weir_queue_waiters",
        "weir_queue_oldest_age_ms",
        "weir_queue_disk_bytes",
        "weir_reader_items",
        "weir_reader_bytes",
        "weir_reader_taken_total",
        "weir_reader_confirmed_total",
        "weir_reader_expired_total",
        "weir_reader_discarded_total",
        "weir_reader_dead_lettered_total",
        "weir_reader_open_leases",
        "weir_reader_waiters",
        "weir_reader_oldest_age_ms",
    ];

    #[test]
    fn the_page_keeps_its_families_and_their_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = weir::Store::open_with(dir.path(), weir::StoreOptions::default()).unwrap();
        let backend = Arc::new(weir_backend::Backend::Embedded(
            weir_backend::Embedded::new(store),
        ));
        let (_stopping_tx, stopping) = watch::channel(false);
        let port = Arc::new(HttpPort {
            backend: Arc::clone(&backend),
            memcache: None,
            doors: Vec::new(),
            captures: CaptureApi::new(Arc::clone(&backend), None, None),
            stopping,
            evicted: Arc::new(AtomicU64::new(3)),
            gathering: Default::default(),
        });
        let page = exposition::text(Page {
            port,
            stats: Vec::new(),
        });
        let families: Vec<&str> = page
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .filter(|name| !name.starts_with("weir_backend") && !name.starts_with("weir_store"))
            .collect();
        assert_eq!(families[..FAMILIES.len()], FAMILIES, "{page}");
        assert!(
            page.contains("\nweir_http_connections_evicted_total 3\n"),
            "{page}"
        );
        assert!(page.contains("\nweir_connections 0\n"), "{page}");
    }
}
