//! HTTP beside the memcache port: `/health` for load balancers and `/metrics` in
//! Prometheus's text format, rendered at scrape time from the front door's counters
//! and the engine's stats (see `metrics.rs`); with an admin key, the capture
//! endpoints of `captures.rs`.
//!
//! Its own accept loop rather than `axum::serve`, for two limits, kept by
//! `weir_backend::http_conns` like on the bus's and the proxy's listeners: at most
//! `http_max_connections` connections at once (at the cap, the connection idle the
//! longest is closed for the newcomer, so idle sockets cannot lock clients out; one
//! more is refused only when all are in the middle of a request), and
//! `http_header_timeout_ms` for a client to send a request head (the connection is
//! closed after that), so that half-sent requests cannot pile up and hold memory.
//! On shutdown every connection is told to close once its request in flight is
//! answered; idle keep-alive connections close at once.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use hyper::server::conn::http1;
use hyper::service::{service_fn, Service};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use weir_backend::http_conns::{Closing, MarkedBody, Slot, Slots};

use crate::shared::Shared;

/// Pause after a failed accept (typically EMFILE), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

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
    let app = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .merge(crate::captures::routes())
        .with_state(Arc::clone(&shared));
    let slots = Slots::new(
        limits.max_connections,
        limits.header_timeout,
        Arc::clone(&shared.metrics.http_connections_evicted),
    );
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shared.shutdown.wait() => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "HTTP accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Some(slot) = slots.admit() else {
            tracing::debug!(
                max = limits.max_connections,
                "HTTP connection refused: all open ones are in the middle of a request"
            );
            drop(stream);
            continue;
        };
        // Reap the ones that ended, so the set stays as small as what is open.
        while connections.try_join_next().is_some() {}
        let app = app.clone();
        let shared = Arc::clone(&shared);
        connections.spawn(async move {
            serve_connection(stream, app, &shared, limits.header_timeout, slot).await;
        });
    }
    drop(listener);
    // Told to close (see `serve_connection`); a request in flight gets its answer.
    while connections.join_next().await.is_some() {}
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

/// One connection until it closes, shutdown, or `slot` tells it to close (evicted
/// while idle, or no request head within `header_timeout`).
async fn serve_connection(
    stream: TcpStream,
    app: Router,
    shared: &Shared,
    header_timeout: Duration,
    slot: Slot,
) {
    let slot = Arc::new(slot);
    let marking = Arc::clone(&slot);
    let inner = TowerToHyperService::new(app);
    let service = service_fn(move |req| {
        let mark = marking.begin_request();
        let answer = inner.call(req);
        async move {
            answer
                .await
                .map(|r| r.map(|body| MarkedBody::new(body, mark)))
        }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        _ = shared.shutdown.wait() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        why = slot.closing() => {
            tracing::debug!(?why, "HTTP connection closed");
            if let (Closing::Evicted, Some(within)) = (why, slot.drain_after_eviction()) {
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(within, conn).await;
            }
            return;
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "HTTP connection ended with an error");
    }
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
