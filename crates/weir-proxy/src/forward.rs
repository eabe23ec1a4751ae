//! Forwarding: route a client's request, send it to a target, stream the answer
//! back, and capture it for the route's shadows. The client's request never waits
//! for a shadow: capturing is one append to the route's queue after the body has
//! passed, on its own task, and a failure to capture is counted, never answered.
//!
//! Refusals carry `x-weir-proxy-error` with the reason: 400 for a request framed
//! wrongly (`framing.rs`) or a body that broke off or was malformed, 501 for a
//! transfer coding other than `chunked`, 404 when no route matches, 405 for
//! `CONNECT`, 413 over `body_bytes_max`, 502 when no target answers (or one answers
//! `101` to a request that did not upgrade), 504 when the target does not answer
//! within `request_timeout_ms`. Answers go out in the client's HTTP version, whatever
//! the target's: an HTTP/1.0 status line would end a keep-alive client's connection.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_LENGTH, HOST};
use hyper::{Request, Response, StatusCode};

use crate::body::{empty, full, ProxyBody};
use crate::budget::{Budget, CopySink, KeptBody, Reservation};
use crate::capture::{BodyEnd, BodyState, Captured, CapturedResponse, TeeBody};
use crate::client::error_chain;
use crate::config::{RouteSettings, Target};
use crate::headers;
use crate::refusal::refusal;
use crate::route::{matches, LiveRoute};
use crate::upstream::{from_target, rewrite_query, upstream_request};

/// A request with a larger body (or a streamed one) goes on a connection that is
/// not used again. A target that answers without reading a large body closes the
/// connection once it has drained it (hyper's server does so past 64 KiB), and a
/// pooled connection closing under the next request would fail that request: a
/// new connection for such a request is cheap next to its body.
pub const POOLED_BODY_BYTES_MAX: usize = 32 * 1024;

pub struct Proxy {
    pub routes: Vec<LiveRoute>,
    /// Where the capture queues live: the embedded engine or a JetStream cluster.
    pub backend: Arc<weir_backend::Backend>,
    /// Captures waiting for their body or their append: a stop waits for them.
    pub captures_in_flight: Arc<std::sync::atomic::AtomicUsize>,
    /// Body bytes held in memory, proxy-wide (`body_memory_max`).
    pub budget: Arc<Budget>,
}

impl Proxy {
    /// Waits until no capture is in flight, or `within` has passed.
    pub async fn captures_settled(&self, within: Duration) {
        let until = tokio::time::Instant::now() + within;
        while self.captures_in_flight.load(Relaxed) > 0 && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Counts a capture in flight while it lives.
struct InFlight(Arc<std::sync::atomic::AtomicUsize>);

impl InFlight {
    fn new(count: &Arc<std::sync::atomic::AtomicUsize>) -> InFlight {
        count.fetch_add(1, Relaxed);
        InFlight(Arc::clone(count))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// Serves one request that arrived on `listener` from `client`.
pub async fn handle(
    proxy: Arc<Proxy>,
    listener: Arc<str>,
    client: SocketAddr,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    if let Some(refused) = crate::framing::check(&req) {
        return refused;
    }
    if req.method() == hyper::Method::CONNECT {
        // A tunnel to wherever the client names, past the routes: never.
        return refusal(StatusCode::METHOD_NOT_ALLOWED, "CONNECT is not proxied");
    }
    let host = req
        .headers()
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()))
        .map(str::to_string);
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let Some(route) = proxy.routes.iter().find(|r| {
        matches(
            &r.settings,
            &r.pattern,
            &listener,
            &method,
            host.as_deref(),
            &path,
        )
    }) else {
        let reason = format!(
            "no route matches {method} {} {path}",
            host.as_deref().unwrap_or("-")
        );
        return refusal(StatusCode::NOT_FOUND, &reason);
    };
    route.counters.requests.fetch_add(1, Relaxed);
    // Any other upgrade is dropped with the hop-by-hop headers: a plain request.
    if crate::upgrade::websocket(route, &req) {
        let response = crate::upgrade::forward(route, client, req).await;
        route.counters.count_status(response.status());
        return response;
    }
    let response = forward(&proxy, route, client, req).await;
    route.counters.count_status(response.status());
    response
}

/// Whether a request has no body to send, from the body itself (a chunked HTTP/1.1
/// body or an HTTP/2 one has no length header, and `Transfer-Encoding` is gone by
/// the time this is asked).
fn bodyless(body: &Incoming) -> bool {
    use http_body::Body as _;
    body.is_end_stream() || body.size_hint().exact() == Some(0)
}

fn idempotent(method: &hyper::Method) -> bool {
    use hyper::Method;
    [
        Method::GET,
        Method::HEAD,
        Method::OPTIONS,
        Method::PUT,
        Method::DELETE,
        Method::TRACE,
    ]
    .contains(method)
}

async fn forward(
    proxy: &Proxy,
    route: &LiveRoute,
    client: SocketAddr,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let s = &route.settings;
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > s.body_bytes_max) {
        return too_large(s);
    }
    let (mut head, body) = req.into_parts();
    headers::remove_hop_by_hop(&mut head.headers);
    // The proxy takes the body whatever the target would say: hyper answers `100
    // Continue` to the client when the body is first read.
    head.headers.remove(hyper::header::EXPECT);
    match outgoing_body(proxy, route, &head, client, declared, body).await {
        Ok((out, answer_to)) => {
            let (response, from_target) = send(route, &head, client, out).await;
            match answer_to {
                Some(tx) if from_target => with_answer_captured(proxy, route, tx, response),
                // An answer the proxy made itself is not captured; nor is any when
                // the client goes away first (the sender is dropped with this
                // future): the capture goes on without one.
                _ => response,
            }
        }
        Err(refused) => refused,
    }
}

/// A capture waiting for its request's body (and, for a route that diffs, the
/// primary's answer).
struct Pending {
    queue: weir_backend::Queue,
    captured: Captured,
    end: Option<tokio::sync::oneshot::Receiver<BodyEnd>>,
    in_flight: InFlight,
    budget: Arc<Budget>,
}

/// Hands the capture of a route that diffs the primary's answer: status, headers
/// and, as it streams to the client, its body up to `capture_bytes_max`.
fn with_answer_captured(
    proxy: &Proxy,
    route: &LiveRoute,
    answer_to: AnswerSender,
    response: Response<ProxyBody>,
) -> Response<ProxyBody> {
    let (parts, body) = response.into_parts();
    let head = CapturedResponse {
        status: parts.status.as_u16(),
        headers: crate::differ::header_pairs(&parts.headers),
        body_whole: false,
        body_len: 0,
        body: Bytes::new(),
    };
    use http_body::Body as _;
    let (body, answer_end) = if body.is_end_stream() {
        // hyper may never poll an empty body: it is whole as it is.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let _ = tx.send(BodyEnd::Complete(KeptBody::Memory(Bytes::new(), None)));
        (body, rx)
    } else {
        // Within the budget or not kept (never spilled): the answer is then not
        // compared.
        let copy = CopySink::new(&proxy.budget, false);
        let copy = Some((copy, route.settings.capture_bytes_max));
        let (tee, _, end) = TeeBody::new(body, copy, u64::MAX);
        (tee.boxed(), end)
    };
    let _ = answer_to.send((head, answer_end));
    Response::from_parts(parts, body)
}

fn too_large(s: &RouteSettings) -> Response<ProxyBody> {
    refusal(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("request body over the limit of {} bytes", s.body_bytes_max),
    )
}

/// The body a target gets: none, whole (can be sent again), or streamed.
struct Outgoing {
    whole: Option<Bytes>,
    stream: Option<ProxyBody>,
    /// What became of a streamed body (past `body_bytes_max`, broken).
    state: Option<Arc<BodyState>>,
}

/// Prepares the body and starts its capture. A body of known length within the
/// capture limit is read whole first, when `body_memory_max` has room for it (and
/// for its capture), then sent in one go: a target that answers without reading it
/// (and closes) cannot then make the proxy lose its answer to a broken pipe
/// mid-body, and an idempotent request can be sent again. Any other body streams to
/// the target as it arrives, its capture's copy kept by a [`CopySink`].
async fn outgoing_body(
    proxy: &Proxy,
    route: &LiveRoute,
    head: &hyper::http::request::Parts,
    client: SocketAddr,
    declared: Option<u64>,
    body: Incoming,
) -> Result<(Outgoing, Option<AnswerSender>), Response<ProxyBody>> {
    let s = &route.settings;
    let captured = route
        .capture_queue()
        .map(|q| (q, captured_request(head, s, client, proxy.backend.now_ms())));
    let mut out = Outgoing {
        whole: None,
        stream: None,
        state: None,
    };
    let mut end = None;
    if !bodyless(&body) {
        let keep = captured.is_some();
        // A capture's copy is the same bytes, and its item as many again.
        let whole = declared
            .filter(|n| *n <= s.capture_bytes_max)
            .and_then(|n| proxy.budget.try_reserve(if keep { 2 * n } else { n }));
        match whole {
            Some(mut reserved) => {
                let item = keep.then(|| reserved.split(declared.unwrap_or(0)));
                let whole = read_whole(body, declared.unwrap_or(0), reserved, s).await?;
                if let Some(item) = item {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    let _ = tx.send(BodyEnd::Complete(KeptBody::Memory(
                        whole.clone(),
                        Some(item),
                    )));
                    end = Some(rx);
                }
                out.whole = Some(whole);
            }
            None => {
                let copy = keep.then(|| (CopySink::new(&proxy.budget, true), s.capture_bytes_max));
                let (tee, state, body_end) = TeeBody::new(body, copy, s.body_bytes_max);
                end = Some(body_end);
                out.stream = Some(tee.boxed());
                out.state = Some(state);
            }
        }
    }
    let pending = captured.map(|(queue, captured)| Pending {
        queue,
        captured,
        end,
        in_flight: InFlight::new(&proxy.captures_in_flight),
        budget: Arc::clone(&proxy.budget),
    });
    let Some(p) = pending else {
        return Ok((out, None));
    };
    // The capture starts now, before the request is forwarded, so that captures keep
    // the order their requests came in; a route that diffs hands it the primary's
    // answer later.
    let (answer_to, answer) = if s.diffs() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    start_capture(route, p, answer).await;
    Ok((out, answer_to))
}

/// Reads a body of `len` bytes whole, within `request_timeout`, into a buffer that
/// holds `reserved` until its last clone is dropped.
async fn read_whole(
    mut body: Incoming,
    len: u64,
    reserved: Reservation,
    s: &RouteSettings,
) -> Result<Bytes, Response<ProxyBody>> {
    let broken = || refusal(StatusCode::BAD_REQUEST, "the request body broke off");
    let read = async {
        let mut buf = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| broken())?;
            if let Some(data) = frame.data_ref() {
                if (buf.len() + data.len()) as u64 > len {
                    return Err(broken());
                }
                buf.extend_from_slice(data);
            }
        }
        Ok(buf)
    };
    match tokio::time::timeout(s.request_timeout, read).await {
        Ok(Ok(buf)) => Ok(crate::budget::held_bytes(buf, reserved)),
        Ok(Err(refused)) => Err(refused),
        Err(_) => Err(refusal(
            StatusCode::REQUEST_TIMEOUT,
            "the request body did not arrive in time",
        )),
    }
}

/// Starts a capture: polled once here, where a request whose body has passed is
/// appended at once (the engine takes the item before its first wait), so that
/// captures keep the order of their requests; the rest (a body still coming, the
/// wait for durability) goes on in a task of its own. The client never waits for it.
async fn start_capture(
    route: &LiveRoute,
    p: Pending,
    answer: Option<tokio::sync::oneshot::Receiver<AnswerPart>>,
) {
    let counters = Arc::clone(&route.counters.shared);
    let budget = Arc::clone(&p.budget);
    let mut task = Box::pin(async move {
        store_capture(p.queue, p.captured, p.end, answer, counters, budget).await;
        drop(p.in_flight);
    });
    let first = std::future::poll_fn(|cx| Poll::Ready(task.as_mut().poll(cx))).await;
    if first.is_pending() {
        tokio::spawn(task);
    }
}

/// Sends to the route's targets in turn: again (after `retry_backoff_ms`, to the
/// next target) for an idempotent request whose body can be sent again, when a
/// target could not be reached or did not answer in time. True with a target's
/// answer, false with one the proxy made.
async fn send(
    route: &LiveRoute,
    head: &hyper::http::request::Parts,
    client: SocketAddr,
    mut out: Outgoing,
) -> (Response<ProxyBody>, bool) {
    let s = &route.settings;
    let attempts = if out.stream.is_none() && idempotent(&head.method) {
        1 + s.retries
    } else {
        1
    };
    let mut last = refusal(StatusCode::BAD_GATEWAY, "no target answered");
    let close_after = out
        .whole
        .as_ref()
        .map_or(out.stream.is_some(), |b| b.len() > POOLED_BODY_BYTES_MAX);
    for attempt in 0..attempts {
        if attempt > 0 {
            tokio::time::sleep(s.retry_backoff * attempt).await;
        }
        let (index, target) = route.balancer.pick();
        let body = match (&out.whole, out.stream.take()) {
            (Some(whole), _) => full(whole.clone()),
            (None, Some(stream)) => stream,
            (None, None) => empty(),
        };
        let mut outgoing = match upstream_request(head, s, target, client, body) {
            Ok(r) => r,
            Err(reason) => return (refusal(StatusCode::BAD_REQUEST, &reason), false),
        };
        if close_after {
            outgoing
                .headers_mut()
                .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
        }
        let sent = tokio::time::timeout(s.request_timeout, route.client.request(outgoing)).await;
        match outcome(route, head, out.state.as_deref(), (index, target), sent) {
            Attempt::Answer(response, from_target) => return (response, from_target),
            Attempt::Again(refused) => last = refused,
        }
    }
    (last, false)
}

/// What one attempt came to: an answer for the client (true when the target's), or
/// a failure after which the next target may be tried.
enum Attempt {
    Answer(Response<ProxyBody>, bool),
    Again(Response<ProxyBody>),
}

/// A target's answer, a failure, or the time running out.
type Sent = Result<
    Result<Response<Incoming>, hyper_util::client::legacy::Error>,
    tokio::time::error::Elapsed,
>;

/// The client's answer to one attempt on `target` (its index in the balancer):
/// whose fault a failure is, and whether another target may be tried.
fn outcome(
    route: &LiveRoute,
    head: &hyper::http::request::Parts,
    body: Option<&BodyState>,
    (index, target): (usize, &Target),
    sent: Sent,
) -> Attempt {
    let s = &route.settings;
    match sent {
        Ok(Ok(response)) if response.status() == StatusCode::SWITCHING_PROTOCOLS => {
            // It would turn the client's connection into a tunnel it never asked
            // for, past the routes.
            let reason = format!(
                "target {} answered 101 to a request that did not upgrade",
                target.authority
            );
            Attempt::Answer(refusal(StatusCode::BAD_GATEWAY, &reason), false)
        }
        Ok(Ok(response)) => {
            Attempt::Answer(from_target(response, s.request_timeout, head.version), true)
        }
        Ok(Err(_)) if body.is_some_and(|b| b.too_large.load(Relaxed)) => {
            Attempt::Answer(too_large(s), false)
        }
        Ok(Err(_)) if body.is_some_and(|b| b.broken.load(Relaxed)) => {
            // The client's body failed (cut short, a malformed chunk): its fault, not
            // the target's.
            let reason = "the request body broke off or was malformed";
            Attempt::Answer(refusal(StatusCode::BAD_REQUEST, reason), false)
        }
        Ok(Err(e)) => {
            let connect = e.is_connect();
            if connect {
                route.balancer.mark_down(index, s.down);
            }
            tracing::debug!(route = %s.name, target = %target.authority, error = %e, "target failed");
            let reason = format!("target {} failed: {}", target.authority, error_chain(&e));
            let refused = refusal(StatusCode::BAD_GATEWAY, &reason);
            if connect {
                Attempt::Again(refused)
            } else {
                // It may have been sent: only a failed connection is tried again.
                Attempt::Answer(refused, false)
            }
        }
        Err(_) => {
            let ms = s.request_timeout.as_millis();
            let reason = format!("target {} did not answer within {ms} ms", target.authority);
            Attempt::Again(refusal(StatusCode::GATEWAY_TIMEOUT, &reason))
        }
    }
}

/// The request as captured: its path and query, and its headers, as the primary
/// got them (the route's rules and the forwarding headers applied), so that a
/// replay sends what the primary got (`Host` aside, see [`Captured::host`]).
fn captured_request(
    head: &hyper::http::request::Parts,
    s: &RouteSettings,
    client: SocketAddr,
    now_ms: u64,
) -> Captured {
    let mut headers = head.headers.clone();
    let authority = head.uri.authority().map(|a| a.as_str());
    let host = headers::for_replay(&mut headers, s, client, authority);
    Captured {
        method: head.method.as_str().to_string(),
        uri: format!("{}{}", head.uri.path(), rewrite_query(head.uri.query(), s)),
        headers: headers
            .iter()
            .filter_map(|(k, v)| {
                v.to_str()
                    .ok()
                    .map(|v| (k.as_str().to_string(), v.to_string()))
            })
            .collect(),
        host,
        at_ms: now_ms,
        body: Bytes::new(),
        response: None,
    }
}

/// The primary's answer's head and how its body ended.
type AnswerPart = (CapturedResponse, tokio::sync::oneshot::Receiver<BodyEnd>);
/// Where the request path hands a capture the primary's answer.
type AnswerSender = tokio::sync::oneshot::Sender<AnswerPart>;

/// Appends a captured request once its body has passed (at once when it has none),
/// and with `answer`, once the primary's answer's body has passed too (an answer
/// cut short, or over the budget, is kept without its body, which is then not
/// compared).
async fn store_capture(
    queue: weir_backend::Queue,
    mut captured: Captured,
    end: Option<tokio::sync::oneshot::Receiver<BodyEnd>>,
    answer: Option<tokio::sync::oneshot::Receiver<AnswerPart>>,
    counters: Arc<crate::metrics::CaptureCounters>,
    budget: Arc<Budget>,
) {
    let kept = match end {
        None => KeptBody::Memory(Bytes::new(), None),
        Some(end) => match end.await {
            Ok(BodyEnd::Complete(kept)) => kept,
            Ok(BodyEnd::TooLargeToCapture) => {
                counters.too_large.fetch_add(1, Relaxed);
                return;
            }
            Ok(BodyEnd::OverBudget) => {
                over_budget(&counters, queue.name());
                return;
            }
            Ok(BodyEnd::Incomplete) | Err(_) => {
                counters.incomplete.fetch_add(1, Relaxed);
                return;
            }
        },
    };
    // The answer's reservation is held until the append is done.
    let mut _answer_held = None;
    if let Some(Ok((mut head, end))) = match answer {
        Some(rx) => Some(rx.await),
        None => None,
    } {
        if let Ok(BodyEnd::Complete(KeptBody::Memory(body, held))) = end.await {
            head.body_whole = true;
            head.body_len = body.len() as u64;
            head.body = body;
            _answer_held = held;
        }
        captured.response = Some(head);
    }
    let Some((item, _held)) = capture_item(captured, kept, &budget).await else {
        over_budget(&counters, queue.name());
        return;
    };
    match queue
        .append(&item, weir_backend::AppendOptions::default())
        .await
    {
        Ok(_) => {
            counters.captured.fetch_add(1, Relaxed);
        }
        Err(e) => {
            counters.failed.fetch_add(1, Relaxed);
            tracing::warn!(queue = queue.name(), error = %e, "could not capture a request; it is not replayed");
        }
    }
}

/// The item to append, with the reservation that covers it: a body in memory came
/// with one; a spilled one waits for room in the budget to be read back (`None`
/// when the budget could never hold it, or the file could not be read).
async fn capture_item(
    mut captured: Captured,
    kept: KeptBody,
    budget: &Arc<Budget>,
) -> Option<(Vec<u8>, Option<Reservation>)> {
    match kept {
        KeptBody::Memory(body, held) => {
            captured.body = body;
            Some((captured.encode(), held))
        }
        KeptBody::Spilled(mut file, len) => {
            let answer_len = captured.response.as_ref().map_or(0, |r| r.body.len());
            let held = budget.reserve(len + answer_len as u64).await?;
            let (head, _) = captured.encode_head(usize::try_from(len).ok()?);
            let read = tokio::task::spawn_blocking(move || {
                let mut item = head;
                crate::budget::read_spilled(&mut file, len, &mut item).map(|()| item)
            });
            let mut item = match read.await {
                Ok(Ok(item)) => item,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "a spill file could not be read back");
                    return None;
                }
                Err(_) => return None,
            };
            if let Some(r) = &captured.response {
                item.extend_from_slice(&r.body);
            }
            Some((item, Some(held)))
        }
    }
}

/// Counts a capture skipped for the budget, and says so (once a minute at most).
fn over_budget(counters: &crate::metrics::CaptureCounters, queue: &str) {
    static LAST_SAID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    counters.over_budget.fetch_add(1, Relaxed);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST_SAID.load(Relaxed);
    if now >= last + 60
        && LAST_SAID
            .compare_exchange(last, now, Relaxed, Relaxed)
            .is_ok()
    {
        tracing::warn!(
            queue,
            counted = "weir_proxy_captures_total{outcome=\"over_budget\"}",
            "forwarded, not captured: no room in body_memory_max and no spill file"
        );
    }
}
