//! `POST /subscriber/topics/:name/replay`: moves the caller's reader on a topic back
//! (or forward) to a sequence number or a time. Events from there on are delivered
//! again, with the ids they had. How far back it can go is what the topic keeps:
//! what some subscriber has not had, and `retention_ms` of history.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use serde_json::Value;
use weir_backend::SeekTo;

use super::body::{json_body, json_object, read_body, REQUEST_BYTES_MAX};
use super::credentials::client;
use crate::bus::Bus;
use crate::error::{ApiError, ApiResult};

/// Where to move to.
enum Target {
    Seq(u64),
    /// Unix milliseconds: the first event published at or after it.
    Since(u64),
}

/// `{"seq": N}` or `{"since": UNIX_MS}` -> 200 `{"seq": WHERE, "oldest": O, "next": N}`:
/// the reader now stands at `WHERE` (clamped to what the topic keeps, `oldest` to
/// `next`). An event id ends with its seq, so a receiver can name where to start.
pub async fn replay(
    State(bus): State<Arc<Bus>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> ApiResult<impl IntoResponse> {
    let token = client(&bus, &headers)?;
    let body = read_body(&bus, body, REQUEST_BYTES_MAX).await?;
    let data = json_object(&body)?;
    let target = match (data.get("seq"), data.get("since"), data.len()) {
        (Some(v), None, 1) => Target::Seq(whole(v, "seq")?),
        (None, Some(v), 1) => Target::Since(whole(v, "since")?),
        _ => {
            return Err(ApiError::bad_request(
                "need exactly one of `seq` (a sequence number) or `since` (Unix milliseconds)",
            ))
        }
    };
    // No change may delete or create the reader while it moves.
    let _held = bus.hold_changes().await;
    let id = bus
        .meta()
        .subscribers
        .get(&token)
        .filter(|s| s.topics.contains(&name))
        .map(|s| s.id.clone());
    let (Some(id), Some(rt)) = (id, bus.topic(&name)) else {
        return Err(ApiError::not_found("not subscribed"));
    };
    let to = match target {
        Target::Seq(s) => SeekTo::Seq(s),
        Target::Since(ms) => SeekTo::Time(ms),
    };
    let replaying = |e| ApiError::engine("replaying", &e);
    let at = rt.queue.seek_reader(&id, to).await.map_err(replaying)?;
    let Some(at) = at else {
        return Err(ApiError::not_found("not subscribed"));
    };
    let (oldest, next) = rt.queue.bounds().await.map_err(replaying)?;
    for worker in &rt.wake {
        worker.notify_one();
    }
    let body = serde_json::json!({ "seq": at, "oldest": oldest, "next": next });
    Ok(json_body(body.to_string()))
}

fn whole(v: &Value, field: &str) -> ApiResult<u64> {
    v.as_u64()
        .ok_or_else(|| ApiError::bad_request(format!("bad {field}: a whole number")))
}
