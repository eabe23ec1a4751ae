//! HTTP beside the memcache port: `/health` for load balancers and `/metrics` in
//! Prometheus's text format, rendered at scrape time from the front door's counters
//! and the engine's stats (see `metrics.rs`); with an admin key, the proxy's
//! capture endpoints (`weir_proxy::tools::captures`).
//!
//! Served by `weir_http::Listener`, like the bus's API and the proxy: at most
//! `http_max_connections` connections at once (at the cap, the connection idle the
//! longest is closed for the newcomer, so idle sockets cannot lock clients out; one
//! more is refused only when all are in the middle of a request), and
//! `http_header_timeout_ms` for a client to send a request head (the connection is
//! closed after that), so that half-sent requests cannot pile up and hold memory.
//! On shutdown every connection is told to close once its request in flight is
//! answered; idle keep-alive connections close at once; what is still open after
//! `weir_http::STOP_GRACE` (2 s) is dropped.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use weir_http::Listener;
use weir_proxy::tools::captures::{self, CaptureApi};

use crate::shared::Shared;

/// How long a stop waits for the HTTP port's task: its drain's grace, and a little
/// for dropping what the grace left.
pub const STOP_WAIT: Duration = weir_http::STOP_GRACE.saturating_add(Duration::from_millis(250));

/// The HTTP port's limits.
#[derive(Clone, Copy, Debug)]
pub struct HttpLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    limits: HttpLimits,
) -> std::io::Result<()> {
    let captures = CaptureApi::new(
        Arc::clone(&shared.backend),
        shared
            .settings
            .admin_key
            .as_ref()
            .map(|k| k.expose().to_owned()),
        shared.proxy.clone(),
    );
    let app = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(Arc::clone(&shared))
        .merge(captures::router(Arc::clone(&captures)));
    let serving = Listener::new(
        "HTTP",
        limits.max_connections,
        limits.header_timeout,
        Arc::clone(&shared.metrics.http_connections_evicted),
    );
    let stop = async move {
        shared.shutdown.wait().await;
        captures.begin_shutdown();
    };
    serving.serve_http1(listener, stop, app).await;
    Ok(())
}

/// Binds `http_listen` and serves there until shutdown, on a task of its own: the
/// HTTP port of `weir proxy --http-listen` (`weir serve` binds it with its other
/// ports, in `server.rs`).
pub async fn spawn(
    shared: Arc<Shared>,
) -> anyhow::Result<tokio::task::JoinHandle<std::io::Result<()>>> {
    use anyhow::Context;
    let addr = shared.settings.http_listen.clone();
    let listener = TcpListener::bind(&addr)
        .await
        .with_context(|| format!("listening on {addr} (HTTP)"))?;
    tracing::info!(http = %listener.local_addr()?, "listening");
    let limits = HttpLimits {
        max_connections: shared.settings.http_max_connections,
        header_timeout: Duration::from_millis(shared.settings.http_header_timeout_ms),
    };
    Ok(tokio::spawn(serve(listener, shared, limits)))
}

async fn health(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    if shared.shutdown.is_triggered() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
    } else if !shared.backend.is_up() {
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
fn gather_stats(shared: &Arc<Shared>) -> Option<Gathering> {
    let mark = &shared.metrics_gathering;
    if mark.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return None;
    }
    let mark = GatheringMark(Arc::clone(mark));
    let shared = Arc::clone(shared);
    Some(tokio::spawn(async move {
        let _mark = mark;
        shared.backend.stats(None).await
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

async fn metrics(State(shared): State<Arc<Shared>>) -> Result<impl IntoResponse, Infallible> {
    // A backend out of reach would have `stats` retry for `unavailable_retry_ms` (10 s
    // by default), past a scraper's timeout: the page waits at most
    // METRICS_STATS_WAIT, and renders the door's own series without the queues'
    // then. The figures are gathered on a task of their own, which goes on past that
    // wait: on a cluster whose listing takes longer, it still fills the backend's
    // snapshot cache for the scrapes that follow. One runs at a time: a scrape that
    // finds one running renders without the queues' figures.
    let stats = match gather_stats(&shared) {
        None => {
            tracing::warn!(
                "/metrics: an earlier gathering of the backend's queue figures still runs"
            );
            Vec::new()
        }
        Some(gathering) => stats_within(gathering).await,
    };
    let metrics_shared = Arc::clone(&shared);
    // Thousands of queues make a large page: rendered off the event loop.
    let body = tokio::task::spawn_blocking(move || {
        let mut body = metrics_shared.metrics.render(&stats);
        metrics_shared.backend.render_metrics(&mut body);
        if let Some(bus) = &metrics_shared.bus {
            bus.render_metrics(&stats, &mut body);
        }
        if let Some(proxy) = &metrics_shared.proxy {
            proxy.render_metrics(&stats, &mut body);
        }
        body
    })
    .await
    .unwrap_or_else(|e| format!("# rendering failed: {e}\n"));
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    ))
}
