//! Upgrades (WebSocket): a request with `Connection: upgrade` and an `Upgrade`
//! header goes to a target with both kept (they are hop-by-hop, removed from every
//! other request); when the target answers `101 Switching Protocols`, the client's
//! connection and the target's are joined and bytes are copied both ways until
//! either side closes. Upgraded requests are not captured nor replayed, and not
//! retried. HTTP/1.1 only (an HTTP/2 client cannot upgrade this way).

use std::net::SocketAddr;

use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, CONNECTION, UPGRADE};
use hyper::upgrade::OnUpgrade;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

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
    tokio::spawn(join(client_side, target_side));
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
async fn join(client_side: OnUpgrade, target_side: OnUpgrade) {
    match tokio::join!(client_side, target_side) {
        (Ok(c), Ok(t)) => {
            let (mut c, mut t) = (TokioIo::new(c), TokioIo::new(t));
            if let Err(e) = tokio::io::copy_bidirectional(&mut c, &mut t).await {
                tracing::debug!(error = %e, "upgraded connection ended with an error");
            }
        }
        (c, t) => tracing::debug!(client = ?c.err(), target = ?t.err(), "upgrade failed"),
    }
}
