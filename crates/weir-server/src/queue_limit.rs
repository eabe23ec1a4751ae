//! `max_queues`: the cap on how many queues clients can bring into being.
//!
//! Any `get`, `set` or `monitor` on a new name creates a queue (the engine creates on
//! first use): a directory, files, a mapped segment, descriptors. Without a cap one
//! client naming queues in a loop would exhaust descriptors, inodes or memory. The
//! engine has no such cap, so the server puts one in front of it here, asked only when
//! a connection's handle cache misses (`handles.rs`) and the queue does not exist yet:
//! requests on existing queues never pay for it, and keep working when the store holds
//! more queues than the cap (a cap lowered by `reload`, or queues made by `expire_to`).
//!
//! Counting the store's queues means listing them (every name allocated), so the count
//! is remembered, under a mutex every creation takes. It is a lower bound: only
//! `delete` removes queues, and says so ([`QueueLimit::note_deleted`]), which makes the
//! next creation count afresh; the engine may add queues on its own (`expire_to`), so
//! a creation that would reach the cap counts afresh too. A refusal at the cap therefore
//! costs one hash lookup and no listing, however often a client tries.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};

use weir::{Queue, Store};

/// The default of `max_queues`.
pub const QUEUES_MAX_DEFAULT: usize = 10_000;

/// The reply to [`OpenError::TooManyQueues`].
pub const REPLY_TOO_MANY_QUEUES: &[u8] = b"SERVER_ERROR too many queues\r\n";

/// Why a queue handle could not be had.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Engine(#[from] weir::Error),
    /// The queue does not exist and the store holds `max_queues` already.
    #[error("too many queues")]
    TooManyQueues,
}

struct Count {
    /// Queues in the store, at least (see the module docs).
    known: usize,
    /// A queue was deleted since `known` was counted: it may be too high.
    stale: bool,
}

pub struct QueueLimit {
    store: Store,
    max: AtomicUsize,
    count: Mutex<Count>,
}

impl QueueLimit {
    pub fn new(store: Store, max: usize) -> QueueLimit {
        assert!(max >= 1, "max_queues is checked by the config");
        let known = store.queue_names().len();
        QueueLimit {
            store,
            max: AtomicUsize::new(max),
            count: Mutex::new(Count {
                known,
                stale: false,
            }),
        }
    }

    /// A new cap (`reload`); queues over it are kept, only creation stops.
    pub fn set_max(&self, max: usize) {
        assert!(max >= 1, "max_queues is checked by the config");
        self.max.store(max, Relaxed);
    }

    /// The queue `name`, created on first use unless the store holds `max_queues`.
    pub fn queue(&self, name: &str) -> Result<Queue, OpenError> {
        if let Some(queue) = self.store.existing_queue(name)? {
            return Ok(queue);
        }
        // A panic while held leaves the count a valid lower bound: use it anyway.
        let mut count = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        // Another connection may have created it while this one waited for the lock.
        if let Some(queue) = self.store.existing_queue(name)? {
            return Ok(queue);
        }
        let max = self.max.load(Relaxed);
        if !count.stale && count.known >= max {
            return Err(OpenError::TooManyQueues);
        }
        if count.stale || count.known + 1 >= max {
            count.known = self.store.queue_names().len();
            count.stale = false;
            if count.known >= max {
                return Err(OpenError::TooManyQueues);
            }
        }
        // Created under the lock, so concurrent creators cannot overshoot the cap.
        let queue = self.store.queue(name)?;
        count.known += 1;
        Ok(queue)
    }

    /// A queue was (or may have been) deleted: the next creation counts afresh.
    pub fn note_deleted(&self) {
        self.count
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .stale = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creation_stops_at_the_cap_and_resumes_after_a_delete(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path())?;
        store.queue("old")?;
        let limit = QueueLimit::new(store.clone(), 3);
        limit.queue("a")?;
        limit.queue("b")?;
        assert!(matches!(limit.queue("c"), Err(OpenError::TooManyQueues)));
        // Existing queues keep working; bad names are still the engine's error.
        assert_eq!(limit.queue("a")?.name(), "a");
        assert_eq!(limit.queue("old")?.name(), "old");
        assert!(matches!(limit.queue("a/b"), Err(OpenError::Engine(_))));
        assert_eq!(store.queue_names(), ["a", "b", "old"]);
        store.delete_queue("b")?;
        limit.note_deleted();
        assert_eq!(limit.queue("c")?.name(), "c");
        assert!(matches!(limit.queue("d"), Err(OpenError::TooManyQueues)));
        // A queue the engine made behind the limit's back is counted before the last
        // creation, and a lowered cap keeps what exists.
        store.delete_queue("c")?;
        limit.note_deleted();
        store.queue("behind")?;
        assert!(matches!(limit.queue("d"), Err(OpenError::TooManyQueues)));
        limit.set_max(1);
        assert_eq!(limit.queue("old")?.name(), "old");
        assert!(matches!(limit.queue("d"), Err(OpenError::TooManyQueues)));
        limit.set_max(5);
        assert_eq!(limit.queue("d")?.name(), "d");
        Ok(())
    }
}
