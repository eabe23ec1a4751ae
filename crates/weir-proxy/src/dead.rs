//! Dead letters: a replay that ran out of attempts (`attempts_max`) is appended,
//! whole, to its shadow's dead-letter queue `proxy:capture:ROUTE:dead:SHADOW`
//! (kept by its reader `dead`) before its capture is confirmed: it is never
//! dropped. An append that fails leaves the capture unconfirmed, to be replayed
//! again. The queue is made on the first dead letter (or re-drive), is a capture
//! queue as far as the rest of weir goes (reserved, no lease timeout, `weir capture
//! export` reads it) and is never deleted by the proxy.
//!
//! A re-drive ([`redrive`], `POST /proxy/dead-letters/ROUTE/SHADOW/redrive` on
//! weir's HTTP port) replays the dead letters there were when it began, oldest
//! first and one at a time, as new replays (attempts counted afresh; in sequential
//! mode to that shadow and the ones after it): each is confirmed once delivered, or
//! once dead-lettered again (then at the queue's end, not re-driven twice in one
//! run). A stop of the proxy leaves the one in flight in the queue.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;
use weir_backend::{Backend, Queue, Reader, TakeMode};

use crate::capture::Captured;
use crate::shadow::LiveShadow;

/// The reader that keeps a dead-letter queue's items until they are re-driven.
pub const DEAD_READER: &str = "dead";
/// The pause before a capture whose dead letter could not be stored is replayed
/// again.
const BURY_FAILED_PAUSE: Duration = Duration::from_secs(1);

/// The dead-letter queue of a shadow.
pub fn dead_queue(route: &str, shadow: &str) -> String {
    format!("{}:dead:{shadow}", crate::forward::capture_queue(route))
}

/// A shadow's dead letters.
pub struct DeadLetters {
    backend: Arc<Backend>,
    name: String,
    opened: OnceCell<(Queue, Reader)>,
    redriving: AtomicBool,
}

impl DeadLetters {
    pub fn new(backend: Arc<Backend>, route: &str, shadow: &str) -> DeadLetters {
        DeadLetters {
            backend,
            name: dead_queue(route, shadow),
            opened: OnceCell::new(),
            redriving: AtomicBool::new(false),
        }
    }

    pub fn queue_name(&self) -> &str {
        &self.name
    }

    /// The queue and its reader, made on first use; its leases never time out (a
    /// re-drive holds one while the shadow is down).
    async fn opened(&self) -> weir_backend::Result<&(Queue, Reader)> {
        self.opened
            .get_or_try_init(|| async {
                let (queue, readers) = self
                    .backend
                    .queue_for_readers_with(
                        &self.name,
                        &[DEAD_READER],
                        false,
                        weir_backend::QueueOptions::NO_LEASE_TIMEOUT,
                    )
                    .await?;
                let reader = readers.into_iter().next().ok_or_else(|| {
                    weir_backend::Error::new(
                        weir_backend::Kind::InvalidArgument,
                        "no dead-letter reader",
                    )
                })?;
                Ok((queue, reader))
            })
            .await
    }
}

/// Stores a replay that ran out of attempts in its shadow's dead letters; false
/// (after a pause) when that failed: the capture is then not to be confirmed.
pub async fn bury(s: &LiveShadow, c: &Captured, why: &str) -> bool {
    let stored = match s.dead.opened().await {
        Ok((queue, _)) => queue
            .append(&c.encode(), weir_backend::AppendOptions::default())
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    match stored {
        Ok(()) => {
            s.counters.failed.fetch_add(1, Relaxed);
            tracing::warn!(route = %s.route, shadow = %s.settings.name, method = %c.method, uri = %c.uri, reason = why, queue = s.dead.queue_name(), "a replay ran out of attempts: kept as a dead letter");
            true
        }
        Err(e) => {
            tracing::error!(route = %s.route, shadow = %s.settings.name, error = %e, "could not store a dead letter: the replay is tried again later");
            tokio::time::sleep(BURY_FAILED_PAUSE).await;
            false
        }
    }
}

/// Why a re-drive could not start.
#[derive(Debug)]
pub enum RedriveError {
    /// No such route and shadow in the running proxy (or not set up yet).
    NotFound,
    /// One runs for this shadow already.
    Running,
    /// The proxy is stopping.
    Stopping,
    Backend(weir_backend::Error),
}

impl std::fmt::Display for RedriveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedriveError::NotFound => write!(f, "no such route and shadow in the running proxy"),
            RedriveError::Running => write!(f, "a re-drive of this shadow runs already"),
            RedriveError::Stopping => write!(f, "the proxy is stopping"),
            RedriveError::Backend(e) => write!(f, "the dead-letter queue: {e}"),
        }
    }
}

/// Starts a re-drive of `chain[0]`'s dead letters (to `chain`: the shadow and, in
/// sequential mode, the ones after it) on the current runtime; the number of dead
/// letters it will replay.
pub async fn redrive(chain: Vec<Arc<LiveShadow>>) -> Result<u64, RedriveError> {
    let Some(first) = chain.first().cloned() else {
        return Ok(0);
    };
    if first.dead.redriving.swap(true, Relaxed) {
        return Err(RedriveError::Running);
    }
    let started = async {
        let (queue, reader) = first.dead.opened().await?;
        let (_, end) = queue.bounds().await?;
        let stats = first
            .dead
            .backend
            .stats(Some(vec![first.dead.name.clone()]))
            .await?;
        let count = stats
            .iter()
            .flat_map(|q| &q.readers)
            .find(|r| r.name == DEAD_READER)
            .map_or(0, |r| r.items);
        Ok::<_, weir_backend::Error>((reader.clone(), end, count))
    };
    match started.await {
        Ok((reader, end, count)) => {
            tokio::spawn(async move {
                run_redrive(&chain, &reader, end).await;
                first.dead.redriving.store(false, Relaxed);
            });
            Ok(count)
        }
        Err(e) => {
            first.dead.redriving.store(false, Relaxed);
            Err(RedriveError::Backend(e))
        }
    }
}

/// Replays the dead letters below sequence number `end`, one at a time.
async fn run_redrive(chain: &[Arc<LiveShadow>], reader: &Reader, end: u64) {
    let first = &chain[0];
    let mut shutdown = first.shutdown.clone();
    let mut done = 0u64;
    loop {
        let taken = tokio::select! {
            t = reader.take(TakeMode::Lease, Duration::ZERO) => t,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        let taken = match taken {
            Ok(Some(t)) => t,
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(queue = first.dead.queue_name(), error = %e, "a re-drive could not take a dead letter; it stops");
                break;
            }
        };
        let Some(lease) = taken.lease else { break };
        if taken.item.seq >= end {
            let _ = reader.release(&lease);
            break;
        }
        let confirm = match Captured::decode(&taken.item.data) {
            Ok(c) => crate::shadow::replay_all(chain, &c, &first.shutdown).await,
            Err(e) => {
                tracing::warn!(
                    queue = first.dead.queue_name(),
                    seq = taken.item.seq,
                    "dropping a damaged dead letter: {e}"
                );
                true
            }
        };
        if !confirm {
            let _ = reader.release(&lease);
            break;
        }
        let _ = reader.confirm(&lease).await;
        done += 1;
    }
    tracing::info!(route = %first.route, shadow = %first.settings.name, replayed = done, "a re-drive of dead letters ended");
}
