//! The endpoints that tell whether the bus is up and busy: `/pulse`, `/pulse/scaling`
//! (HireFire's scaling signal), `/health` and routemaster's `/health/ping`.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;

use super::body::json_body;
use super::credentials::caller;
use super::subscriptions::subscribed_stats;
use crate::bus::Bus;
use crate::error::ApiResult;

/// `GET /pulse` (no credentials): 204, routemaster's "the bus is up".
pub async fn pulse() -> StatusCode {
    StatusCode::NO_CONTENT
}

/// `GET /pulse/scaling` (any token): 204, a second late while at least
/// `scaling_threshold` events wait for subscribers. HireFire scales workers on this
/// endpoint's response time, as it did on routemaster's. The count is gathered at
/// most once a second, one gathering at a time, whoever asks.
pub async fn pulse_scaling(
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
                let stats = subscribed_stats(&bus, &meta).await?;
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
pub async fn ping() -> impl IntoResponse {
    let now = humantime::format_rfc3339_millis(std::time::SystemTime::now());
    json_body(serde_json::json!({ "pong": now.to_string() }).to_string())
}

/// `GET /health` (no credentials): 200 `{}`; 503 `{"error":"shutting down"}` once the
/// bus is stopping.
pub async fn health(
    axum::extract::State(bus): axum::extract::State<Arc<Bus>>,
) -> impl IntoResponse {
    if bus.is_shutting_down() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json_body(r#"{"error":"shutting down"}"#),
        )
    } else {
        (StatusCode::OK, json_body("{}"))
    }
}
