//! Which queues this instance is to sweep next, and how far it last purged each
//! (`sweep.rs` does the sweeping). A leaf of its own: the handles mark queues on it,
//! and the backend's shared state holds it.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The queues to sweep, and how far each was purged by this instance.
#[derive(Default)]
pub(crate) struct Sweeper {
    marked: Mutex<HashSet<String>>,
    /// The bound of this instance's last purge of each queue; cleared whole when it
    /// holds more queues than the stream may have readers (`consumers_max`).
    pub(super) purged: Mutex<HashMap<String, u64>>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Sweeper {
    /// A reader of `queue` confirmed, released or went: sweep it next time.
    pub fn mark(&self, queue: &str) {
        let mut marked = lock(&self.marked);
        if !marked.contains(queue) {
            marked.insert(queue.to_owned());
        }
    }

    /// The stream is gone: a new one starts its sequences again.
    pub fn forget_purges(&self) {
        lock(&self.purged).clear();
    }

    pub(super) fn take_marked(&self) -> HashSet<String> {
        std::mem::take(&mut *lock(&self.marked))
    }

    pub(super) fn mark_all(&self, queues: impl IntoIterator<Item = String>) {
        lock(&self.marked).extend(queues);
    }
}
