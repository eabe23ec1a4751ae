//! What a JetStream failure means to a front door: the [`Kind`] it becomes.
//!
//! JetStream reports API failures as `{"error": {"code", "err_code", "description"}}`
//! (the HTTP-like `code`, the server's own `err_code`). Transport failures (no
//! responders, a timeout, a lost connection) are not errors of the request but of the
//! moment: they are retried until `unavailable_retry_ms` and then become
//! [`Kind::Unavailable`], "nothing is known to have happened". This module holds that
//! one mapping, so every call answers the door the same way.

use std::fmt::Display;

use serde::Deserialize;

use crate::error::{Error, Kind};

/// JetStream's `err_code`s that weir answers specially (nats-server `errors.json`).
pub(crate) mod code {
    pub const CONSUMER_NOT_FOUND: u64 = 10014;
    pub const INSUFFICIENT_RESOURCES: u64 = 10023;
    pub const MAXIMUM_CONSUMERS: u64 = 10026;
    pub const STORAGE_RESOURCES_EXCEEDED: u64 = 10047;
    pub const MESSAGE_EXCEEDS_MAXIMUM: u64 = 10054;
    pub const STREAM_NAME_IN_USE: u64 = 10058;
    pub const STREAM_NOT_FOUND: u64 = 10059;
    /// "{err}" of the stream's store: maximum messages/bytes exceeded among others.
    pub const STREAM_STORE_FAILED: u64 = 10077;
    /// "consumer already exists" (a create with another config).
    pub const CONSUMER_EXISTS: u64 = 10148;
    /// "consumer name already in use".
    pub const CONSUMER_NAME_EXISTS: u64 = 10013;
    /// "no message found" (a message get by sequence).
    pub const NO_MESSAGE_FOUND: u64 = 10037;
    /// "wrong last sequence" (a publish expecting a subject's last sequence).
    pub const WRONG_LAST_SEQUENCE: u64 = 10071;
    /// "wrong last sequence" too: the subject has a write in flight (a retry racing
    /// its first attempt).
    pub const WRONG_LAST_SEQUENCE_CONSTANT: u64 = 10164;
    /// "duplicate message id is in process": a publish with this `Nats-Msg-Id` (an
    /// earlier attempt of the same `set`) is still being stored. Retried: the retry
    /// is answered with the stored item's sequence, or stores it.
    pub const DUPLICATE_IN_PROCESS: u64 = 10158;
}

/// An error of the JetStream API, as the server sends it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ApiError {
    pub code: u16,
    pub err_code: u64,
    pub description: String,
}

impl ApiError {
    /// A failure of the moment (no leader, the cluster busy): worth retrying.
    pub fn is_transient(&self) -> bool {
        if self.err_code == code::DUPLICATE_IN_PROCESS {
            return true;
        }
        self.code >= 500
            && !matches!(
                self.err_code,
                code::INSUFFICIENT_RESOURCES
                    | code::STORAGE_RESOURCES_EXCEEDED
                    | code::STREAM_STORE_FAILED
            )
    }

    /// The door's view of it.
    pub fn to_error(&self) -> Error {
        let kind = match self.err_code {
            code::STREAM_STORE_FAILED if self.description.contains("maximum") => Kind::Full,
            code::STREAM_STORE_FAILED if self.description.contains("storage") => Kind::DiskFull,
            code::INSUFFICIENT_RESOURCES | code::STORAGE_RESOURCES_EXCEEDED => Kind::DiskFull,
            code::MAXIMUM_CONSUMERS => Kind::TooManyQueues,
            code::CONSUMER_NOT_FOUND | code::STREAM_NOT_FOUND => Kind::NotFound,
            code::MESSAGE_EXCEEDS_MAXIMUM => Kind::TooLarge,
            _ => Kind::Other,
        };
        Error::new(
            kind,
            format!(
                "jetstream: {} (code {}, err_code {})",
                self.description, self.code, self.err_code
            ),
        )
    }
}

/// `SERVER_ERROR backend unavailable: <detail>` to the client.
pub(crate) fn unavailable(detail: impl Display) -> Error {
    Error::new(Kind::Unavailable, format!("backend unavailable: {detail}"))
}

pub(crate) fn not_found(what: impl Display) -> Error {
    Error::new(Kind::NotFound, format!("{what} does not exist (any more)"))
}

/// A reply the backend did not expect: a bug or an incompatible server.
pub(crate) fn unexpected(what: impl Display) -> Error {
    Error::new(Kind::Other, format!("jetstream: unexpected reply: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, err_code: u64, description: &str) -> ApiError {
        ApiError {
            code,
            err_code,
            description: description.to_owned(),
        }
    }

    #[test]
    fn maps_the_codes_weir_answers() {
        let kind = |e: ApiError| e.to_error().kind();
        assert_eq!(
            kind(api(503, 10077, "maximum messages exceeded")),
            Kind::Full
        );
        assert_eq!(
            kind(api(503, 10047, "insufficient storage")),
            Kind::DiskFull
        );
        assert_eq!(
            kind(api(400, 10026, "maximum consumers")),
            Kind::TooManyQueues
        );
        assert_eq!(kind(api(404, 10014, "consumer not found")), Kind::NotFound);
        assert_eq!(kind(api(404, 10059, "stream not found")), Kind::NotFound);
        assert_eq!(kind(api(400, 10054, "message size")), Kind::TooLarge);
        assert_eq!(kind(api(500, 1, "x")), Kind::Other);
        assert!(api(503, 10008, "temporarily unavailable").is_transient());
        assert!(!api(503, 10047, "insufficient storage").is_transient());
        assert!(!api(503, 10077, "maximum messages exceeded").is_transient());
        assert!(!api(400, 10058, "in use").is_transient());
        // A retry of a `set` racing its first attempt: retried, not answered.
        assert!(api(409, 10158, "duplicate message id is in process").is_transient());
    }
}
