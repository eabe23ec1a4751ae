//! The request a captured one becomes when it is sent again: to a shadow
//! (`shadow.rs`), to a diff's reference (`differ.rs`), or to any URL (`weir replay`,
//! `replay.rs`). Every such request, and a shadow's probe, carries
//! [`REPLAY_HEADER`], so that a target can tell it from a client's.

use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderName, HeaderValue, HOST};
use hyper::{Request, Uri};

use crate::body::ProxyBody;
use crate::capture::Captured;
use crate::config::Target;

/// The header every replay carries: `ROUTE/SHADOW`.
pub const REPLAY_HEADER: &str = "x-weir-replay";

/// The request a captured one becomes for `t`: the captured method, path, headers
/// and body, `Host` the captured one (a route that keeps or sets it) or else the
/// target's, and `x-weir-replay: TAG`.
pub fn request_for(t: &Target, tag: &str, c: &Captured) -> Option<Request<ProxyBody>> {
    let uri: Uri = t.url(&c.uri).parse().ok()?;
    let mut req = Request::new(
        Full::new(c.body.clone())
            .map_err(|never| match never {})
            .boxed(),
    );
    *req.method_mut() = c.method.parse().ok()?;
    *req.uri_mut() = uri;
    let headers = req.headers_mut();
    for (k, v) in &c.headers {
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(v),
        ) {
            headers.append(k, v);
        }
    }
    let host = c.host.as_deref().unwrap_or(&t.authority);
    headers.insert(HOST, HeaderValue::from_str(host).ok()?);
    headers.insert(REPLAY_HEADER, HeaderValue::from_str(tag).ok()?);
    Some(req)
}
