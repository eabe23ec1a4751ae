//! `/subscriber/dead_letters`: the events of batches that failed `attempts_max`
//! times, kept in the subscriber's dead-letter queue (`bus:dead:ID`, events in
//! their delivered form). List them, re-drive them (deliver them again, ahead of new
//! events), or purge them.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use serde_json::value::RawValue;
use weir_backend::{Kind, ScanFrom};

use super::body::json_body;
use super::credentials::client;
use crate::bus::Bus;
use crate::error::{ApiError, ApiResult};
use crate::event::dead_letter_listing;
use crate::names::dead_queue;

pub const LIST_DEFAULT: usize = 100;
pub const LIST_MAX: usize = 1_000;

/// The id of the caller's subscription; 404 without one.
fn subscriber_id(bus: &Bus, token: &str) -> ApiResult<String> {
    bus.meta()
        .subscribers
        .get(token)
        .map(|s| s.id.clone())
        .ok_or_else(|| ApiError::not_found("subscriber not found"))
}

/// Dead letters waiting: the items of the dead-letter queue's reader (none when the
/// queue is not there).
async fn waiting(bus: &Bus, id: &str) -> ApiResult<u64> {
    let stats = bus
        .backend
        .stats(Some(vec![dead_queue(id)]))
        .await
        .map_err(|e| ApiError::engine("reading the dead-letter queue", &e))?;
    Ok(stats
        .iter()
        .flat_map(|q| q.readers.iter())
        .find(|r| r.name.is_empty())
        .map_or(0, |r| r.items))
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
    let id = subscriber_id(&bus, &token)?;
    let count = waiting(&bus, &id).await?;
    let events = oldest(&bus, &id, limit)
        .await
        .map_err(|e| ApiError::engine("listing dead letters", &e))?;
    let body = dead_letter_listing(count, &events).map_err(|e| {
        tracing::error!(error = %e, "could not write the dead-letter listing");
        ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "listing dead letters: could not write the listing",
        )
    })?;
    Ok(json_body(body))
}

/// The oldest `limit` dead letters the queue keeps, walked without consuming them;
/// none when the queue is not there. An item that is not JSON is left out.
async fn oldest(bus: &Bus, id: &str, limit: usize) -> weir_backend::Result<Vec<Box<RawValue>>> {
    let mut scan = match bus.backend.scan(&dead_queue(id), ScanFrom::Oldest).await {
        Ok(scan) => scan,
        Err(e) if e.kind() == Kind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut events = Vec::new();
    while events.len() < limit {
        let page = scan.next_page(limit - events.len()).await?;
        if page.is_empty() {
            break;
        }
        for item in page {
            let text = String::from_utf8(item.data.to_vec()).unwrap_or_default();
            if let Ok(raw) = RawValue::from_string(text) {
                events.push(raw);
            }
        }
    }
    Ok(events)
}

/// `POST /subscriber/dead_letters/redrive`: `{"redriving": N}`. Every dead letter
/// there now is delivered again, ahead of new events; one that fails
/// `attempts_max` times again goes back to the dead-letter queue.
pub async fn redrive(
    State(bus): State<Arc<Bus>>,
    headers: HeaderMap,
) -> ApiResult<impl IntoResponse> {
    let token = client(&bus, &headers)?;
    let id = subscriber_id(&bus, &token)?;
    let queue = bus
        .backend
        .queue(&dead_queue(&id))
        .await
        .map_err(|e| ApiError::engine("opening the dead-letter queue", &e))?;
    let (_, next) = queue
        .bounds()
        .await
        .map_err(|e| ApiError::engine("reading the dead-letter queue", &e))?;
    let count = waiting(&bus, &id).await?;
    bus.change(|meta| {
        let s = meta
            .subscribers
            .get_mut(&token)
            .ok_or_else(|| ApiError::not_found("subscriber not found"))?;
        Arc::make_mut(s).redrive_below = next;
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
    let id = subscriber_id(&bus, &token)?;
    let purged = bus
        .backend
        .flush(&dead_queue(&id), Some(""))
        .await
        .map_err(|e| ApiError::engine("purging dead letters", &e))?;
    Ok(json_body(
        serde_json::json!({ "purged": purged }).to_string(),
    ))
}
