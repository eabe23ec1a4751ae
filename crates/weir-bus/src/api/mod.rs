//! The bus's HTTP API: routemaster's endpoints, byte for byte where a client can tell,
//! and weir's additions (secrets, dead letters, replay).
//!
//! Handlers live in files named after what they manage (`tokens.rs`, `topics.rs`,
//! `subscriptions.rs`, `dead_letters.rs`, `replay.rs`); this file holds the router,
//! the credentials checks and the accept loop. Every refusal is an [`ApiError`]:
//! a status and `{"error": MESSAGE}`.
//!
//! Served by `weir_http::Listener`, like the server's HTTP port and the proxy: at most
//! `connections_max` connections at once (at the cap, the connection idle the
//! longest is closed for the newcomer, so idle sockets cannot lock clients out; one
//! more is refused only when all are in the middle of a request) and
//! `header_timeout_ms` for a request head, so that idle or half-sent requests cannot
//! pile up. A stopping bus answers the requests in flight for up to
//! `weir_http::STOP_GRACE` (2 s), then drops them.

mod dead_letters;
mod replay;
mod subscriptions;
mod tokens;
mod topics;

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{delete, get, post};
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;
use weir_http::Listener;

use crate::auth::{basic_user, same_secret};
use crate::bus::Bus;
use crate::error::{ApiError, ApiResult};

/// Body limit of the requests that are not publishes (subscriptions, tokens, replay).
pub const REQUEST_BYTES_MAX: usize = 64 * 1024;

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
        .route("/pulse", get(pulse))
        .route("/pulse/scaling", get(pulse_scaling))
        .route("/health", get(health))
        .route("/health/ping", get(ping))
        .route("/health/ping.json", get(ping))
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

async fn pulse() -> StatusCode {
    StatusCode::NO_CONTENT
}

/// `GET /pulse/scaling` (any token): 204, a second late while at least
/// `scaling_threshold` events wait for subscribers. HireFire scales workers on this
/// endpoint's response time, as it did on routemaster's. The count is gathered at
/// most once a second, one gathering at a time, whoever asks.
async fn pulse_scaling(
    axum::extract::State(bus): axum::extract::State<Arc<Bus>>,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    caller(&bus, &headers)?;
    let waiting = {
        let mut cached = bus.waiting.lock().await;
        match *cached {
            Some((at, waiting)) if at.elapsed() < Duration::from_secs(1) => waiting,
            _ => {
                let meta = bus.meta();
                let stats = subscriptions::subscribed_stats(&bus, &meta).await?;
                let ids: std::collections::HashSet<&str> =
                    meta.subscribers.values().map(|s| s.id.as_str()).collect();
                // Every reader of a topic queue but the retention reader is a
                // subscriber's: its `items` are the events waiting for it.
                let waiting = stats
                    .iter()
                    .flat_map(|q| q.readers.iter())
                    .filter(|r| ids.contains(r.name.as_str()))
                    .fold(0u64, |sum, r| sum.saturating_add(r.items));
                *cached = Some((std::time::Instant::now(), waiting));
                waiting
            }
        }
    };
    if waiting >= bus.settings.scaling_threshold {
        if let Ok(_held) = bus.scaling_delays.try_acquire() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /health/ping` and `/health/ping.json` (no credentials): 200
/// `{"pong":"<now, RFC 3339>"}`, routemaster's liveness check.
async fn ping() -> impl IntoResponse {
    let now = humantime::format_rfc3339_millis(std::time::SystemTime::now());
    json_body(serde_json::json!({ "pong": now.to_string() }).to_string())
}

async fn health(axum::extract::State(bus): axum::extract::State<Arc<Bus>>) -> impl IntoResponse {
    if bus.is_shutting_down() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json_body(r#"{"error":"shutting down"}"#),
        )
    } else {
        (StatusCode::OK, json_body("{}"))
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

/// A JSON response body with its content type.
pub fn json_body(body: impl Into<String>) -> impl IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body.into(),
    )
}

/// Who a request is from.
pub enum Caller {
    Root,
    Client(String),
}

/// The caller when it is the root key or a client token; 401 otherwise.
pub fn caller(bus: &Bus, headers: &HeaderMap) -> ApiResult<Caller> {
    let user = basic_user(headers).ok_or_else(|| {
        ApiError::unauthorized("credentials required: HTTP Basic with a token as the user")
    })?;
    if let Some(root) = &bus.settings.root_key {
        if same_secret(root, &user) {
            return Ok(Caller::Root);
        }
    }
    if bus.meta().tokens.contains_key(&user) {
        return Ok(Caller::Client(user));
    }
    Err(ApiError::unauthorized("unknown token"))
}

/// The client token of a request; 401 for anything else (the root key included).
pub fn client(bus: &Bus, headers: &HeaderMap) -> ApiResult<String> {
    match caller(bus, headers)? {
        Caller::Client(token) => Ok(token),
        Caller::Root => Err(ApiError::unauthorized(
            "this needs a client token, not the root key",
        )),
    }
}

/// Succeeds for the root key only; 401 otherwise.
pub fn root(bus: &Bus, headers: &HeaderMap) -> ApiResult<()> {
    if bus.settings.root_key.is_none() {
        return Err(ApiError::unauthorized(
            "no root key is configured (bus.root_key or WEIR_BUS_ROOT_KEY)",
        ));
    }
    match caller(bus, headers) {
        Ok(Caller::Root) => Ok(()),
        _ => Err(ApiError::unauthorized("this needs the root key")),
    }
}

/// Reads a request body up to `limit` bytes within `header_timeout_ms` (the time a
/// client has for the head, and again for the body); 413 beyond the limit, 408 past
/// the time.
pub async fn read_body(bus: &Bus, body: Body, limit: usize) -> ApiResult<Bytes> {
    let within = bus.settings.header_timeout;
    let read = tokio::time::timeout(within, axum::body::to_bytes(body, limit));
    let read = read.await.map_err(|_| {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} ms",
                within.as_millis()
            ),
        )
    })?;
    read.map_err(|e| {
        if std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
        {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body over the limit of {limit} bytes"),
            )
        } else {
            ApiError::bad_request(format!("could not read the request body: {e}"))
        }
    })
}

/// A JSON object from a body; 400 with the parser's message otherwise.
pub fn json_object(body: &[u8]) -> ApiResult<serde_json::Map<String, serde_json::Value>> {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::bad_request(
            "bad data in payload: a JSON object is expected",
        )),
        Err(e) => Err(ApiError::bad_request(format!(
            "bad data in payload: invalid JSON ({e})"
        ))),
    }
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
