//! The bus's HTTP API: routemaster's endpoints, byte for byte where a client can tell,
//! and weir's additions (secrets, dead letters, replay).
//!
//! Handlers live in files named after what they manage (`tokens.rs`, `topics.rs`,
//! `subscriptions.rs`, `dead_letters.rs`, `replay.rs`, `health.rs`); what they share is
//! in leaves of its own (`credentials.rs` who a request is from, `body.rs` request and
//! response bodies); this file holds the router, the standby refusal and the accept
//! loop. Every refusal is an [`ApiError`]: a status and `{"error": MESSAGE}`.
//!
//! Served by `weir_http::Listener`, like the server's HTTP port and the proxy: at most
//! `connections_max` connections at once (at the cap, the connection idle the
//! longest is closed for the newcomer, so idle sockets cannot lock clients out; one
//! more is refused only when all are in the middle of a request) and
//! `header_timeout_ms` for a request head, so that idle or half-sent requests cannot
//! pile up. A stopping bus answers the requests in flight for up to
//! `weir_http::STOP_GRACE` (2 s), then drops them.

mod body;
mod credentials;
mod dead_letters;
mod health;
mod replay;
mod subscriptions;
mod tokens;
mod topics;

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{delete, get, post};
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;
use weir_http::Listener;

use crate::bus::Bus;
use crate::error::ApiError;

pub fn router(bus: Arc<Bus>) -> Router {
    Router::new()
        .route("/api_tokens", get(tokens::list).post(tokens::create))
        .route("/api_tokens/{token}", delete(tokens::remove))
        .route("/topics", get(topics::list))
        .route(
            "/topics/{name}",
            post(topics::publish).delete(topics::remove),
        )
        .route("/subscription", post(subscriptions::subscribe))
        .route(
            "/subscriber",
            post(subscriptions::subscribe).delete(subscriptions::unsubscribe),
        )
        .route("/subscriptions", get(subscriptions::list))
        .route("/subscribers", get(subscriptions::list))
        .route(
            "/subscriber/topics/{name}",
            delete(subscriptions::unsubscribe_topic),
        )
        .route("/subscriber/topics/{name}/replay", post(replay::replay))
        .route(
            "/subscriber/secret/rotate",
            post(subscriptions::rotate_secret),
        )
        .route(
            "/subscriber/dead_letters",
            get(dead_letters::list).delete(dead_letters::purge),
        )
        .route(
            "/subscriber/dead_letters/redrive",
            post(dead_letters::redrive),
        )
        .route("/pulse", get(health::pulse))
        .route("/pulse/scaling", get(health::pulse_scaling))
        .route("/health", get(health::health))
        .route("/health/ping", get(health::ping))
        .route("/health/ping.json", get(health::ping))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&bus),
            refuse_on_standby,
        ))
        .with_state(bus)
}

/// Every request, `/health` included, is answered 503 by an instance that does not serve
/// the bus (on JetStream, another instance does): a load balancer's health check sends
/// clients to the instance that serves.
async fn refuse_on_standby(
    axum::extract::State(bus): axum::extract::State<Arc<Bus>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if bus.is_active() {
        next.run(request).await
    } else {
        ApiError::standby().into_response()
    }
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such endpoint")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this endpoint",
    )
}

/// Serves the API on `listener` until `shutdown` turns true (or its sender is
/// dropped); then drains for `weir_http::STOP_GRACE`.
pub async fn serve(listener: TcpListener, bus: Arc<Bus>, mut shutdown: watch::Receiver<bool>) {
    let serving = Listener::new(
        "bus",
        bus.settings.connections_max,
        bus.settings.header_timeout,
        Arc::clone(&bus.api_connections_evicted),
    );
    let stop = async move {
        let _ = shutdown.changed().await;
    };
    serving.serve_http1(listener, stop, router(bus)).await;
}
