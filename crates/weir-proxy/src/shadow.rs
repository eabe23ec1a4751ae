//! Shadows: each replays a route's captured requests from its own reader of the
//! route's capture queue, so a shadow that is slow or down builds a backlog on disk
//! (bounded by the queue's limits; on JetStream, by the stream's), never in memory,
//! and never touches a client's request. A restart resumes where each shadow stood: a replay is confirmed once
//! the shadow answered (any status) or its retries ran out.
//!
//! Per shadow: `rate` (replays per second at most), `sample_percent` (decided by
//! the request's sequence number, so the same requests on every restart),
//! `concurrency` (replays in flight; 1 keeps the order), `timeout_ms`, `retries`
//! (for a replay that timed out or broke after connecting). A shadow that refuses
//! connections is down: the replay waits, with a pause that doubles up to 30 s,
//! and is not counted as an attempt.
//!
//! With `replay = "sequential"` one reader replays each request to the shadows in
//! their order, the next only after the previous answered below 500, stopping at
//! the first failure (rocky's `replaySequentially`).
//!
//! A shadow with `diff = true` has its answers read and compared with the
//! primary's (`differ.rs`).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderName, HeaderValue, HOST};
use hyper::{Request, Uri};
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;
use weir_backend::{Backend, Lease, Reader, TakeMode};

use crate::capture::Captured;
use crate::config::{RouteSettings, ShadowSettings, Target};
use crate::differ::{RouteDiff, ShadowDiff};
use crate::forward::{http_client, HttpClient};
use crate::metrics::ShadowCounters;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const DOWN_PAUSE_FIRST: Duration = Duration::from_millis(100);
const DOWN_PAUSE_MAX: Duration = Duration::from_secs(30);
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// How long a worker waits for a captured request before it looks around again.
const TAKE_WAIT: Duration = Duration::from_secs(1);
/// The reader of a route replaying sequentially.
pub const SEQUENTIAL_READER: &str = "sequential";
/// The header every replay carries: `ROUTE/SHADOW`.
pub const REPLAY_HEADER: &str = "x-weir-replay";

/// A shadow as it runs.
pub struct ShadowRt {
    pub route: String,
    pub settings: ShadowSettings,
    pub client: HttpClient,
    pub counters: ShadowCounters,
    /// Present when the shadow's answers are compared with the primary's.
    pub diff: Option<ShadowDiff>,
}

/// One replaying reader: a shadow (concurrent mode), or the route's shadows in
/// order (sequential mode).
struct Replayer {
    reader: Reader,
    shadows: Vec<Arc<ShadowRt>>,
    shutdown: watch::Receiver<bool>,
}

/// Sets up the readers of a route's capture queue `queue` (one per shadow, or the
/// sequential one, and `record`'s on a recording route; see [`forget_readers`] for
/// one no longer configured) and starts their replay workers. Returns the queue, and
/// its shadows (for metrics) with the reader each one's backlog is read from.
pub async fn start(
    backend: &Backend,
    queue: &str,
    route: &RouteSettings,
    shutdown: &watch::Receiver<bool>,
) -> weir_backend::Result<(weir_backend::Queue, Vec<(Arc<ShadowRt>, String)>)> {
    let route_diff = route.diffs().then(|| Arc::new(RouteDiff::new(route)));
    let shadows: Vec<Arc<ShadowRt>> = route
        .shadows
        .iter()
        .map(|s| {
            Arc::new(ShadowRt {
                route: route.name.clone(),
                settings: s.clone(),
                client: http_client(CONNECT_TIMEOUT, &route.tls),
                counters: ShadowCounters::default(),
                diff: route_diff.as_ref().filter(|_| s.diff).map(|d| ShadowDiff {
                    route: Arc::clone(d),
                    stats: Default::default(),
                }),
            })
        })
        .collect();
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
        .queue_for_readers(queue, &wanted, route.record)
        .await?;
    forget_readers(backend, queue, &wanted).await?;
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

/// The readers of `queue` not in `wanted`: a shadow removed (or a change of mode)
/// leaves a reader nobody reads, which keeps every capture. On the embedded engine it
/// is deleted (one proxy owns the data directory). On JetStream several proxies share
/// the queue, and one still running an older config (a rolling deploy) may read it:
/// it is named in a warning, for the operator to delete (`delete QUEUE.READER` on the
/// memcache port) once no proxy replays to it. Best effort there: a cluster that
/// cannot be asked is no reason to stop the proxy.
pub async fn forget_readers(
    backend: &Backend,
    queue: &str,
    wanted: &[&str],
) -> weir_backend::Result<()> {
    let on_engine = backend.engine_store().is_some();
    let stats = match backend.stats(Some(vec![queue.to_owned()])).await {
        Ok(stats) => stats,
        Err(e) if !on_engine => {
            tracing::warn!(queue, error = %e, "could not look for readers of shadows no longer configured");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let names = stats.into_iter().flat_map(|q| q.readers).map(|r| r.name);
    for old in names.filter(|n| !wanted.contains(&n.as_str())) {
        if on_engine {
            tracing::info!(queue, reader = %old, "deleting the reader of a shadow no longer configured");
            backend.delete_reader(queue, &old).await?;
        } else if old.is_empty() {
            tracing::warn!(queue, "the capture queue has a default reader (made through the memcache port), which keeps every capture; remove its consumer QUEUE~ with the nats tools");
        } else {
            tracing::warn!(queue, reader = %old, "a reader of the capture queue is no shadow of this proxy's config; it keeps every capture until deleted (delete QUEUE.READER on the memcache port, once no proxy replays to it)");
        }
    }
    Ok(())
}

/// How one replay ended.
enum Outcome {
    /// The shadow answered with this status.
    Answered(u16),
    /// Retries ran out.
    GaveUp,
    /// The proxy is stopping: not confirmed, replayed after the restart.
    Stopped,
}

impl Replayer {
    fn stopping(&self) -> bool {
        *self.shutdown.borrow()
    }

    async fn run(mut self) {
        let first = &self.shadows[0].settings;
        let alone = self.shadows.len() == 1;
        let slots = Arc::new(Semaphore::new(if alone { first.concurrency } else { 1 }));
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
            tokio::spawn(async move {
                let _permit = permit;
                if replay_all(&shadows, &captured, &shutdown).await {
                    let _ = reader.confirm(&lease).await;
                } else {
                    let _ = reader.release(&lease);
                }
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

/// Replays to each shadow in turn (one, in concurrent mode); false when stopped.
async fn replay_all(
    shadows: &[Arc<ShadowRt>],
    captured: &Captured,
    shutdown: &watch::Receiver<bool>,
) -> bool {
    for s in shadows {
        match replay(s, captured, shutdown.clone()).await {
            Outcome::Stopped => return false,
            Outcome::Answered(status) if status < 500 => {}
            Outcome::Answered(_) | Outcome::GaveUp => break,
        }
    }
    true
}

/// Bytes of a shadow's answer read before it is dropped (the answer is not used;
/// reading a little lets a small one end cleanly and keep its connection).
const DRAIN_BYTES_MAX: usize = 64 * 1024;

/// Reads and discards an answer's body, at most [`DRAIN_BYTES_MAX`] bytes and
/// `within`: a huge or endless answer is dropped, never held in memory.
pub async fn drain(mut body: hyper::body::Incoming, within: Duration) {
    let read = async {
        let mut seen = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |d| d.len());
            if seen > DRAIN_BYTES_MAX {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(within, read).await;
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

/// The request a captured one becomes for `t`: the captured method, path, headers
/// and body, `Host` set to the target's, and `x-weir-replay: TAG`.
pub(crate) fn request_for(
    t: &Target,
    tag: &str,
    c: &Captured,
) -> Option<Request<crate::forward::ProxyBody>> {
    let uri: Uri = t.url(&c.uri).parse().ok()?;
    let mut req = Request::new(
        Full::new(c.body.clone())
            .map_err(|never| match never {})
            .boxed(),
    );
    *req.method_mut() = c.method.parse().ok()?;
    *req.uri_mut() = uri;
    let headers = req.headers_mut();
    for (k, v) in &c.headers {
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(v),
        ) {
            headers.append(k, v);
        }
    }
    headers.insert(HOST, HeaderValue::from_str(&t.authority).ok()?);
    headers.insert(REPLAY_HEADER, HeaderValue::from_str(tag).ok()?);
    Some(req)
}

/// One replay to one shadow, with its retries and its waits while the shadow is down.
async fn replay(s: &ShadowRt, c: &Captured, mut shutdown: watch::Receiver<bool>) -> Outcome {
    let mut attempts = 0u32;
    let mut down_pause = DOWN_PAUSE_FIRST;
    let tag = format!("{}/{}", s.route, s.settings.name);
    loop {
        let Some(req) = request_for(&s.settings.target, &tag, c) else {
            s.counters.failed.fetch_add(1, Relaxed);
            return Outcome::GaveUp;
        };
        let pause = match tokio::time::timeout(s.settings.timeout, s.client.request(req)).await {
            Ok(Ok(response)) => {
                let status = response.status().as_u16();
                let class = usize::from(status / 100).clamp(1, 5) - 1;
                s.counters.status[class].fetch_add(1, Relaxed);
                match &s.diff {
                    Some(d) => {
                        let answer = crate::differ::read(
                            response,
                            d.route.body_bytes_max,
                            s.settings.timeout,
                        )
                        .await;
                        d.judge(c, answer).await;
                    }
                    None => drain(response.into_body(), s.settings.timeout).await,
                }
                return Outcome::Answered(status);
            }
            Ok(Err(e)) if e.is_connect() && !crate::tls::is_tls_failure(&e) => {
                if down_pause == DOWN_PAUSE_FIRST {
                    tracing::warn!(route = %s.route, shadow = %s.settings.name, error = %crate::forward::error_chain(&e), "the shadow is down; its replays wait");
                }
                let p = down_pause;
                down_pause = (down_pause * 2).min(DOWN_PAUSE_MAX);
                p
            }
            // A certificate or handshake refused is not a shadow down: waiting would
            // not mend it. It fails, is counted, and says why.
            other => {
                if let Ok(Err(e)) = &other {
                    if crate::tls::is_tls_failure(e) {
                        tracing::warn!(route = %s.route, shadow = %s.settings.name, error = %crate::forward::error_chain(e), "TLS to the shadow failed");
                    }
                }
                attempts += 1;
                if attempts > s.settings.retries {
                    s.counters.failed.fetch_add(1, Relaxed);
                    return Outcome::GaveUp;
                }
                RETRY_PAUSE * attempts
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.changed() => return Outcome::Stopped,
        }
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
}
