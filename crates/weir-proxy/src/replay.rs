//! Replay to any URL, later: `weir replay` sends recorded captures to a target of the
//! operator's choosing (a load test, a new version, a laptop), at the pace chosen:
//! as fast as `concurrency` allows, at a `rate` per second, or at a `speed` that
//! keeps the captured gaps between requests (divided by the speed: 1 is real time,
//! 2 twice as fast).
//!
//! Each capture becomes the request a shadow would get: the captured method, path
//! and query under the target's base path, the captured headers, `Host` set to the
//! target's, `x-weir-replay: replay`, and the body. An
//! answer of any status counts as sent, by status class; a request that could not
//! be sent (no connection, no answer within the timeout) is counted as failed and
//! not tried again. Answers are read up to 64 KiB and dropped.
//!
//! Captures come through a bounded channel, so a recording of any size replays in
//! bounded memory: the reader (a file, a queue, weir's HTTP port) waits while the
//! requests in flight are full.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;

use crate::body::drain;
use crate::capture::Captured;
use crate::client::{error_chain, http_client, HttpClient};
use crate::config::{parse_target, Target};
use crate::replay_request::request_for;

/// The `x-weir-replay` header's value on requests `weir replay` sends.
pub const REPLAY_TAG: &str = "replay";
/// Requests in flight at most.
pub const CONCURRENCY_MAX: usize = 1024;
/// Reasons of failed requests kept for the summary (the count goes on).
pub const FAILURES_KEPT: usize = 10;

/// How requests are spaced.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pace {
    /// As fast as `concurrency` allows.
    Unpaced,
    /// This many requests per second at most.
    Rate(f64),
    /// The captured gaps divided by this.
    Speed(f64),
}

/// Where and how to replay.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    pub target: Target,
    pub pace: Pace,
    pub concurrency: usize,
    /// For each request: connecting and the answer's head, then reading its body.
    pub timeout: Duration,
    /// TLS to an `https://` target (the built-in roots).
    pub tls: Arc<rustls::ClientConfig>,
}

impl ReplayOptions {
    /// Checks the options: an `http://` or `https://host:port/base` URL, a positive finite rate or
    /// speed, 1 to [`CONCURRENCY_MAX`] in flight, a timeout of at least 1 ms.
    pub fn new(
        url: &str,
        pace: Pace,
        concurrency: usize,
        timeout: Duration,
    ) -> Result<ReplayOptions, String> {
        let target = parse_target("--to", url).map_err(|e| e.to_string())?;
        match pace {
            Pace::Rate(r) if !(r.is_finite() && r > 0.0) => {
                return Err("--rate: a positive number of requests per second".into())
            }
            Pace::Speed(s) if !(s.is_finite() && s > 0.0) => {
                return Err("--speed: a positive factor (1 is real time)".into())
            }
            _ => {}
        }
        if !(1..=CONCURRENCY_MAX).contains(&concurrency) {
            return Err(format!("--concurrency: 1 to {CONCURRENCY_MAX}"));
        }
        if timeout.is_zero() {
            return Err("--timeout-ms: at least 1".into());
        }
        Ok(ReplayOptions {
            target,
            pace,
            concurrency,
            timeout,
            tls: crate::tls::client_config(None)?,
        })
    }

    /// Trusts the CA certificates of a PEM file too, for an `https://` target.
    pub fn with_ca_file(mut self, ca_file: &std::path::Path) -> Result<ReplayOptions, String> {
        self.tls = crate::tls::client_config(Some(ca_file))?;
        Ok(self)
    }
}

/// What a replay did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplaySummary {
    /// Requests sent (answered or failed).
    pub sent: u64,
    /// Answers by status class: 1xx to 5xx.
    pub by_class: [u64; 5],
    /// Requests that got no answer.
    pub failed: u64,
    pub elapsed: Duration,
    /// The first [`FAILURES_KEPT`] failures' reasons.
    pub failures: Vec<String>,
}

/// Sends every capture `source` yields to the target, paced, at most `concurrency`
/// at a time; returns when the source is done and every request has ended.
pub async fn replay(
    mut source: mpsc::Receiver<Captured>,
    options: &ReplayOptions,
) -> ReplaySummary {
    let client = http_client(options.timeout, &options.tls);
    let slots = Arc::new(Semaphore::new(options.concurrency));
    let summary = Arc::new(Mutex::new(ReplaySummary::default()));
    let started = Instant::now();
    let mut first_at = None;
    let mut index = 0u64;
    let mut tasks = tokio::task::JoinSet::new();
    while let Some(c) = source.recv().await {
        if let Some(due) = due(options.pace, started, index, &mut first_at, c.at_ms) {
            tokio::time::sleep_until(due).await;
        }
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
            break;
        };
        while tasks.try_join_next().is_some() {}
        index += 1;
        summary.lock().sent += 1;
        let (client, summary, options) = (client.clone(), Arc::clone(&summary), options.clone());
        tasks.spawn(async move {
            let _permit = permit;
            let outcome = send_one(&client, &options, &c).await;
            let mut s = summary.lock();
            match outcome {
                Ok(status) => s.by_class[usize::from(status / 100).clamp(1, 5) - 1] += 1,
                Err(reason) => {
                    s.failed += 1;
                    if s.failures.len() < FAILURES_KEPT {
                        s.failures.push(format!("{} {}: {reason}", c.method, c.uri));
                    }
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let mut s = summary.lock().clone();
    s.elapsed = started.elapsed();
    s
}

/// A wait is capped at this: a capture file's times are not trusted.
const WAIT_MAX: Duration = Duration::from_secs(7 * 24 * 3600);

/// `seconds` after `start`, at most [`WAIT_MAX`] (no overflow, whatever the file
/// or the flags say).
fn later(start: Instant, seconds: f64) -> Instant {
    let wait = Duration::try_from_secs_f64(seconds)
        .unwrap_or(WAIT_MAX)
        .min(WAIT_MAX);
    start + wait
}

/// When the `index`-th capture (from 0) is due, if the pace says.
fn due(
    pace: Pace,
    started: Instant,
    index: u64,
    first_at: &mut Option<u64>,
    at_ms: u64,
) -> Option<Instant> {
    match pace {
        Pace::Unpaced => None,
        Pace::Rate(r) => Some(later(started, index as f64 / r)),
        Pace::Speed(x) => {
            // Captures are appended as their requests complete, so times can step
            // back a little: such a one is due at once.
            let first = *first_at.get_or_insert(at_ms);
            let gap_ms = at_ms.saturating_sub(first) as f64 / x;
            Some(later(started, gap_ms / 1000.0))
        }
    }
}

/// One request; the answer's status, or why there was none.
async fn send_one(
    client: &HttpClient,
    options: &ReplayOptions,
    c: &Captured,
) -> Result<u16, String> {
    let req = request_for(&options.target, REPLAY_TAG, c)
        .ok_or("the capture does not make a valid request")?;
    match tokio::time::timeout(options.timeout, client.request(req)).await {
        Ok(Ok(response)) => {
            let status = response.status().as_u16();
            drain(response.into_body(), options.timeout).await;
            Ok(status)
        }
        Ok(Err(e)) => Err(error_chain(&e)),
        Err(_) => Err(format!(
            "no answer within {} ms",
            options.timeout.as_millis()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked() {
        let ms = Duration::from_millis(10);
        assert!(ReplayOptions::new("http://127.0.0.1:1/base", Pace::Unpaced, 4, ms).is_ok());
        assert!(ReplayOptions::new("https://a", Pace::Unpaced, 1, ms).is_ok());
        for (url, pace, n, t) in [
            ("ftp://a", Pace::Unpaced, 1, ms),
            ("http://a", Pace::Rate(0.0), 1, ms),
            ("http://a", Pace::Rate(f64::NAN), 1, ms),
            ("http://a", Pace::Speed(-1.0), 1, ms),
            ("http://a", Pace::Speed(f64::INFINITY), 1, ms),
            ("http://a", Pace::Unpaced, 0, ms),
            ("http://a", Pace::Unpaced, CONCURRENCY_MAX + 1, ms),
            ("http://a", Pace::Unpaced, 1, Duration::ZERO),
        ] {
            assert!(
                ReplayOptions::new(url, pace, n, t).is_err(),
                "{url} {pace:?} {n}"
            );
        }
    }

    #[test]
    fn the_pace_spaces_requests() {
        let t0 = Instant::now();
        let mut first = None;
        assert_eq!(due(Pace::Unpaced, t0, 5, &mut first, 0), None);
        assert_eq!(
            due(Pace::Rate(4.0), t0, 2, &mut first, 0),
            Some(t0 + Duration::from_millis(500))
        );
        // Speed 2: a gap of 1000 ms takes 500; the first capture sets the origin, and
        // one from before it is due at once.
        assert_eq!(due(Pace::Speed(2.0), t0, 0, &mut first, 10_000), Some(t0));
        assert_eq!(
            due(Pace::Speed(2.0), t0, 1, &mut first, 11_000),
            Some(t0 + Duration::from_millis(500))
        );
        assert_eq!(due(Pace::Speed(2.0), t0, 2, &mut first, 9_000), Some(t0));
        // A time from the far future, or a tiny speed or rate, waits at most a week
        // (and does not overflow).
        let far = due(Pace::Speed(1e-300), t0, 3, &mut first, u64::MAX);
        assert_eq!(far, Some(t0 + WAIT_MAX));
        assert_eq!(
            due(Pace::Rate(1e-300), t0, 5, &mut None, 0),
            Some(t0 + WAIT_MAX)
        );
    }
}
