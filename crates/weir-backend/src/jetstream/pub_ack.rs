//! A publish's answer, the PubAck: the stream sequence the message was stored at, or
//! the cluster's error.
//!
//! A leaf: appends (`queue.rs`), lease records (`records.rs`), instance beacons
//! (`instances.rs`) and the map (`map.rs`) all publish and read it.

use serde::Deserialize;

use super::errors::ApiError;

/// `{"stream", "seq", "duplicate"}` or `{"error"}`.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct PubAck {
    pub seq: u64,
    pub error: Option<ApiError>,
}

impl PubAck {
    /// Whether `payload` is a PubAck saying the message was stored.
    pub(crate) fn stored(payload: &[u8]) -> bool {
        matches!(serde_json::from_slice::<PubAck>(payload), Ok(a) if a.error.is_none() && a.seq > 0)
    }
}
