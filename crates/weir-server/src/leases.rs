//! The leases one connection holds: what `close`, `abort`, `confirm` act on, what
//! `max_open_reads` counts, and what goes back when the connection ends.
//!
//! Kestrel ties an open read to the connection that took it, so a client that dies
//! mid-work gives its items back. The engine knows leases only by id; this module
//! remembers, per queue/reader, which ids this connection holds, oldest first. It is
//! a short `Vec` (a connection touches few readers) searched linearly: cheaper than a
//! map at these sizes and no hashing on the hot path. Dropping it releases everything.

use crate::handles::same_name;
use std::collections::VecDeque;

use weir::{LeaseId, Reader};

/// Most leases one connection may hold over all its readers: `max_open_reads` per
/// reader bounds `get`, and `monitor` is capped by this.
pub const LEASES_PER_CONNECTION_MAX: usize = 100_000;

struct Held {
    reader: Reader,
    /// Oldest first.
    ids: VecDeque<LeaseId>,
}

#[derive(Default)]
pub struct Leases {
    held: Vec<Held>,
    count: usize,
}

impl Leases {
    fn position(&self, queue: &str, reader: &str) -> Option<usize> {
        self.held.iter().position(|h| {
            same_name(h.reader.queue_name(), queue) && same_name(h.reader.name(), reader)
        })
    }

    /// Leases held on `queue`/`reader`.
    pub fn count(&self, queue: &str, reader: &str) -> usize {
        self.position(queue, reader)
            .map_or(0, |i| self.held[i].ids.len())
    }

    /// Leases held over all readers.
    pub fn total(&self) -> usize {
        self.count
    }

    pub fn push(&mut self, reader: &Reader, id: LeaseId) {
        assert!(
            self.count < LEASES_PER_CONNECTION_MAX,
            "lease bookkeeping over its limit"
        );
        match self.position(reader.queue_name(), reader.name()) {
            Some(i) => self.held[i].ids.push_back(id),
            None => self.held.push(Held {
                reader: reader.clone(),
                ids: VecDeque::from([id]),
            }),
        }
        self.count += 1;
    }

    /// Forgets and returns the oldest lease on `queue`/`reader`.
    pub fn pop_oldest(&mut self, queue: &str, reader: &str) -> Option<(Reader, LeaseId)> {
        let i = self.position(queue, reader)?;
        let id = self.held[i].ids.pop_front()?;
        self.count -= 1;
        let reader = if self.held[i].ids.is_empty() {
            self.held.swap_remove(i).reader
        } else {
            self.held[i].reader.clone()
        };
        Some((reader, id))
    }

    /// Releases every lease on `queue`/`reader`; returns how many.
    pub fn release(&mut self, queue: &str, reader: &str) -> usize {
        let Some(i) = self.position(queue, reader) else {
            return 0;
        };
        let held = self.held.swap_remove(i);
        self.count -= held.ids.len();
        release_all(&held);
        held.ids.len()
    }

    /// Forgets, without releasing, every lease on `queue` (any reader when `reader` is
    /// `None`): for a queue or reader that was deleted, whose leases went with it.
    pub fn forget(&mut self, queue: &str, reader: Option<&str>) {
        let count = &mut self.count;
        self.held.retain(|h| {
            let gone = same_name(h.reader.queue_name(), queue)
                && reader.is_none_or(|r| same_name(h.reader.name(), r));
            if gone {
                *count -= h.ids.len();
            }
            !gone
        });
    }

    /// Releases everything (the connection is ending).
    pub fn release_everything(&mut self) {
        for held in self.held.drain(..) {
            release_all(&held);
        }
        self.count = 0;
    }
}

fn release_all(held: &Held) {
    for &id in &held.ids {
        // NotFound (queue deleted) and Closed (store shut down) leave nothing to do:
        // an unreleased lease comes back on restart anyway.
        if let Err(e) = held.reader.release(id) {
            tracing::debug!(queue = held.reader.queue_name(), error = %e, "releasing a lease");
        }
    }
}

impl Drop for Leases {
    fn drop(&mut self) {
        self.release_everything();
    }
}
