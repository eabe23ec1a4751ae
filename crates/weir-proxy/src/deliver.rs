//! When a replay counts as delivered, and how long a replay that was not waits before
//! its next attempt.
//!
//! A shadow's `delivered` is a list of statuses: `2xx` (a class), `404` (one
//! status), and exclusions `!429` or `!5xx`, applied after the inclusions whatever
//! their place. The default, `["2xx", "3xx", "4xx", "!408", "!429"]`, takes every
//! answer of the application as delivered except a timeout and a rate limit; a 5xx
//! (a load balancer's 503 while the application deploys), a reset, a timeout, 408
//! and 429 are tried again, after `Retry-After` when the answer has one (seconds or
//! an HTTP date, at most `retry_after_ms_max`), else after a pause that doubles from
//! `retry_backoff_ms` to `retry_backoff_ms_max`.

use std::time::{Duration, SystemTime};

/// The statuses (100 to 999) that count as delivered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusSet {
    bits: [u64; 16],
}

/// The default `delivered`.
pub const DELIVERED_DEFAULT: &[&str] = &["2xx", "3xx", "4xx", "!408", "!429"];

impl StatusSet {
    /// Parses a `delivered` list; the reason names the entry refused.
    pub fn parse(entries: &[String]) -> Result<StatusSet, String> {
        let mut set = StatusSet { bits: [0; 16] };
        let mut excluded = Vec::new();
        for entry in entries {
            let text = entry.trim();
            let (exclude, spec) = match text.strip_prefix('!') {
                Some(rest) => (true, rest),
                None => (false, text),
            };
            let range = status_range(spec).ok_or_else(|| {
                format!(
                    "{entry:?}: a status (404), a class (5xx), or either after ! to leave it out"
                )
            })?;
            if exclude {
                excluded.push(range);
            } else {
                range.for_each(|s| set.put(s, true));
            }
        }
        for range in excluded {
            range.for_each(|s| set.put(s, false));
        }
        if set.bits.iter().all(|b| *b == 0) {
            return Err("no status is left to count as delivered".into());
        }
        Ok(set)
    }

    pub fn default_set() -> StatusSet {
        let entries: Vec<String> = DELIVERED_DEFAULT.iter().map(|s| s.to_string()).collect();
        // The default parses: a test says so; an empty set would deliver nothing.
        StatusSet::parse(&entries).unwrap_or(StatusSet { bits: [0; 16] })
    }

    fn put(&mut self, status: u16, on: bool) {
        let (word, bit) = (usize::from(status / 64), status % 64);
        if let Some(w) = self.bits.get_mut(word) {
            if on {
                *w |= 1 << bit;
            } else {
                *w &= !(1 << bit);
            }
        }
    }

    pub fn contains(&self, status: u16) -> bool {
        let (word, bit) = (usize::from(status / 64), status % 64);
        self.bits.get(word).is_some_and(|w| w & (1 << bit) != 0)
    }
}

/// `404` or `4xx` as the statuses it names.
fn status_range(spec: &str) -> Option<std::ops::RangeInclusive<u16>> {
    let b = spec.as_bytes();
    if b.len() != 3 || !(b'1'..=b'9').contains(&b[0]) {
        return None;
    }
    let class = u16::from(b[0] - b'0') * 100;
    if b[1..].eq_ignore_ascii_case(b"xx") {
        return Some(class..=class + 99);
    }
    let n: u16 = spec.parse().ok()?;
    Some(n..=n)
}

/// How long `Retry-After` asks to wait (RFC 9110 10.2.3: seconds, or an HTTP date),
/// at most `max`; `None` when the answer has none or it cannot be read.
pub fn retry_after(value: Option<&hyper::header::HeaderValue>, max: Duration) -> Option<Duration> {
    let text = value?.to_str().ok()?.trim();
    let wait = match text.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => {
            let at = httpdate::parse_http_date(text).ok()?;
            at.duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO)
        }
    };
    Some(wait.min(max))
}

/// The pause after the `attempt`-th failed attempt (from 1): `first`, doubling, at
/// most `max`.
pub fn backoff(attempt: u32, first: Duration, max: Duration) -> Duration {
    assert!(
        attempt >= 1,
        "a backoff follows a failed attempt (counted from 1)"
    );
    let doublings = attempt.saturating_sub(1).min(30);
    first.saturating_mul(1 << doublings).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    #[test]
    fn the_default_delivers_answers_but_errors_timeouts_and_limits() {
        let d = StatusSet::default_set();
        for s in [200, 204, 301, 304, 400, 404, 409, 499] {
            assert!(d.contains(s), "{s}");
        }
        for s in [100, 408, 429, 500, 502, 503, 504, 599, 600, 999] {
            assert!(!d.contains(s), "{s}");
        }
    }

    #[test]
    fn entries_are_classes_statuses_and_exclusions() {
        let list =
            |l: &[&str]| StatusSet::parse(&l.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let s = list(&["!201", "2xx", "503"]).unwrap();
        assert!(s.contains(200) && !s.contains(201) && s.contains(503) && !s.contains(502));
        assert!(list(&["2XX"]).unwrap().contains(299));
        for bad in [
            &["2x"][..],
            &["0xx"],
            &["20"],
            &["abc"],
            &["!"],
            &[],
            &["2xx", "!2xx"],
        ] {
            assert!(list(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn retry_after_takes_seconds_and_dates_within_the_cap() {
        let max = Duration::from_secs(60);
        let v = |s: &str| HeaderValue::from_str(s).unwrap();
        assert_eq!(
            retry_after(Some(&v("3")), max),
            Some(Duration::from_secs(3))
        );
        assert_eq!(retry_after(Some(&v("99999")), max), Some(max));
        assert_eq!(retry_after(Some(&v("soon")), max), None);
        assert_eq!(retry_after(None, max), None);
        let past = v("Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(retry_after(Some(&past), max), Some(Duration::ZERO));
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(10));
        let wait = retry_after(Some(&v(&later)), max).unwrap();
        assert!(
            wait > Duration::from_secs(8) && wait <= Duration::from_secs(10),
            "{wait:?}"
        );
    }

    #[test]
    fn the_backoff_doubles_to_its_cap() {
        let (first, max) = (Duration::from_millis(500), Duration::from_secs(30));
        let pauses: Vec<u64> = (1..=9)
            .map(|a| backoff(a, first, max).as_millis() as u64)
            .collect();
        assert_eq!(
            pauses,
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        assert_eq!(backoff(u32::MAX, first, max), max);
    }

    #[test]
    #[should_panic(expected = "a backoff follows a failed attempt")]
    fn a_backoff_before_any_attempt_is_a_programmer_error() {
        backoff(0, Duration::from_millis(500), Duration::from_secs(30));
    }
}
