//! A per-connection cache of `Queue` and `Reader` handles.
//!
//! `Store::queue` takes the store's map lock and `Queue::reader` the queue's; a
//! connection that alternates set and get on a few queues would pay both on every
//! request. The cache is a short `Vec` searched linearly (names compare in a few
//! nanoseconds; no hashing, no lock) and bounded by [`HANDLES_CACHED_MAX`], evicting the
//! oldest entry. A handle on a queue deleted meanwhile answers `NotFound`; the caller
//! then calls [`Handles::evict`] and asks again, which creates the queue afresh.

use weir::{Queue, Reader, Store};

/// Names compare length-first (`weir::names_equal`): the default reader's name is
/// empty, and a zero-length `memcmp` costs ~150 ns on some machines.
pub use weir::names_equal as same_name;

/// Queues (and, separately, readers) remembered per connection.
pub const HANDLES_CACHED_MAX: usize = 16;

#[derive(Default)]
pub struct Handles {
    queues: Vec<Queue>,
    readers: Vec<Reader>,
}

impl Handles {
    /// The queue `name`, created on first use.
    pub fn queue(&mut self, store: &Store, name: &str) -> weir::Result<Queue> {
        if let Some(q) = self.queues.iter().find(|q| same_name(q.name(), name)) {
            return Ok(q.clone());
        }
        let queue = store.queue(name)?;
        if self.queues.len() == HANDLES_CACHED_MAX {
            self.queues.remove(0);
        }
        self.queues.push(queue.clone());
        Ok(queue)
    }

    /// The reader `reader` of queue `queue`, both created on first use.
    pub fn reader(&mut self, store: &Store, queue: &str, reader: &str) -> weir::Result<Reader> {
        if let Some(r) = self
            .readers
            .iter()
            .find(|r| same_name(r.queue_name(), queue) && same_name(r.name(), reader))
        {
            return Ok(r.clone());
        }
        let handle = self.queue(store, queue)?.reader(reader)?;
        if self.readers.len() == HANDLES_CACHED_MAX {
            self.readers.remove(0);
        }
        self.readers.push(handle.clone());
        Ok(handle)
    }

    /// Forgets every handle on `queue`.
    pub fn evict(&mut self, queue: &str) {
        self.queues.retain(|q| q.name() != queue);
        self.readers.retain(|r| r.queue_name() != queue);
    }

    /// Forgets the handle on one reader.
    pub fn evict_reader(&mut self, queue: &str, reader: &str) {
        self.readers
            .retain(|r| !(same_name(r.queue_name(), queue) && same_name(r.name(), reader)));
    }
}
