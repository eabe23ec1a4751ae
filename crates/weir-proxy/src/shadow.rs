//! Shadows: each replays a route's captured requests from its own reader of the
//! route's capture queue, so a shadow that is slow or down builds a backlog on disk
//! (bounded by the queue's limits; on JetStream, by the stream's), never in memory,
//! and never touches a client's request. A restart resumes where each shadow stood: a replay is confirmed once
//! the shadow's answer counted as delivered, or once it is kept as a dead letter.
//!
//! Per shadow: `rate` (replays per second at most), `sample_percent` (decided by
//! the request's sequence number, so the same requests on every restart),
//! `concurrency` (replays in flight; 1 keeps the order), `timeout_ms`, and when a
//! replay counts as delivered and how one that does not is tried again
//! (`deliver.rs`): `delivered`, `attempts_max`, `retry_backoff_ms`,
//! `retry_backoff_ms_max`, `retry_after_ms_max`. A replay out of attempts goes to
//! the shadow's dead letters (`dead.rs`), never dropped. A shadow that refuses
//! connections, breaks them, times out or answers 5xx is down: no replay is sent to
//! it until a probe finds it back (`probe.rs`), and a refused connection is not
//! counted as an attempt.
//!
//! With `replay = "sequential"` one reader replays each request to the shadows in
//! their order, the next only after the previous one's replay was delivered; one
//! that runs out of attempts is a dead letter of that shadow, and a re-drive of it
//! replays to that shadow and the ones after it (rocky's `replaySequentially`).
//!
//! A shadow with `diff = true` has its answers read and compared with the
//! primary's (`differ.rs`).

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use hyper::Request;
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;
use weir_backend::{Backend, Lease, Reader, TakeMode};

use crate::body::{drain, ProxyBody};
use crate::capture::Captured;
use crate::client::{error_chain, http_client, HttpClient};
use crate::config::{RetrySettings, RouteSettings, ShadowSettings};
use crate::dead::DeadLetters;
use crate::differ::{RouteDiff, ShadowDiff};
use crate::metrics::ShadowCounters;
use crate::probe::Health;
use crate::replay_request::request_for;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a worker waits for a captured request before it looks around again.
const TAKE_WAIT: Duration = Duration::from_secs(1);
/// The reader of a route replaying sequentially.
pub const SEQUENTIAL_READER: &str = "sequential";

/// A configured shadow as it runs: its settings with what replaying to it takes
/// (the client, the counters, the comparison, the health probe, the dead letters).
pub struct LiveShadow {
    pub route: String,
    pub settings: ShadowSettings,
    pub client: HttpClient,
    pub counters: ShadowCounters,
    /// Present when the shadow's answers are compared with the primary's.
    pub diff: Option<ShadowDiff>,
    pub health: Health,
    pub dead: DeadLetters,
    /// In sequential mode, the shadows after this one (a re-drive of its dead
    /// letters replays to them too).
    pub after: std::sync::OnceLock<Vec<Arc<LiveShadow>>>,
    pub shutdown: watch::Receiver<bool>,
}

/// One replaying reader: a shadow (concurrent mode), or the route's shadows in
/// order (sequential mode).
struct Replayer {
    reader: Reader,
    shadows: Vec<Arc<LiveShadow>>,
    shutdown: watch::Receiver<bool>,
}

/// Sets up the readers of a route's capture queue `queue` (one per shadow, or the
/// sequential one, and `record`'s on a recording route; see `readers.rs` for
/// one no longer configured) and starts their replay workers. The queue's leases
/// never time out: a replay waits for a shadow as long as it takes, and a lease
/// ending under it would replay the request twice. Returns the queue, and its
/// shadows (for metrics) with the reader each one's backlog is read from.
pub async fn start(
    backend: &Arc<Backend>,
    queue: &str,
    route: &RouteSettings,
    shutdown: &watch::Receiver<bool>,
) -> weir_backend::Result<(weir_backend::Queue, Vec<(Arc<LiveShadow>, String)>)> {
    let shadows = shadows_of(backend, route, shutdown);
    let mut wanted: Vec<&str> = if route.shadows.is_empty() {
        Vec::new()
    } else if route.sequential {
        vec![SEQUENTIAL_READER]
    } else {
        route.shadows.iter().map(|s| s.name.as_str()).collect()
    };
    if route.record {
        wanted.push(crate::record::RECORD_READER);
    }
    // The wanted readers first: on JetStream a queue with no reader left loses what
    // it holds, so a shadow renamed there keeps the backlog only this way round.
    let (handle, readers) = backend
        .queue_for_readers_with(
            queue,
            &wanted,
            route.record,
            weir_backend::QueueOptions::NO_LEASE_TIMEOUT,
        )
        .await?;
    // One reader per name asked, in their order (the backend's contract): the
    // shadows are matched to them by position below.
    assert_eq!(
        readers.len(),
        wanted.len(),
        "the backend gave a reader for each name asked"
    );
    crate::readers::forget_readers(backend, queue, &wanted).await?;
    let mut started = Vec::new();
    if route.sequential && !shadows.is_empty() {
        let r = Replayer {
            reader: readers[0].clone(),
            shadows: shadows.clone(),
            shutdown: shutdown.clone(),
        };
        tokio::spawn(r.run());
        started.extend(
            shadows
                .iter()
                .map(|s| (Arc::clone(s), SEQUENTIAL_READER.to_string())),
        );
    } else {
        for (s, reader) in shadows.iter().zip(&readers) {
            let r = Replayer {
                reader: reader.clone(),
                shadows: vec![Arc::clone(s)],
                shutdown: shutdown.clone(),
            };
            tokio::spawn(r.run());
            started.push((Arc::clone(s), s.settings.name.clone()));
        }
    }
    Ok((handle, started))
}

/// A route's shadows as they run (in sequential mode each knows the ones after it).
fn shadows_of(
    backend: &Arc<Backend>,
    route: &RouteSettings,
    shutdown: &watch::Receiver<bool>,
) -> Vec<Arc<LiveShadow>> {
    let route_diff = route.diffs().then(|| Arc::new(RouteDiff::new(route)));
    let shadows: Vec<Arc<LiveShadow>> = route
        .shadows
        .iter()
        .map(|s| {
            let client = http_client(CONNECT_TIMEOUT, &route.tls);
            Arc::new(LiveShadow {
                route: route.name.clone(),
                settings: s.clone(),
                health: Health::new(&route.name, s, client.clone(), shutdown.clone()),
                client,
                counters: ShadowCounters::default(),
                diff: route_diff.as_ref().filter(|_| s.diff).map(|d| ShadowDiff {
                    route: Arc::clone(d),
                    stats: Default::default(),
                }),
                dead: DeadLetters::new(Arc::clone(backend), &route.name, &s.name),
                after: Default::default(),
                shutdown: shutdown.clone(),
            })
        })
        .collect();
    if route.sequential {
        for (i, s) in shadows.iter().enumerate() {
            let first_set = s.after.set(shadows[i + 1..].to_vec()).is_ok();
            assert!(
                first_set,
                "a shadow's followers are set once, when it is made"
            );
        }
    }
    shadows
}

/// How one replay ended.
enum Outcome {
    /// The shadow's answer counted as delivered.
    Delivered,
    /// Attempts ran out, for this reason.
    Exhausted(String),
    /// The proxy is stopping: not confirmed, replayed after the restart.
    Stopped,
}

impl Replayer {
    fn stopping(&self) -> bool {
        *self.shutdown.borrow()
    }

    async fn run(mut self) {
        assert!(
            !self.shadows.is_empty(),
            "a replayer replays to a shadow at least"
        );
        let first = &self.shadows[0].settings;
        let alone = self.shadows.len() == 1;
        // Sequential mode keeps the order: one replay at a time.
        let limit = if alone { first.concurrency } else { 1 };
        // Zero would stop the shadow for ever; the config's `resolve` clamps it.
        assert!(limit >= 1, "a shadow's concurrency is 1 at least");
        let slots = Arc::new(Semaphore::new(limit));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let rate = if alone { first.rate } else { None };
        let mut next_slot = Instant::now();
        let reader = self.reader.clone();
        while !self.stopping() {
            let permit = tokio::select! {
                p = Arc::clone(&slots).acquire_owned() => match p { Ok(p) => p, Err(_) => return },
                _ = self.shutdown.changed() => return,
            };
            if let Some(rate) = rate {
                tokio::select! {
                    _ = tokio::time::sleep_until(next_slot) => {}
                    _ = self.shutdown.changed() => return,
                }
                next_slot = next_slot.max(Instant::now()) + Duration::from_secs_f64(1.0 / rate);
            }
            let mut stop = self.shutdown.clone();
            let next = tokio::select! {
                n = self.next(&reader) => n,
                _ = stop.changed() => return,
            };
            let Some((lease, captured)) = next else {
                continue;
            };
            let (shadows, shutdown, reader) =
                (self.shadows.clone(), self.shutdown.clone(), reader.clone());
            let in_flight = Arc::clone(&in_flight);
            tokio::spawn(async move {
                let _permit = permit;
                let now = in_flight.fetch_add(1, Relaxed) + 1;
                assert!(now <= limit, "{now} replays in flight, over {limit}");
                if replay_all(&shadows, &captured, &shutdown).await {
                    let _ = reader.confirm(&lease).await;
                } else {
                    let _ = reader.release(&lease);
                }
                // Counted down before the permit (dropped at the task's end) goes back.
                in_flight.fetch_sub(1, Relaxed);
            });
        }
    }

    /// The next captured request to replay, leased; `None` when there is none for
    /// now, or when the one taken is left out by the sample or damaged (then it is
    /// confirmed: nothing to replay).
    async fn next(&self, reader: &Reader) -> Option<(Lease, Captured)> {
        let taken = match reader.take(TakeMode::Lease, TAKE_WAIT).await {
            Ok(t) => t?,
            Err(e) => {
                tracing::warn!(queue = reader.queue_name(), error = %e, "could not take a captured request");
                tokio::time::sleep(TAKE_WAIT).await;
                return None;
            }
        };
        let lease = taken.lease?;
        let sample = if self.shadows.len() == 1 {
            self.shadows[0].settings.sample_percent
        } else {
            100.0
        };
        if !sampled(taken.item.seq, sample) {
            self.shadows[0].counters.skipped.fetch_add(1, Relaxed);
            let _ = reader.confirm(&lease).await;
            return None;
        }
        match Captured::decode(&taken.item.data) {
            Ok(c) => Some((lease, c)),
            Err(e) => {
                tracing::warn!(
                    queue = reader.queue_name(),
                    seq = taken.item.seq,
                    "skipping a damaged capture: {e}"
                );
                let _ = reader.confirm(&lease).await;
                None
            }
        }
    }
}

/// Replays to each shadow in turn (one, in concurrent mode), stopping at one that
/// ran out of attempts (then kept in its dead letters). True when the capture is
/// done with and to be confirmed; false when the proxy stops, or a dead letter could
/// not be stored (the capture is then released, to be replayed again).
pub(crate) async fn replay_all(
    shadows: &[Arc<LiveShadow>],
    captured: &Captured,
    shutdown: &watch::Receiver<bool>,
) -> bool {
    for s in shadows {
        match replay(s, captured, shutdown.clone()).await {
            Outcome::Stopped => return false,
            Outcome::Delivered => {}
            Outcome::Exhausted(why) => {
                let kept = s.dead.bury(captured, &why).await;
                if kept {
                    s.counters.failed.fetch_add(1, Relaxed);
                }
                return kept;
            }
        }
    }
    true
}

/// Whether the request of sequence number `seq` is in a `percent` sample.
fn sampled(seq: u64, percent: f64) -> bool {
    if percent >= 100.0 {
        return true;
    }
    // A fixed mix of the bits (splitmix64's finaliser): the same answer every time.
    let mut x = seq.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    ((x % 10_000) as f64) < percent * 100.0
}

/// What one attempt of a replay gave.
enum Attempt {
    Delivered,
    /// The connection was refused: the shadow is down (not counted as an attempt).
    Refused(String),
    /// To be tried again: a status not delivered, a reset, a timeout, TLS refused.
    Failed {
        retry_after: Option<Duration>,
        /// Whether it says the shadow is down (5xx, reset, timeout).
        down: bool,
        why: String,
    },
}

/// One replay to one shadow: attempts while the shadow is up, until one is
/// delivered or `attempts_max` ran out, with a pause between them.
async fn replay(s: &Arc<LiveShadow>, c: &Captured, mut shutdown: watch::Receiver<bool>) -> Outcome {
    let retry = &s.settings.retry;
    let tag = format!("{}/{}", s.route, s.settings.name);
    let mut attempts = 0u32;
    loop {
        if !s.health.wait_up(&mut shutdown).await {
            return Outcome::Stopped;
        }
        let Some(req) = request_for(&s.settings.target, &tag, c) else {
            return Outcome::Exhausted("the capture does not make a valid request".into());
        };
        let recoveries = s.health.recoveries();
        let (retry_after, why) = match attempt(s, c, req).await {
            Attempt::Delivered => return Outcome::Delivered,
            Attempt::Refused(why) => {
                s.health.mark_down(&why);
                continue;
            }
            Attempt::Failed {
                retry_after,
                down,
                why,
            } => {
                if down {
                    s.health.mark_down(&why);
                }
                (retry_after, why)
            }
        };
        attempts += 1;
        if attempts >= retry.attempts_max {
            // A dead letter only after the last attempt, never past it.
            assert_eq!(attempts, retry.attempts_max, "attempts counted one by one");
            return Outcome::Exhausted(format!("{why} ({attempts} attempts)"));
        }
        s.counters.retried.fetch_add(1, Relaxed);
        let pause = pause_after(retry, attempts, retry_after);
        // A backoff ends early when the shadow comes back from an outage; a wait
        // the shadow asked for (`Retry-After`) does not.
        let woken = async {
            match retry_after {
                Some(_) => std::future::pending().await,
                None => s.health.recovered_after(recoveries).await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = woken => {}
            _ = shutdown.wait_for(|stop| *stop) => return Outcome::Stopped,
        }
    }
}

/// The pause before the next attempt, after `attempts` failed ones: the wait the
/// shadow's `Retry-After` asked for (capped when read, `deliver::retry_after`), or
/// else the doubling backoff.
fn pause_after(retry: &RetrySettings, attempts: u32, retry_after: Option<Duration>) -> Duration {
    let Some(asked) = retry_after else {
        let pause = crate::deliver::backoff(attempts, retry.backoff, retry.backoff_max);
        assert!(
            pause <= retry.backoff_max,
            "{pause:?}: a backoff over its cap"
        );
        let floor = retry.backoff.min(retry.backoff_max);
        assert!(pause >= floor, "{pause:?}: a backoff under its first pause");
        return pause;
    };
    let cap = retry.retry_after_max;
    assert!(asked <= cap, "{asked:?}: a Retry-After wait over its cap");
    asked
}

/// Sends one attempt and reads its answer (compared with the primary's for a
/// diffing shadow, when delivered).
async fn attempt(s: &LiveShadow, c: &Captured, req: Request<ProxyBody>) -> Attempt {
    let within = s.settings.timeout;
    match tokio::time::timeout(within, s.client.request(req)).await {
        Ok(Ok(response)) => {
            let status = response.status().as_u16();
            if !s.settings.retry.delivered.contains(status) {
                let retry_after = crate::deliver::retry_after(
                    response.headers().get(hyper::header::RETRY_AFTER),
                    s.settings.retry.retry_after_max,
                );
                drain(response.into_body(), within).await;
                return Attempt::Failed {
                    retry_after,
                    down: status >= 500,
                    why: format!("answered {status}"),
                };
            }
            let class = usize::from(status / 100).clamp(1, 5) - 1;
            s.counters.status[class].fetch_add(1, Relaxed);
            match &s.diff {
                Some(d) => {
                    let answer =
                        crate::differ::read(response, d.route.body_bytes_max, within).await;
                    d.judge(c, answer).await;
                }
                None => drain(response.into_body(), within).await,
            }
            Attempt::Delivered
        }
        Ok(Err(e)) if e.is_connect() && !crate::tls::is_tls_failure(&e) => {
            Attempt::Refused(error_chain(&e))
        }
        // A certificate or handshake refused is not a shadow down: waiting would
        // not mend it. It is tried again, and kept as a dead letter in the end.
        Ok(Err(e)) => Attempt::Failed {
            retry_after: None,
            down: !crate::tls::is_tls_failure(&e),
            why: error_chain(&e),
        },
        Err(_) => Attempt::Failed {
            retry_after: None,
            down: true,
            why: format!("no answer within {} ms", within.as_millis()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_is_the_same_every_time_and_about_its_size() {
        let picked = (0..10_000).filter(|&s| sampled(s, 25.0)).count();
        assert!((2_200..2_800).contains(&picked), "{picked}");
        assert_eq!(
            (0..100).filter(|&s| sampled(s, 25.0)).count(),
            (0..100).filter(|&s| sampled(s, 25.0)).count()
        );
        assert!((0..1000).all(|s| sampled(s, 100.0)));
        assert!((0..1000).all(|s| !sampled(s, 0.0)));
    }

    fn retry() -> RetrySettings {
        RetrySettings {
            delivered: crate::deliver::StatusSet::default_set(),
            attempts_max: 5,
            backoff: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            retry_after_max: Duration::from_secs(60),
            probe_path: "/".into(),
            probe_interval: Duration::from_secs(1),
        }
    }

    #[test]
    fn a_pause_is_the_wait_asked_for_or_the_backoff() {
        let r = retry();
        let asked = Some(Duration::from_secs(7));
        assert_eq!(pause_after(&r, 1, asked), Duration::from_secs(7));
        assert_eq!(pause_after(&r, 1, None), Duration::from_millis(500));
        assert_eq!(pause_after(&r, 3, None), Duration::from_secs(2));
        assert_eq!(pause_after(&r, 30, None), Duration::from_secs(30));
    }

    #[test]
    #[should_panic(expected = "a Retry-After wait over its cap")]
    fn a_wait_past_its_cap_is_a_programmer_error() {
        // `deliver::retry_after` caps what a shadow asks for: a wait over the cap
        // here was not read through it.
        pause_after(&retry(), 1, Some(Duration::from_secs(61)));
    }
}
