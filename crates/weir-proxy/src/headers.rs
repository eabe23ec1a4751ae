//! What the proxy does to headers on the way to a target: hop-by-hop headers go
//! (RFC 9110 7.6.1: `Connection` and the headers it names, `Keep-Alive`,
//! `Proxy-*`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`, and h2c's
//! `HTTP2-Settings`, RFC 7540 3.2.1, named or not), the client is
//! recorded (`X-Forwarded-For`, `-Proto`, `-Host` and `Forwarded`), the route's
//! rewrites apply, and `Host` becomes the target's unless the route keeps the
//! client's or names another.

use std::net::SocketAddr;

use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, HOST};

use crate::config::{RouteSettings, Target};

const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "http2-settings",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Removes hop-by-hop headers, those `Connection` names included.
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
        .collect();
    for name in HOP_BY_HOP.iter().map(|s| s.to_string()).chain(named) {
        headers.remove(name.as_str());
    }
}

/// The headers a target gets for a request from `client` that came with `headers`.
pub fn to_target(
    headers: &mut HeaderMap,
    route: &RouteSettings,
    target: &Target,
    client: SocketAddr,
    authority: Option<&str>,
) {
    let host = forwarded(headers, route, client, authority)
        .or_else(|| HeaderValue::from_str(&target.authority).ok());
    if let Some(h) = host {
        headers.insert(HOST, h);
    }
}

/// The headers a replay of the request gets (what the primary got, less `Host`),
/// and the `Host` the primary got when the route kept or set it (a replay sends its
/// own target's otherwise).
pub fn for_replay(
    headers: &mut HeaderMap,
    route: &RouteSettings,
    client: SocketAddr,
    authority: Option<&str>,
) -> Option<String> {
    let host = forwarded(headers, route, client, authority);
    headers.remove(HOST);
    host.and_then(|h| h.to_str().ok().map(str::to_string))
}

/// Everything [`to_target`] does but `Host`: hop-by-hop headers go, the forwarding
/// headers are added, the route's rules apply. Returns the `Host` the route keeps
/// (`preserve_host`) or sets (`host_rewrite`), if it does.
fn forwarded(
    headers: &mut HeaderMap,
    route: &RouteSettings,
    client: SocketAddr,
    authority: Option<&str>,
) -> Option<HeaderValue> {
    // An HTTP/2 client names the host in the URI's authority, not in `Host`.
    let original_host = headers
        .get(HOST)
        .cloned()
        .or_else(|| authority.and_then(|a| HeaderValue::from_str(a).ok()));
    remove_hop_by_hop(headers);
    join_cookies(headers);
    let host_text = original_host
        .as_ref()
        .and_then(|h| h.to_str().ok())
        .map(str::to_string);
    add_forwarding(headers, client, host_text);
    for name in &route.remove_headers {
        headers.remove(name.as_str());
    }
    for (name, value) in &route.set_headers {
        set(headers, name, value);
    }
    match (&route.host_rewrite, route.preserve_host, original_host) {
        (Some(h), _, _) => HeaderValue::from_str(h).ok(),
        (None, true, Some(h)) => Some(h),
        _ => None,
    }
}

/// `X-Forwarded-For` (the client appended), `-Proto`, `-Host` and `Forwarded`.
fn add_forwarding(headers: &mut HeaderMap, client: SocketAddr, host_text: Option<String>) {
    let ip = client.ip().to_string();
    let forwarded_for = match joined(headers, "x-forwarded-for") {
        Some(prior) => format!("{prior}, {ip}"),
        None => ip.clone(),
    };
    set(headers, "x-forwarded-for", &forwarded_for);
    set(headers, "x-forwarded-proto", "http");
    if let Some(h) = &host_text {
        set(headers, "x-forwarded-host", h);
    }
    let node = if client.is_ipv6() {
        format!("\"[{ip}]\"")
    } else {
        ip
    };
    let mut element = format!("for={node};proto=http");
    if let Some(h) = host_text
        .as_deref()
        .filter(|h| h.bytes().all(|b| b.is_ascii_graphic() && b != b'"'))
    {
        element.push_str(&format!(";host=\"{h}\""));
    }
    let forwarded = match joined(headers, "forwarded") {
        Some(prior) => format!("{prior}, {element}"),
        None => element,
    };
    set(headers, "forwarded", &forwarded);
}

/// Every value of a header, joined by `, ` (a list header sent several times).
fn joined(headers: &HeaderMap, name: &str) -> Option<String> {
    let values: Vec<&str> = headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    (!values.is_empty()).then(|| values.join(", "))
}

/// HTTP/2 clients may send `cookie` as several fields; an HTTP/1.1 target needs one,
/// joined by `; ` (RFC 9113 8.2.3).
fn join_cookies(headers: &mut HeaderMap) {
    let values: Vec<&str> = headers
        .get_all("cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    if values.len() > 1 {
        if let Ok(v) = HeaderValue::from_str(&values.join("; ")) {
            headers.insert("cookie", v);
        }
    }
}

fn set(headers: &mut HeaderMap, name: &str, value: &str) {
    if let (Ok(n), Ok(v)) = (
        HeaderName::from_bytes(name.as_bytes()),
        HeaderValue::from_str(value),
    ) {
        headers.insert(n, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replay_gets_the_headers_a_target_gets_but_host() {
        let text = "[[listen]]\nname = \"l\"\naddr = \"127.0.0.1:0\"\n[[routes]]\nname = \"api\"\ntargets = [\"http://10.0.0.5:9000\"]\nremove_headers = [\"x-secret\"]\n[routes.set_headers]\nx-env = \"prod\"\n";
        let config: crate::config::ProxyConfig = toml::from_str(text).unwrap();
        let mut route = config.resolve().unwrap().routes.remove(0);
        let mut client_headers = HeaderMap::new();
        client_headers.insert(HOST, HeaderValue::from_static("api.example.com"));
        client_headers.insert("x-forwarded-for", HeaderValue::from_static("203.0.113.9"));
        client_headers.insert("x-secret", HeaderValue::from_static("1"));
        client_headers.insert(CONNECTION, HeaderValue::from_static("close"));
        let client: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        for keep in [false, true] {
            route.preserve_host = keep;
            let (mut to_primary, mut to_replay) = (client_headers.clone(), client_headers.clone());
            let target = route.targets[0].clone();
            to_target(&mut to_primary, &route, &target, client, None);
            let host = for_replay(&mut to_replay, &route, client, None);
            let primary_host = to_primary.remove(HOST).unwrap();
            assert_eq!(to_primary, to_replay);
            assert_eq!(to_replay["x-forwarded-for"], "203.0.113.9, 127.0.0.1");
            assert_eq!(to_replay["x-env"], "prod");
            assert!(!to_replay.contains_key("x-secret"));
            let expected = if keep { Some("api.example.com") } else { None };
            assert_eq!(host.as_deref(), expected);
            assert_eq!(primary_host, expected.unwrap_or("10.0.0.5:9000"));
        }
    }

    #[test]
    fn hop_by_hop_headers_go_and_named_ones_too() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("keep-alive, x-secret"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        remove_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
    }
}
