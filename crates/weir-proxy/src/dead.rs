//! Dead letters: a replay that ran out of attempts (`attempts_max`) is appended,
//! whole, to its shadow's dead-letter queue `proxy:capture:ROUTE:dead:SHADOW`
//! (kept by its reader `dead`) before its capture is confirmed: it is never
//! dropped. An append that fails leaves the capture unconfirmed, to be replayed
//! again. The queue is made on the first dead letter (or re-drive), is a capture
//! queue as far as the rest of weir goes (reserved, no lease timeout, `weir capture
//! export` reads it) and is never deleted by the proxy.
//!
//! A re-drive (`redrive.rs`, `POST /proxy/dead-letters/ROUTE/SHADOW/redrive` on
//! weir's HTTP port) replays the dead letters there were when it began, oldest
//! first and one at a time, as new replays (attempts counted afresh; in sequential
//! mode to that shadow and the ones after it): each is confirmed once delivered, or
//! once dead-lettered again (then at the queue's end, not re-driven twice in one
//! run). A stop of the proxy leaves the one in flight in the queue.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;
use weir_backend::{Backend, Queue, Reader};

use crate::capture::Captured;
use crate::queues::dead_queue;

/// The reader that keeps a dead-letter queue's items until they are re-driven.
pub const DEAD_READER: &str = "dead";
/// The pause before a capture whose dead letter could not be stored is replayed
/// again.
const BURY_FAILED_PAUSE: Duration = Duration::from_secs(1);

/// A shadow's dead letters.
pub struct DeadLetters {
    backend: Arc<Backend>,
    /// The route and the shadow, for what the log says.
    route: String,
    shadow: String,
    name: String,
    opened: OnceCell<(Queue, Reader)>,
    redriving: AtomicBool,
}

impl DeadLetters {
    pub fn new(backend: Arc<Backend>, route: &str, shadow: &str) -> DeadLetters {
        DeadLetters {
            backend,
            route: route.to_string(),
            shadow: shadow.to_string(),
            name: dead_queue(route, shadow),
            opened: OnceCell::new(),
            redriving: AtomicBool::new(false),
        }
    }

    pub fn queue_name(&self) -> &str {
        &self.name
    }

    /// Stores a replay that ran out of attempts; false (after a pause) when that
    /// failed: the capture is then not to be confirmed.
    pub async fn bury(&self, c: &Captured, why: &str) -> bool {
        let stored = match self.opened().await {
            Ok((queue, _)) => queue
                .append(&c.encode(), weir_backend::AppendOptions::default())
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        };
        match stored {
            Ok(()) => {
                tracing::warn!(route = %self.route, shadow = %self.shadow, method = %c.method, uri = %c.uri, reason = why, queue = self.queue_name(), "a replay ran out of attempts: kept as a dead letter");
                true
            }
            Err(e) => {
                tracing::error!(route = %self.route, shadow = %self.shadow, error = %e, "could not store a dead letter: the replay is tried again later");
                tokio::time::sleep(BURY_FAILED_PAUSE).await;
                false
            }
        }
    }

    /// Starts a re-drive of these dead letters, unless one runs already: the reader
    /// to take them with, the sequence number the re-drive stops at (the queue's end
    /// now), and how many it will replay. [`DeadLetters::end_redrive`] says when it
    /// is over.
    pub async fn begin_redrive(&self) -> Result<(Reader, u64, u64), RedriveError> {
        if self.redriving.swap(true, Relaxed) {
            return Err(RedriveError::Running);
        }
        match self.redrive_bounds().await {
            Ok(bounds) => Ok(bounds),
            Err(e) => {
                self.end_redrive();
                Err(RedriveError::Backend(e))
            }
        }
    }

    /// A re-drive [`DeadLetters::begin_redrive`] started is over.
    pub fn end_redrive(&self) {
        let was_running = self.redriving.swap(false, Relaxed);
        assert!(was_running, "a re-drive ends once, after it began");
    }

    async fn redrive_bounds(&self) -> weir_backend::Result<(Reader, u64, u64)> {
        let (queue, reader) = self.opened().await?;
        let (_, end) = queue.bounds().await?;
        let stats = self.backend.stats(Some(vec![self.name.clone()])).await?;
        let count = stats
            .iter()
            .flat_map(|q| &q.readers)
            .find(|r| r.name == DEAD_READER)
            .map_or(0, |r| r.items);
        Ok((reader.clone(), end, count))
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
                // One reader per name asked (the backend's contract).
                let mut readers = readers;
                assert_eq!(readers.len(), 1, "the backend gave the reader asked for");
                Ok((queue, readers.swap_remove(0)))
            })
            .await
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

#[cfg(test)]
mod tests {
    use super::*;

    fn dead_letters(dir: &std::path::Path) -> DeadLetters {
        let engine = weir_backend::Embedded::open(dir).unwrap();
        DeadLetters::new(Arc::new(Backend::Embedded(engine)), "r", "s")
    }

    #[tokio::test]
    async fn one_redrive_at_a_time_and_it_ends_once() {
        let dir = tempfile::tempdir().unwrap();
        let dead = dead_letters(dir.path());
        let (_, _, count) = dead.begin_redrive().await.unwrap();
        assert_eq!(count, 0);
        assert!(matches!(
            dead.begin_redrive().await,
            Err(RedriveError::Running)
        ));
        dead.end_redrive();
        assert!(dead.begin_redrive().await.is_ok());
        dead.end_redrive();
    }

    #[tokio::test]
    #[should_panic(expected = "a re-drive ends once, after it began")]
    async fn a_redrive_that_ends_without_beginning_is_a_programmer_error() {
        let dir = tempfile::tempdir().unwrap();
        dead_letters(dir.path()).end_redrive();
    }
}
