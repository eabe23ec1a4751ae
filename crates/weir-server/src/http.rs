//! HTTP beside the memcache port: `/health` for load balancers and `/metrics` in
//! Prometheus's text format, rendered at scrape time from the front door's counters
//! and the engine's stats (see `metrics.rs`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use crate::server::Shared;

pub async fn serve(listener: TcpListener, shared: Arc<Shared>) -> std::io::Result<()> {
    let app = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(Arc::clone(&shared));
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shared.shutdown.wait().await })
        .await
}

async fn health(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    if shared.shutdown.is_triggered() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
    } else {
        (StatusCode::OK, "ok\n")
    }
}

async fn metrics(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let body = shared.metrics.render(&shared.store);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
}
