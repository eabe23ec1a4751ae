//! Request and response bodies: a request body read within its limits of size and
//! time, a JSON object from it, a JSON response body. A leaf, so that the router in
//! `mod.rs` and every handler use it without importing each other.

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::IntoResponse;

use crate::bus::Bus;
use crate::error::{ApiError, ApiResult};

/// Body limit of the requests that are not publishes (subscriptions, tokens, replay).
pub const REQUEST_BYTES_MAX: usize = 64 * 1024;

/// A JSON response body with its content type.
pub fn json_body(body: impl Into<String>) -> impl IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body.into(),
    )
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
