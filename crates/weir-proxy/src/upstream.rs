//! What a target gets and what comes back from it, the same for a plain request
//! (`forward.rs`) and a WebSocket upgrade (`upgrade.rs`): the request with its URI
//! under the target's base, the route's query rules and the headers `headers.rs`
//! makes; the answer less hop-by-hop headers, in the client's HTTP version, its body
//! cut when it stalls (`idle.rs`).

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response, Uri, Version};

use crate::body::ProxyBody;
use crate::config::{RouteSettings, Target};
use crate::headers;

/// The request a target gets: its URI under the target's base, the headers as
/// `headers::to_target` makes them.
pub(crate) fn upstream_request(
    head: &hyper::http::request::Parts,
    s: &RouteSettings,
    target: &Target,
    client: SocketAddr,
    body: ProxyBody,
) -> Result<Request<ProxyBody>, String> {
    let path = head.uri.path();
    let query = rewrite_query(head.uri.query(), s);
    let uri: Uri = target
        .url(&format!("{path}{query}"))
        .parse()
        .map_err(|e| format!("bad request target: {e}"))?;
    let mut req = Request::new(body);
    *req.method_mut() = head.method.clone();
    *req.uri_mut() = uri;
    *req.headers_mut() = head.headers.clone();
    let authority = head.uri.authority().map(|a| a.as_str());
    headers::to_target(req.headers_mut(), s, target, client, authority);
    Ok(req)
}

/// The query a target gets (with its `?`, or empty): the route's `remove_query`
/// and `set_query` applied. Parameters are compared by their name as written.
pub(crate) fn rewrite_query(query: Option<&str>, s: &RouteSettings) -> String {
    if s.set_query.is_empty() && s.remove_query.is_empty() {
        return query.map_or(String::new(), |q| format!("?{q}"));
    }
    let name = |p: &str| p.split_once('=').map_or(p, |(k, _)| k).to_string();
    let mut params: Vec<String> = query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .filter(|p| {
            let n = name(p);
            !s.remove_query.contains(&n) && !s.set_query.iter().any(|(k, _)| *k == n)
        })
        .map(str::to_string)
        .collect();
    params.extend(s.set_query.iter().map(|(k, v)| format!("{k}={v}")));
    if params.is_empty() {
        String::new()
    } else {
        format!("?{}", params.join("&"))
    }
}

/// A target's answer, less hop-by-hop headers, in the client's HTTP `version`, its
/// body streamed; it fails (and the client's connection with it) when nothing comes
/// for `idle`.
pub(crate) fn from_target(
    response: Response<Incoming>,
    idle: Duration,
    version: Version,
) -> Response<ProxyBody> {
    let (mut parts, body) = response.into_parts();
    headers::remove_hop_by_hop(&mut parts.headers);
    parts.version = version;
    Response::from_parts(parts, crate::idle::IdleBody::new(body, idle).boxed())
}
