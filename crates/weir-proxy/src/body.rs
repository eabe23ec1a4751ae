//! The proxy's body type and the small bodies it makes itself: every request and
//! answer the proxy sends is a [`ProxyBody`], whether a client's streamed body, a
//! whole one, an empty one or a refusal's text. Also the reading of an answer whose
//! body is not used ([`drain`]). A leaf: it imports no file of the crate but the
//! capture's error type.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};

use crate::capture::BoxError;

pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// A body of these bytes, whole.
pub fn full(b: impl Into<Bytes>) -> ProxyBody {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

/// A body with nothing in it.
pub fn empty() -> ProxyBody {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// Bytes of an answer read before it is dropped (the answer is not used; reading a
/// little lets a small one end cleanly and keep its connection).
const DRAIN_BYTES_MAX: usize = 64 * 1024;

/// Reads and discards an answer's body, at most [`DRAIN_BYTES_MAX`] bytes and
/// `within`: a huge or endless answer is dropped, never held in memory.
pub async fn drain(mut body: hyper::body::Incoming, within: Duration) {
    let read = async {
        let mut seen = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |d| d.len());
            if seen > DRAIN_BYTES_MAX {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(within, read).await;
}
