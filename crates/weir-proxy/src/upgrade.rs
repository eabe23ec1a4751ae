//! Upgrades (WebSocket): a request with `Connection: upgrade` and an `Upgrade`
//! header goes to a target with both kept (they are hop-by-hop, removed from every
//! other request); when the target answers `101 Switching Protocols`, the client's
//! connection and the target's are joined and bytes are copied both ways until
//! either side closes, or until no byte has passed either way for the route's
//! `websocket_idle_ms` (5 minutes by default). Upgraded requests are not captured
//! nor replayed, and not retried. HTTP/1.1 only (an HTTP/2 client cannot upgrade
//! this way).

use std::net::SocketAddr;

use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, CONNECTION, UPGRADE};
use hyper::upgrade::OnUpgrade;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes a tunnel copies at a time, per direction.
const PUMP_BUFFER_BYTES: usize = 16 * 1024;

use crate::forward::{
    empty, error_chain, from_target, refusal, upstream_request, ProxyBody, RouteRt,
};
use crate::headers;

/// The protocol asked for, when the request asks to upgrade.
pub fn requested(headers: &HeaderMap) -> Option<HeaderValue> {
    let asks = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    if asks {
        headers.get(UPGRADE).cloned()
    } else {
        None
    }
}

/// Forwards an upgrade request and, on `101`, joins the two connections.
pub async fn forward(
    route: &RouteRt,
    client: SocketAddr,
    req: Request<Incoming>,
    protocol: HeaderValue,
) -> Response<ProxyBody> {
    let s = &route.settings;
    let (mut head, body) = req.into_parts();
    drop(body);
    let client_side = head.extensions.remove::<OnUpgrade>();
    let slot = head.extensions.remove::<crate::server::ConnectionSlot>();
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
    outgoing.headers_mut().insert(UPGRADE, protocol);
    let mut response =
        match tokio::time::timeout(s.request_timeout, route.client.request(outgoing)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                if e.is_connect() {
                    route.balancer.mark_down(index, s.down);
                }
                return refusal(
                    StatusCode::BAD_GATEWAY,
                    &format!("target {} failed: {}", target.authority, error_chain(&e)),
                );
            }
            Err(_) => {
                let ms = s.request_timeout.as_millis();
                return refusal(
                    StatusCode::GATEWAY_TIMEOUT,
                    &format!("target {} did not answer within {ms} ms", target.authority),
                );
            }
        };
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return from_target(response, s.request_timeout);
    }
    let Some(client_side) = client_side else {
        return refusal(
            StatusCode::BAD_GATEWAY,
            "this connection cannot be upgraded (HTTP/2?)",
        );
    };
    let target_side = hyper::upgrade::on(&mut response);
    let accepted = response.headers().get(UPGRADE).cloned();
    let idle = s.websocket_idle;
    tokio::spawn(async move {
        join(client_side, target_side, idle).await;
        drop(slot);
    });
    let (mut parts, _) = response.into_parts();
    headers::remove_hop_by_hop(&mut parts.headers);
    parts
        .headers
        .insert(CONNECTION, HeaderValue::from_static("upgrade"));
    if let Some(p) = accepted {
        parts.headers.insert(UPGRADE, p);
    }
    Response::from_parts(parts, empty())
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
