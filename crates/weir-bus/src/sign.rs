//! Signatures per the Standard Webhooks specification: each delivery carries
//! `webhook-id` (the same on every attempt of a batch), `webhook-timestamp` (Unix
//! seconds of the attempt) and `webhook-signature`: `v1,` and the base64 of
//! HMAC-SHA256 over `ID.TIMESTAMP.BODY`, keyed by the secret's bytes (the base64 after
//! `whsec_`). While a rotated-out secret is in its overlap window, both sign: the
//! header lists both signatures, separated by a space, and a receiver holding either
//! secret accepts the delivery.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

use crate::meta::Secret;

pub const SECRET_PREFIX: &str = "whsec_";
/// Key bytes of a new secret (the spec allows 24 to 64).
const SECRET_KEY_BYTES: usize = 32;

/// A new random secret, `whsec_` and the base64 of its key.
pub fn new_secret() -> String {
    let mut key = [0u8; SECRET_KEY_BYTES];
    rand::thread_rng().fill_bytes(&mut key);
    format!("{SECRET_PREFIX}{}", STANDARD.encode(key))
}

/// `v1,SIGNATURE` of one secret, or `None` for a secret that is not `whsec_` + base64.
pub fn signature(secret: &str, msg_id: &str, timestamp_s: u64, body: &[u8]) -> Option<String> {
    let key = STANDARD.decode(secret.strip_prefix(SECRET_PREFIX)?).ok()?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).ok()?;
    mac.update(msg_id.as_bytes());
    mac.update(b".");
    mac.update(timestamp_s.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    Some(format!(
        "v1,{}",
        STANDARD.encode(mac.finalize().into_bytes())
    ))
}

/// The `webhook-signature` header: a signature by every secret still signing at
/// `now_ms` (the current one, and a rotated-out one within its overlap window).
pub fn signature_header(
    secrets: &[Secret],
    now_ms: u64,
    msg_id: &str,
    timestamp_s: u64,
    body: &[u8],
) -> String {
    secrets
        .iter()
        .filter(|s| s.expires_at_ms.is_none_or(|t| now_ms < t))
        .filter_map(|s| signature(&s.secret, msg_id, timestamp_s, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_specification_example_signs_as_published() {
        // The example of the Standard Webhooks specification.
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let id = "msg_p5jXN8AQM9LWM0D4loKWxJek";
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            signature(secret, id, 1614265330, body).as_deref(),
            Some("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
        );
        assert_eq!(signature("nope", id, 1, body), None);
    }

    #[test]
    fn a_rotated_out_secret_signs_only_within_its_window() {
        let old = Secret {
            secret: new_secret(),
            created_at_ms: 0,
            expires_at_ms: Some(1_000),
        };
        let current = Secret {
            secret: new_secret(),
            created_at_ms: 500,
            expires_at_ms: None,
        };
        let secrets = [current, old];
        let both = signature_header(&secrets, 999, "m", 1, b"x");
        assert_eq!(both.split(' ').count(), 2);
        let one = signature_header(&secrets, 1_000, "m", 1, b"x");
        assert_eq!(one, signature(&secrets[0].secret, "m", 1, b"x").unwrap());
        assert!(new_secret().starts_with(SECRET_PREFIX));
    }
}
