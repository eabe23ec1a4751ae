//! The retry policy of a failed delivery: exponential backoff with jitter and a cap.
//!
//! Attempt `n` (1 for the first retry) waits a random time in
//! `[d/2, d]`, `d = min(retry_max, retry_initial * 2^(n-1))`: the wait doubles, never
//! passes the cap, and subscribers failing together do not retry in step. After
//! `attempts_max` attempts in all the batch's events go to the subscriber's
//! dead-letter queue.

use std::time::Duration;

use rand::Rng;

pub fn backoff(retry: u32, initial: Duration, max: Duration) -> Duration {
    let doubling = 1u32
        .checked_shl(retry.saturating_sub(1))
        .unwrap_or(u32::MAX);
    let d = initial.saturating_mul(doubling).min(max);
    let low = d / 2;
    let spread = (d - low).as_millis() as u64;
    let wait = low + Duration::from_millis(rand::thread_rng().gen_range(0..=spread));
    // The spread is whole milliseconds of `d - low`, so the jitter stays under the cap.
    assert!(
        wait <= max,
        "a retry waits {wait:?}, past the cap of {max:?}"
    );
    wait
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_within_jitter_and_stop_at_the_cap() {
        let (initial, max) = (Duration::from_millis(100), Duration::from_secs(5));
        for retry in 1..=40 {
            let full = (initial * 2u32.saturating_pow(retry - 1)).min(max);
            for _ in 0..50 {
                let d = backoff(retry, initial, max);
                assert!(
                    d >= full / 2 && d <= full,
                    "retry {retry}: {d:?} vs {full:?}"
                );
            }
        }
        assert!(backoff(1000, initial, max) <= max);
    }
}
