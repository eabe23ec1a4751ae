//! The answers the proxy makes itself instead of a target's: a status, the reason
//! as plain text, and the reason again in `x-weir-proxy-error` (see `forward.rs` for
//! which status says what).

use hyper::header::HeaderValue;
use hyper::{Response, StatusCode};

use crate::body::{full, ProxyBody};

/// The header that says why the proxy answered instead of a target.
pub const ERROR_HEADER: &str = "x-weir-proxy-error";

/// The proxy's own answer: `status`, with `reason` as its body and its
/// [`ERROR_HEADER`] (left out when the reason cannot be a header value).
pub fn refusal(status: StatusCode, reason: &str) -> Response<ProxyBody> {
    let mut r = Response::new(full(format!("{reason}\n")));
    *r.status_mut() = status;
    if let Ok(v) = HeaderValue::from_str(reason) {
        r.headers_mut().insert(ERROR_HEADER, v);
    }
    r.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}
