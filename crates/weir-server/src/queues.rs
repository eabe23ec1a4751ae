//! Where connections get the queues and readers they have not cached: without
//! blocking an event loop.
//!
//! A queue (or reader) that exists is a map lookup, done in place. One that does not
//! is created, which is file work (a directory, a journal, a first segment, the reader
//! list): that runs on tokio's blocking pool, never on the event loop, so a client
//! naming new queues as fast as it can does not stall the other connections of its
//! loop. At most [`CREATIONS_AT_ONCE`] creations run at a time, server-wide, so such a
//! client cannot take the blocking pool (and the disk) from everyone else either; a
//! request creates its queues one after another, each waiting its turn.
//!
//! The cap on the number of queues (`max_queues`) is the engine's
//! (`StoreOptions::queues_max`), checked under the store's map lock, so it is exact
//! however many connections create at once; a creation past it gets
//! `ErrorKind::TooManyQueues`.

use tokio::sync::Semaphore;
use weir::{Queue, Reader, Store};

/// Queue and reader creations running at once, server-wide: enough to overlap a
/// few file systems' latencies, few enough that creation storms leave the blocking
/// pool to fsync waits.
pub const CREATIONS_AT_ONCE: usize = 4;

pub struct QueueOpener {
    store: Store,
    creations: Semaphore,
}

impl QueueOpener {
    pub fn new(store: Store) -> QueueOpener {
        QueueOpener {
            store,
            creations: Semaphore::new(CREATIONS_AT_ONCE),
        }
    }

    /// The queue `name`, created on first use.
    pub async fn queue(&self, name: &str) -> weir::Result<Queue> {
        if let Some(queue) = self.store.existing_queue(name)? {
            return Ok(queue);
        }
        let store = self.store.clone();
        let name = name.to_owned();
        self.off_loop(move || store.queue(&name)).await
    }

    /// The reader `name` of `queue`, created on first use.
    pub async fn reader(&self, queue: &Queue, name: &str) -> weir::Result<Reader> {
        if queue.has_reader(name) {
            return queue.reader(name);
        }
        let queue = queue.clone();
        let name = name.to_owned();
        self.off_loop(move || queue.reader(&name)).await
    }

    /// Runs a creation on the blocking pool, within [`CREATIONS_AT_ONCE`].
    async fn off_loop<T: Send + 'static>(
        &self,
        create: impl FnOnce() -> weir::Result<T> + Send + 'static,
    ) -> weir::Result<T> {
        // The semaphore is never closed, so acquiring cannot fail; if it did, running
        // without the bound is still correct.
        let _permit = self.creations.acquire().await.ok();
        match tokio::task::spawn_blocking(create).await {
            Ok(result) => result,
            Err(e) => Err(weir::Error::from_io(
                "creating a queue",
                std::io::Error::other(e.to_string()),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn creates_on_first_use_within_the_cap() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Store::open_with(
            dir.path(),
            weir::StoreOptions {
                queues_max: 2,
                ..weir::StoreOptions::default()
            },
        )?;
        let opener = QueueOpener::new(store.clone());
        let a = opener.queue("a").await?;
        assert_eq!(opener.queue("a").await?.name(), "a");
        let r = opener.reader(&a, "fan").await?;
        assert_eq!((r.queue_name(), r.name()), ("a", "fan"));
        assert_eq!(opener.reader(&a, "fan").await?.name(), "fan");
        opener.queue("b").await?;
        let e = opener.queue("c").await.err().ok_or("a third queue")?;
        assert_eq!(e.kind(), weir::ErrorKind::TooManyQueues);
        assert!(opener.queue("bad/name").await.is_err());
        assert_eq!(store.queue_names(), ["a", "b"]);
        Ok(())
    }
}
