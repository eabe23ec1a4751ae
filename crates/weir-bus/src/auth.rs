//! HTTP Basic credentials, as routemaster read them: the user is the token (or the
//! root key), the password is ignored.

use axum::http::{header, HeaderMap};
use base64::Engine;

/// The user of a request's `Authorization: Basic` header, if it has a well-formed one.
pub fn basic_user(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, _password) = text.split_once(':')?;
    Some(user.to_string())
}

/// Compares a secret without an early exit on the first differing byte.
pub fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn the_user_of_basic_credentials() {
        // "svc--01:x" and "svc--01:" in base64.
        assert_eq!(
            basic_user(&with("Basic c3ZjLS0wMTp4")).as_deref(),
            Some("svc--01")
        );
        assert_eq!(
            basic_user(&with("basic c3ZjLS0wMTo=")).as_deref(),
            Some("svc--01")
        );
        assert_eq!(basic_user(&with("Bearer c3ZjLS0wMTp4")), None);
        assert_eq!(basic_user(&with("Basic !!!")), None);
        // No colon: not Basic credentials.
        assert_eq!(basic_user(&with("Basic c3Zj")), None);
        assert_eq!(basic_user(&HeaderMap::new()), None);
        assert!(same_secret("abc", "abc") && !same_secret("abc", "abd") && !same_secret("a", "ab"));
    }
}
