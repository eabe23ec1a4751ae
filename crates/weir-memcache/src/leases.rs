//! The leases one connection holds: what `close`, `abort`, `confirm` act on, what
//! `open_reads_max` counts, and what goes back when the connection ends.
//!
//! Kestrel ties an open read to the connection that took it, so a client that dies
//! mid-work gives its items back. The engine knows leases only by id; this module
//! remembers, per queue/reader, which ids this connection holds, oldest first. It is
//! a short `Vec` (a connection touches few readers) searched linearly: cheaper than a
//! map at these sizes and no hashing on the hot path. Dropping it releases everything.

use crate::handles::same_name;
use std::collections::VecDeque;

use weir_backend::{Lease, Reader};

/// Most leases one connection may hold over all its readers: `open_reads_max` per
/// reader bounds `get`, and `monitor` is capped by this.
pub const LEASES_PER_CONNECTION_MAX: usize = 100_000;

/// [`Leases::push`] refused: the connection holds [`LEASES_PER_CONNECTION_MAX`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooManyLeases;

struct Held {
    reader: Reader,
    /// Oldest first.
    ids: VecDeque<Lease>,
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

    /// Remembers lease `id` on `reader`. At [`LEASES_PER_CONNECTION_MAX`] it refuses:
    /// the lease is released at once (the item goes back) and `Err(TooManyLeases)`
    /// is returned for the caller to answer. Callers check the room first, so this is
    /// a backstop: a client must never be able to panic a connection.
    pub fn push(&mut self, reader: &Reader, id: Lease) -> Result<(), TooManyLeases> {
        if self.count >= LEASES_PER_CONNECTION_MAX {
            if let Err(e) = reader.release(&id) {
                tracing::debug!(queue = reader.queue_name(), error = %e, "releasing a lease");
            }
            return Err(TooManyLeases);
        }
        match self.position(reader.queue_name(), reader.name()) {
            Some(i) => self.held[i].ids.push_back(id),
            None => self.held.push(Held {
                reader: reader.clone(),
                ids: VecDeque::from([id]),
            }),
        }
        self.count += 1;
        debug_assert!(self.count <= LEASES_PER_CONNECTION_MAX);
        Ok(())
    }

    /// The oldest lease on `queue`/`reader`, still held: a `close` forgets it only once
    /// the engine confirmed it (see [`Leases::remove`]), so a confirm that fails leaves
    /// it to be released when the connection ends.
    pub fn oldest(&self, queue: &str, reader: &str) -> Option<(Reader, Lease)> {
        let held = &self.held[self.position(queue, reader)?];
        let id = held.ids.front()?.clone();
        Some((held.reader.clone(), id))
    }

    /// Every lease held on `queue`/`reader`, oldest first, with its reader.
    pub fn all(&self, queue: &str, reader: &str) -> Option<(Reader, Vec<Lease>)> {
        let held = &self.held[self.position(queue, reader)?];
        Some((held.reader.clone(), held.ids.iter().cloned().collect()))
    }

    /// Forgets lease `id` on `queue`/`reader` (confirmed, or gone in the engine);
    /// false when it was not held.
    pub fn remove(&mut self, queue: &str, reader: &str, id: &Lease) -> bool {
        let Some(i) = self.position(queue, reader) else {
            return false;
        };
        let Some(at) = self.held[i].ids.iter().position(|held| held == id) else {
            return false;
        };
        self.held[i].ids.remove(at);
        self.count -= 1;
        if self.held[i].ids.is_empty() {
            self.held.swap_remove(i);
        }
        true
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
    for id in &held.ids {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_stays_held_until_removed() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = weir::Store::open(dir.path())?;
        let queue = store.queue("q")?;
        let engine_reader = queue.reader("r")?;
        let reader = Reader::Embedded(engine_reader.clone());
        let mut leases = Leases::default();
        let mut ids = Vec::new();
        for data in [b"a", b"b"] {
            queue.append(data, Default::default())?;
            let lease = engine_reader.take_leased()?.ok_or("an item")?;
            let id = Lease::Embedded(lease.id);
            leases.push(&reader, id.clone()).map_err(|_| "room")?;
            ids.push(id);
        }
        // Looking at the oldest forgets nothing.
        let (_, oldest) = leases.oldest("q", "r").ok_or("held")?;
        assert_eq!(oldest, ids[0]);
        assert_eq!((leases.count("q", "r"), leases.total()), (2, 2));
        assert!(leases.oldest("q", "").is_none());
        assert!(!leases.remove("q", "", &ids[0]));
        assert!(leases.remove("q", "r", &ids[0]));
        assert!(!leases.remove("q", "r", &ids[0]));
        assert_eq!(
            leases.oldest("q", "r").map(|(_, id)| id),
            Some(ids[1].clone())
        );
        assert!(leases.remove("q", "r", &ids[1]));
        assert_eq!((leases.count("q", "r"), leases.total()), (0, 0));
        assert!(leases.oldest("q", "r").is_none());
        Ok(())
    }
}
