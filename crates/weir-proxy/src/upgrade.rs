//! Upgrades (WebSocket): on a route with `websocket = true`, an HTTP/1.1 `GET` with
//! `Connection: upgrade` and `Upgrade: websocket` goes to a target with both kept
//! (they are hop-by-hop, removed from every other request); when the target answers
//! `101 Switching Protocols` to websocket, the client's connection and the target's
//! are joined and bytes are copied both ways until either side closes, or until no
//! byte has passed either way for the route's `websocket_idle_ms` (5 minutes by
//! default). Upgraded requests are not captured nor replayed, and not retried.
//! HTTP/1.1 only (an HTTP/2 client cannot upgrade this way).
//!
//! Every other upgrade (`h2c`, `TLS/1.0`, websocket on a route without the setting)
//! is dropped: the request goes on as a plain one, without `Upgrade`. A tunnel
//! passes bytes the proxy never routes nor checks, so only the one protocol a route
//! asked for may open one: an h2c tunnel would carry any request to any path past
//! the routes, their header rules, limits and capture.

use std::net::SocketAddr;

use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, UPGRADE};
use hyper::upgrade::OnUpgrade;
use hyper::{Method, Request, Response, StatusCode, Version};
use hyper_util::rt::TokioIo;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_http::http_conns::Slot;

/// Bytes a tunnel copies at a time, per direction.
const PUMP_BUFFER_BYTES: usize = 16 * 1024;

use crate::body::{empty, ProxyBody};
use crate::client::error_chain;
use crate::config::Target;
use crate::headers;
use crate::refusal::refusal;
use crate::route::LiveRoute;
use crate::upstream::{from_target, upstream_request};

/// A client connection's place in `connections_max`, shared by the connection and,
/// through its requests' extensions (`server.rs` puts it there), by a tunnel an
/// upgrade makes of it: the place is given back when both have ended.
#[derive(Clone)]
pub struct ConnectionSlot {
    _slot: Arc<Slot>,
}

impl ConnectionSlot {
    pub fn new(slot: Arc<Slot>) -> ConnectionSlot {
        ConnectionSlot { _slot: slot }
    }
}

/// Whether `req` is a WebSocket upgrade the route forwards: `websocket = true`, an
/// HTTP/1.1 `GET`, `Connection: upgrade`, and `websocket` among the protocols of
/// `Upgrade`. Any other upgrade is not one: the request goes on as a plain one.
pub fn websocket(route: &LiveRoute, req: &Request<Incoming>) -> bool {
    route.settings.websocket
        && req.version() == Version::HTTP_11
        && req.method() == Method::GET
        && has_token(req.headers(), CONNECTION, "upgrade")
        && has_token(req.headers(), UPGRADE, "websocket")
}

/// Whether some value of the list header `name` has `token` (case aside).
fn has_token(headers: &HeaderMap, name: HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// Forwards a WebSocket upgrade request and, on `101` to websocket, joins the two
/// connections; a `101` to another protocol is a 502.
pub async fn forward(
    route: &LiveRoute,
    client: SocketAddr,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let s = &route.settings;
    let (mut head, body) = req.into_parts();
    drop(body);
    let client_side = head.extensions.remove::<OnUpgrade>();
    let slot = head.extensions.remove::<ConnectionSlot>();
    headers::remove_hop_by_hop(&mut head.headers);
    // The body (if any) is not forwarded: neither is its length.
    head.headers.remove(hyper::header::CONTENT_LENGTH);
    let (index, target) = route.balancer.pick();
    let mut outgoing = match upstream_request(&head, s, target, client, empty()) {
        Ok(r) => r,
        Err(reason) => return refusal(StatusCode::BAD_REQUEST, &reason),
    };
    outgoing
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("upgrade"));
    outgoing
        .headers_mut()
        .insert(UPGRADE, HeaderValue::from_static("websocket"));
    let mut response = match ask(route, outgoing, index, target).await {
        Ok(r) => r,
        Err(refused) => return refused,
    };
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return from_target(response, s.request_timeout, head.version);
    }
    if !has_token(response.headers(), UPGRADE, "websocket") {
        return refusal(
            StatusCode::BAD_GATEWAY,
            &format!(
                "target {} switched to another protocol than websocket",
                target.authority
            ),
        );
    }
    let Some(client_side) = client_side else {
        return refusal(
            StatusCode::BAD_GATEWAY,
            "this connection cannot be upgraded (HTTP/2?)",
        );
    };
    let target_side = hyper::upgrade::on(&mut response);
    let idle = s.websocket_idle;
    tokio::spawn(async move {
        join(client_side, target_side, idle).await;
        drop(slot);
    });
    let (mut parts, _) = response.into_parts();
    headers::remove_hop_by_hop(&mut parts.headers);
    parts.version = head.version;
    parts
        .headers
        .insert(CONNECTION, HeaderValue::from_static("upgrade"));
    parts
        .headers
        .insert(UPGRADE, HeaderValue::from_static("websocket"));
    Response::from_parts(parts, empty())
}

/// Sends the upgrade request to `target` (its index in the balancer): the target's
/// answer, or the refusal the client gets when there is none in time.
async fn ask(
    route: &LiveRoute,
    outgoing: Request<ProxyBody>,
    index: usize,
    target: &Target,
) -> Result<Response<Incoming>, Response<ProxyBody>> {
    let s = &route.settings;
    match tokio::time::timeout(s.request_timeout, route.client.request(outgoing)).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => {
            if e.is_connect() {
                route.balancer.mark_down(index, s.down);
            }
            Err(refusal(
                StatusCode::BAD_GATEWAY,
                &format!("target {} failed: {}", target.authority, error_chain(&e)),
            ))
        }
        Err(_) => {
            let ms = s.request_timeout.as_millis();
            Err(refusal(
                StatusCode::GATEWAY_TIMEOUT,
                &format!("target {} did not answer within {ms} ms", target.authority),
            ))
        }
    }
}

/// Copies bytes both ways between the upgraded client and target connections until
/// either side closes.
async fn join(client_side: OnUpgrade, target_side: OnUpgrade, idle: Duration) {
    match tokio::join!(client_side, target_side) {
        (Ok(c), Ok(t)) => {
            let (c, t) = (TokioIo::new(c), TokioIo::new(t));
            let (c_read, c_write) = tokio::io::split(c);
            let (t_read, t_write) = tokio::io::split(t);
            let start = Instant::now();
            let last = Arc::new(AtomicU64::new(0));
            let up = pump(c_read, t_write, Arc::clone(&last), start);
            let down = pump(t_read, c_write, Arc::clone(&last), start);
            let watchdog = async {
                loop {
                    tokio::time::sleep(idle / 4).await;
                    let quiet = start
                        .elapsed()
                        .saturating_sub(Duration::from_millis(last.load(Relaxed)));
                    if quiet >= idle {
                        tracing::debug!(
                            idle_ms = idle.as_millis() as u64,
                            "upgraded connection idle: closed"
                        );
                        return;
                    }
                }
            };
            // Both directions ending, or the idle watchdog, ends the tunnel.
            tokio::select! {
                _ = async { tokio::join!(up, down) } => {}
                _ = watchdog => {}
            }
        }
        (c, t) => tracing::debug!(client = ?c.err(), target = ?t.err(), "upgrade failed"),
    }
}

/// Copies one direction, noting the time of each read (ms since `start`) in `last`;
/// ends at end of stream or an error, shutting the writing side down.
async fn pump<R, W>(mut from: R, mut to: W, last: Arc<AtomicU64>, start: Instant)
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; PUMP_BUFFER_BYTES];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        last.store(
            u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX),
            Relaxed,
        );
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
