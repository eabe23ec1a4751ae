//! `/subscriber/dead_letters`: the events of batches that failed `attempts_max`
//! times, kept in the subscriber's dead-letter queue (`bus:dead:TOKEN`, events in
//! their delivered form). List them, re-drive them (deliver them again, ahead of new
//! events), or purge them.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use serde_json::value::RawValue;

use super::{client, json_body};
use crate::bus::Bus;
use crate::error::{ApiError, ApiResult};
use crate::names::dead_queue;

pub const LIST_DEFAULT: usize = 100;
pub const LIST_MAX: usize = 1_000;

/// The caller's dead-letter queue; 404 without a subscription.
fn queue(bus: &Bus, token: &str) -> ApiResult<weir::Queue> {
    let meta = bus.meta();
    let s = meta
        .subscribers
        .get(token)
        .ok_or_else(|| ApiError::not_found("subscriber not found"))?;
    bus.store
        .queue(&dead_queue(&s.id))
        .map_err(|e| ApiError::engine("opening the dead-letter queue", &e))
}

/// Dead letters waiting: the items of the queue's reader.
fn waiting(queue: &weir::Queue) -> u64 {
    queue
        .stats()
        .readers
        .iter()
        .find(|r| r.name.is_empty())
        .map_or(0, |r| r.items)
}

/// `GET /subscriber/dead_letters?limit=N`: `{"count": N, "events": [...]}`, the
/// oldest `limit` (default 100, at most 1,000) dead letters not yet re-driven.
pub async fn list(
    State(bus): State<Arc<Bus>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult<impl IntoResponse> {
    let token = client(&bus, &headers)?;
    let limit = match query.get("limit") {
        None => LIST_DEFAULT,
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|l| (1..=LIST_MAX).contains(l))
            .ok_or_else(|| ApiError::bad_request(format!("bad limit: 1 to {LIST_MAX}")))?,
    };
    let queue = queue(&bus, &token)?;
    let listed = tokio::task::spawn_blocking(move || -> weir::Result<(u64, Vec<Box<RawValue>>)> {
        let count = waiting(&queue);
        let mut events = Vec::new();
        for item in queue.iter()? {
            if events.len() >= limit {
                break;
            }
            let item = item?;
            let text = String::from_utf8(item.data.to_vec()).unwrap_or_default();
            if let Ok(raw) = RawValue::from_string(text) {
                events.push(raw);
            }
        }
        Ok((count, events))
    })
    .await
    .map_err(|e| ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    .map_err(|e| ApiError::engine("listing dead letters", &e))?;
    let body = serde_json::json!({ "count": listed.0, "events": listed.1 });
    Ok(json_body(body.to_string()))
}

/// `POST /subscriber/dead_letters/redrive`: `{"redriving": N}`. Every dead letter
/// there now is delivered again, ahead of new events; one that fails
/// `attempts_max` times again goes back to the dead-letter queue.
pub async fn redrive(
    State(bus): State<Arc<Bus>>,
    headers: HeaderMap,
) -> ApiResult<impl IntoResponse> {
    let token = client(&bus, &headers)?;
    let queue = queue(&bus, &token)?;
    let (_, next) = queue
        .seq_bounds()
        .map_err(|e| ApiError::engine("reading the dead-letter queue", &e))?;
    let count = waiting(&queue);
    bus.change(|meta| {
        let s = meta
            .subscribers
            .get_mut(&token)
            .ok_or_else(|| ApiError::not_found("subscriber not found"))?;
        s.redrive_below = next;
        Ok(())
    })
    .await?;
    Ok(json_body(
        serde_json::json!({ "redriving": count }).to_string(),
    ))
}

/// `DELETE /subscriber/dead_letters`: `{"purged": N}`; the dead letters are dropped.
pub async fn purge(
    State(bus): State<Arc<Bus>>,
    headers: HeaderMap,
) -> ApiResult<impl IntoResponse> {
    let token = client(&bus, &headers)?;
    let queue = queue(&bus, &token)?;
    let purged = tokio::task::spawn_blocking(move || queue.reader("").and_then(|r| r.flush()))
        .await
        .map_err(|e| ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| ApiError::engine("purging dead letters", &e))?;
    Ok(json_body(
        serde_json::json!({ "purged": purged }).to_string(),
    ))
}
