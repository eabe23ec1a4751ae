//! What a request's framing must be before it is routed, where hyper lets it pass:
//!
//! - HTTP/1.1 needs exactly one `Host` (RFC 9112 3.2: 400 otherwise); HTTP/1.0 may
//!   have none, never two. An HTTP/2 client names the host in `:authority`.
//! - The only transfer coding taken is `chunked`, alone (RFC 9112 6.1: a coding the
//!   server does not understand is 501, as nginx answers). hyper decodes the chunks
//!   of `gzip, chunked` and lets the request through: its body would reach the
//!   target still gzip, with no header left to say so (`Transfer-Encoding` is
//!   hop-by-hop).
//!
//! A body whose chunks are malformed is found while it streams, not here: the
//! request path answers 400 for it (see `forward.rs`).

use hyper::body::Incoming;
use hyper::header::{HeaderMap, HOST, TRANSFER_ENCODING};
use hyper::{Request, Response, StatusCode, Version};

use crate::body::ProxyBody;
use crate::refusal::refusal;

/// The refusal a request gets for its framing, if any.
pub fn check(req: &Request<Incoming>) -> Option<Response<ProxyBody>> {
    let hosts = req.headers().get_all(HOST).iter().count();
    match req.version() {
        Version::HTTP_11 if hosts != 1 => {
            let reason = if hosts == 0 {
                "an HTTP/1.1 request needs a Host header"
            } else {
                "a request has one Host header at most"
            };
            return Some(refusal(StatusCode::BAD_REQUEST, reason));
        }
        Version::HTTP_10 if hosts > 1 => {
            let reason = "a request has one Host header at most";
            return Some(refusal(StatusCode::BAD_REQUEST, reason));
        }
        _ => {}
    }
    if let Some(coding) = unsupported_coding(req.headers()) {
        let reason = format!("transfer coding {coding:?} is not supported (chunked only)");
        return Some(refusal(StatusCode::NOT_IMPLEMENTED, &reason));
    }
    None
}

/// The first transfer coding other than one final `chunked`, when there is one (a
/// value that is not text counts as one).
fn unsupported_coding(headers: &HeaderMap) -> Option<String> {
    let mut codings = Vec::new();
    for value in headers.get_all(TRANSFER_ENCODING) {
        let Ok(text) = value.to_str() else {
            return Some(String::from_utf8_lossy(value.as_bytes()).into_owned());
        };
        codings.extend(text.split(',').map(str::trim).filter(|c| !c.is_empty()));
    }
    codings
        .iter()
        .enumerate()
        .find(|(i, c)| *i > 0 || !c.eq_ignore_ascii_case("chunked"))
        .map(|(_, c)| c.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn codings(values: &[&'static str]) -> Option<String> {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(TRANSFER_ENCODING, HeaderValue::from_static(v));
        }
        unsupported_coding(&h)
    }

    #[test]
    fn only_chunked_alone_is_taken() {
        assert_eq!(codings(&[]), None);
        assert_eq!(codings(&["chunked"]), None);
        assert_eq!(codings(&["Chunked "]), None);
        assert_eq!(codings(&["gzip, chunked"]).as_deref(), Some("gzip"));
        assert_eq!(codings(&["gzip", "chunked"]).as_deref(), Some("gzip"));
        assert_eq!(codings(&["chunked, chunked"]).as_deref(), Some("chunked"));
        assert_eq!(
            codings(&["chunked", "identity"]).as_deref(),
            Some("identity")
        );
    }
}
