//! Capture: a request as the proxy stores it for replay, and the body wrapper that
//! streams a client's body to the primary while keeping a copy (up to the route's
//! `capture_bytes_max`, in memory within `body_memory_max`, else in a spill file:
//! `budget.rs`) and enforcing `body_bytes_max`.
//!
//! A captured request is one item of the route's queue `proxy:capture:ROUTE`: a
//! 4-byte big-endian length, that many bytes of JSON (method, path and query,
//! headers, time, and for a route that diffs, the primary's status and headers),
//! then the request's body as it came, then the primary's answer's body (its length
//! is in the JSON). Each shadow is a reader of the queue.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::budget::{CopyOff, CopySink, KeptBody};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request as captured.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Captured {
    pub method: String,
    /// Path and query, as the primary got them (the route's query rules applied;
    /// in older captures, as the client sent them).
    pub uri: String,
    /// Headers as the primary got them, less `Host` (see `host`): hop-by-hop ones
    /// gone, the forwarding headers added and the route's header rules applied
    /// (older captures: as the client sent them, less hop-by-hop ones and
    /// `remove_headers`); values that are not UTF-8 are left out.
    pub headers: Vec<(String, String)>,
    /// The `Host` the primary got when the route kept the client's
    /// (`preserve_host`) or set one (`host_rewrite`): replays send it too. `None`:
    /// a replay sends its target's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// When the proxy received it, Unix ms.
    pub at_ms: u64,
    #[serde(skip)]
    pub body: Bytes,
    /// The primary's answer, kept when a shadow of the route diffs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<CapturedResponse>,
}

/// The primary's answer to a captured request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapturedResponse {
    pub status: u16,
    /// Headers less the hop-by-hop ones; values that are not UTF-8 are left out.
    pub headers: Vec<(String, String)>,
    /// False when the body was over `capture_bytes_max` or broke off: `body` is
    /// then empty and not compared.
    pub body_whole: bool,
    /// The body's length in the item (it follows the request's body).
    pub body_len: u64,
    #[serde(skip)]
    pub body: Bytes,
}

/// Header JSON longer than this is refused when decoding (a damaged item).
const HEAD_BYTES_MAX: usize = 1024 * 1024;

impl Captured {
    pub fn encode(&self) -> Vec<u8> {
        let (mut out, answer) = self.encode_head(self.body.len());
        out.extend_from_slice(&self.body);
        out.extend_from_slice(answer);
        out
    }

    /// The item's start (its head's length and the head), with room for the rest:
    /// a body of `body_len` bytes then the answer's, which is returned.
    pub fn encode_head(&self, body_len: usize) -> (Vec<u8>, &[u8]) {
        // The answer's length in the head is its body's, whatever the field says:
        // `decode` splits the two bodies by it.
        let fixed;
        let this = match &self.response {
            Some(r) if r.body_len != r.body.len() as u64 => {
                fixed = Captured {
                    response: Some(CapturedResponse {
                        body_len: r.body.len() as u64,
                        ..r.clone()
                    }),
                    ..self.clone()
                };
                &fixed
            }
            _ => self,
        };
        let head = serde_json::to_vec(this).unwrap_or_default();
        let answer = self.response.as_ref().map_or(&[][..], |r| &r.body[..]);
        let mut out = Vec::with_capacity(4 + head.len() + body_len + answer.len());
        out.extend_from_slice(&(head.len() as u32).to_be_bytes());
        out.extend_from_slice(&head);
        (out, answer)
    }

    pub fn decode(item: &Bytes) -> Result<Captured, String> {
        let len = item
            .get(..4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or("a captured request shorter than its length")?;
        if len > HEAD_BYTES_MAX || item.len() < 4 + len {
            return Err("a captured request with a bad head length".into());
        }
        let mut c: Captured = serde_json::from_slice(&item[4..4 + len])
            .map_err(|e| format!("a captured request's head: {e}"))?;
        let bodies = item.slice(4 + len..);
        let answer_len = c.response.as_ref().map_or(0, |r| r.body_len);
        let split = usize::try_from(answer_len)
            .ok()
            .and_then(|n| bodies.len().checked_sub(n))
            .ok_or("a captured request with a bad answer length")?;
        c.body = bodies.slice(..split);
        if let Some(r) = &mut c.response {
            r.body = bodies.slice(split..);
        }
        Ok(c)
    }
}

/// How a teed body ended.
#[derive(Debug)]
pub enum BodyEnd {
    /// Whole, and within the capture limit.
    Complete(KeptBody),
    /// Whole, but larger than the capture limit: not kept.
    TooLargeToCapture,
    /// Whole, but not kept: no room in `body_memory_max` and no spill file.
    OverBudget,
    /// Not read to its end (the client or the target stopped), or broken.
    Incomplete,
}

/// What became of a client's body as it streamed to the target: when the target's
/// request fails, this says whether the client's body was the cause.
#[derive(Debug, Default)]
pub struct BodyState {
    /// It passed `body_bytes_max`.
    pub too_large: AtomicBool,
    /// Reading it failed: it broke off, or was malformed (a bad chunk).
    pub broken: AtomicBool,
}

/// Streams `inner` on, keeping a copy up to `capture_max` bytes in `copy`, and
/// fails past `body_max` bytes (setting `too_large`, so the proxy answers 413); a
/// failure to read `inner` sets `broken` (the proxy answers 400).
pub struct TeeBody<B> {
    inner: B,
    copy: Option<CopySink>,
    /// The body's whole length, when it is known.
    expected: Option<u64>,
    seen: u64,
    capture_max: u64,
    body_max: u64,
    state: Arc<BodyState>,
    end: Option<oneshot::Sender<BodyEnd>>,
}

impl<B: Body> TeeBody<B> {
    /// `copy` with the limit of what it keeps, or none kept.
    pub fn new(
        inner: B,
        copy: Option<(CopySink, u64)>,
        body_max: u64,
    ) -> (TeeBody<B>, Arc<BodyState>, oneshot::Receiver<BodyEnd>) {
        let (tx, rx) = oneshot::channel();
        let state = Arc::new(BodyState::default());
        let capture_max = copy.as_ref().map_or(0, |c| c.1);
        let body = TeeBody {
            expected: inner.size_hint().exact().filter(|n| *n <= capture_max),
            inner,
            copy: copy.map(|c| c.0),
            seen: 0,
            capture_max,
            body_max,
            state: Arc::clone(&state),
            end: Some(tx),
        };
        (body, state, rx)
    }
}

impl<B> TeeBody<B> {
    fn finish(&mut self, end: BodyEnd) {
        if let Some(tx) = self.end.take() {
            let _ = tx.send(end);
        }
    }

    /// The end once the whole body has passed.
    fn whole(&mut self) -> BodyEnd {
        match self.copy.take().map(CopySink::finish) {
            Some(Ok(kept)) => BodyEnd::Complete(kept),
            Some(Err(CopyOff::OverBudget)) => BodyEnd::OverBudget,
            Some(Err(CopyOff::TooLarge)) | None => BodyEnd::TooLargeToCapture,
        }
    }
}

impl<B> Drop for TeeBody<B> {
    fn drop(&mut self) {
        self.finish(BodyEnd::Incomplete);
    }
}

#[derive(Debug)]
struct BodyTooLarge(u64);

impl std::fmt::Display for BodyTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "request body over the limit of {} bytes", self.0)
    }
}

impl std::error::Error for BodyTooLarge {}

impl<B> Body for TeeBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                let end = this.whole();
                this.finish(end);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                this.state.broken.store(true, Relaxed);
                this.finish(BodyEnd::Incomplete);
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.seen += data.len() as u64;
                    if this.seen > this.body_max {
                        this.state.too_large.store(true, Relaxed);
                        this.finish(BodyEnd::Incomplete);
                        return Poll::Ready(Some(Err(Box::new(BodyTooLarge(this.body_max)))));
                    }
                    if let Some(copy) = &mut this.copy {
                        if this.seen > this.capture_max {
                            copy.give_up();
                        } else {
                            copy.push(data, this.expected);
                        }
                    }
                }
                // A body of known length is not polled past its last byte: it is
                // whole once the inner body says so.
                if this.inner.is_end_stream() {
                    let end = this.whole();
                    this.finish(end);
                }
                Poll::Ready(Some(Ok(frame)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    #[test]
    fn a_captured_request_round_trips() {
        let c = Captured {
            method: "POST".into(),
            uri: "/a?b=1".into(),
            headers: vec![("content-type".into(), "text/plain".into())],
            at_ms: 5,
            host: None,
            body: Bytes::from_static(b"hello\x00\xff"),
            response: None,
        };
        let item = Bytes::from(c.encode());
        assert_eq!(Captured::decode(&item).unwrap(), c);
        let mut with_answer = c.clone();
        with_answer.response = Some(CapturedResponse {
            status: 201,
            headers: vec![("x".into(), "y".into())],
            body_whole: true,
            body_len: 3,
            body: Bytes::from_static(b"abc"),
        });
        let item = Bytes::from(with_answer.encode());
        assert_eq!(Captured::decode(&item).unwrap(), with_answer);
        // A wrong length in the field is not trusted: the body's own is written.
        let mut wrong = with_answer.clone();
        if let Some(r) = &mut wrong.response {
            r.body_len = 1;
        }
        let back = Captured::decode(&Bytes::from(wrong.encode())).unwrap();
        assert_eq!(back, with_answer);
        // An answer length past the item's end is refused, not sliced out of bounds.
        let mut head = serde_json::to_vec(&with_answer).unwrap();
        let text = String::from_utf8(head.clone())
            .unwrap()
            .replace("\"body_len\":3", "\"body_len\":99");
        head = text.into_bytes();
        let mut bad = (head.len() as u32).to_be_bytes().to_vec();
        bad.extend_from_slice(&head);
        bad.extend_from_slice(b"hello");
        assert!(Captured::decode(&Bytes::from(bad)).is_err());
        assert!(Captured::decode(&Bytes::from_static(b"\x00\x00")).is_err());
        assert!(Captured::decode(&Bytes::from_static(b"\x00\x00\x01\x00{}")).is_err());
        assert!(Captured::decode(&Bytes::from_static(b"\x00\x00\x00\x02{x")).is_err());
    }

    #[tokio::test]
    async fn the_tee_keeps_a_copy_within_limits() {
        let budget = crate::budget::Budget::new(1000, std::env::temp_dir());
        let copy = |max| Some((CopySink::new(&budget, true), max));
        let (body, _, end) = TeeBody::new(Full::new(Bytes::from_static(b"abc")), copy(10), 100);
        assert_eq!(body.collect().await.unwrap().to_bytes(), "abc");
        assert!(
            matches!(end.await.unwrap(), BodyEnd::Complete(KeptBody::Memory(b, _)) if b == "abc")
        );
        let (body, _, end) = TeeBody::new(Full::new(Bytes::from_static(b"abcdef")), copy(3), 100);
        assert_eq!(body.collect().await.unwrap().to_bytes(), "abcdef");
        assert!(matches!(end.await.unwrap(), BodyEnd::TooLargeToCapture));
        let (body, too_large, end) =
            TeeBody::new(Full::new(Bytes::from_static(b"abcdef")), copy(3), 4);
        assert!(body.collect().await.is_err());
        assert!(too_large.too_large.load(Relaxed));
        assert!(matches!(end.await.unwrap(), BodyEnd::Incomplete));
    }
}
