//! When an item expires: the one rule every backend applies, and its encodings. In an
//! item (`Item::expires_at_ms`, `AppendOptions::expires_at_ms`) 0 means never; a
//! computed expiry ([`expiry_ms`]) is [`NEVER`] when nothing applies, so that it
//! compares as later than any time.

use std::time::Duration;

/// A computed expiry that never comes (see [`expiry_ms`]).
pub const NEVER: u64 = u64::MAX;

/// The one rule of expiry, on every backend: an item expires at its own expiry time
/// (`expires_at_ms`, 0 for never) or `max_age` after it was enqueued, whichever comes
/// first; [`NEVER`] when neither applies. It has expired once that time is not after
/// now.
pub fn expiry_ms(expires_at_ms: u64, enqueued_at_ms: u64, max_age: Option<Duration>) -> u64 {
    let own = if expires_at_ms != 0 {
        expires_at_ms
    } else {
        NEVER
    };
    let aged = max_age.map_or(NEVER, |age| {
        let age_ms = u64::try_from(age.as_millis()).unwrap_or(NEVER);
        enqueued_at_ms.saturating_add(age_ms)
    });
    own.min(aged)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earlier_of_its_own_expiry_and_the_queues_max_age() {
        let day = Some(Duration::from_secs(86_400));
        assert_eq!(expiry_ms(0, 1_000, None), NEVER);
        assert_eq!(expiry_ms(5_000, 1_000, None), 5_000);
        assert_eq!(expiry_ms(0, 1_000, day), 86_401_000);
        assert_eq!(expiry_ms(5_000, 1_000, day), 5_000);
        assert_eq!(expiry_ms(0, u64::MAX - 1, day), NEVER);
        assert_eq!(expiry_ms(0, 0, Some(Duration::MAX)), NEVER);
    }
}
