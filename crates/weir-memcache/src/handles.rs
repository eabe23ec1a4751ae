//! A per-connection cache of `Queue` and `Reader` handles.
//!
//! `Store::queue` takes the store's map lock and `Queue::reader` the queue's; a
//! connection that alternates set and get on a few queues would pay both on every
//! request. The cache is a short `Vec` searched linearly and bounded by
//! [`HANDLES_CACHED_MAX`], evicting the oldest entry. Each entry keeps a hash of its
//! names next to the handle, so a search reads one contiguous array and follows a
//! handle's pointers (to the names inside the shared queue) only on a likely hit:
//! with thousands of connections those pointers are cold in the cache. Lookups lend
//! the handle rather than clone it: a clone is an atomic increment on a reference
//! count that every connection on every thread shares.
//!
//! A handle on a queue deleted meanwhile answers `NotFound`; the caller then calls
//! [`Handles::evict`] and asks again, which creates the queue afresh. A miss goes
//! to the [`Backend`], which creates what is missing without blocking the event loop
//! (within `queues_max`).
//!
//! A connection's reader handles are named after it (`memcache PEER_ADDR`,
//! [`Reader::with_holder`]), so a reader's pending leases (`Reader::pending`) say
//! which client holds each. The name is made once per connection, at its first
//! reader handle (a connection that only appends makes none), and shared by every
//! handle and lease: no allocation per take.

use std::net::SocketAddr;
use std::sync::Arc;

use weir_backend::{Backend, Queue, Reader};

/// Names compare length-first: the default reader's name is empty, and a zero-length
/// `memcmp` costs ~150 ns on some machines (glibc's AVX-512 path).
pub fn same_name(a: &str, b: &str) -> bool {
    a.len() == b.len() && (a.is_empty() || a.as_bytes() == b.as_bytes())
}

/// Queues (and, separately, readers) remembered per connection.
pub const HANDLES_CACHED_MAX: usize = 16;

#[derive(Default)]
pub struct Handles {
    queues: Vec<(u64, Queue)>,
    readers: Vec<(u64, Reader)>,
    /// The client's address, which names the leases its reader handles take.
    peer: Option<SocketAddr>,
    /// `memcache PEER`, made at the first reader handle.
    holder: Option<Arc<str>>,
}

/// FNV-1a over the names, with a separator so ("ab", "c") and ("a", "bc") differ.
/// A filter only: equal hashes are confirmed by comparing the names.
fn names_hash(queue: &str, reader: Option<&str>) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in queue.as_bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(PRIME);
    }
    if let Some(reader) = reader {
        h = (h ^ 0xff).wrapping_mul(PRIME);
        for &b in reader.as_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(PRIME);
        }
    }
    h
}

impl Handles {
    /// The cache of a connection from `peer`: its leases name it as their holder.
    pub fn held_by(peer: SocketAddr) -> Handles {
        Handles {
            peer: Some(peer),
            ..Handles::default()
        }
    }

    /// `handle` named after the connection's peer, when it has one.
    fn named(&mut self, handle: Reader) -> Reader {
        let Some(peer) = self.peer else {
            return handle;
        };
        let holder = self
            .holder
            .get_or_insert_with(|| Arc::from(format!("memcache {peer}")));
        handle.with_holder(Arc::clone(holder))
    }

    /// The queue `name`, created on first use (within `queues_max`).
    pub async fn queue(&mut self, backend: &Backend, name: &str) -> weir_backend::Result<&Queue> {
        let hash = names_hash(name, None);
        let found = self
            .queues
            .iter()
            .position(|(h, q)| *h == hash && same_name(q.name(), name));
        let index = match found {
            Some(i) => i,
            None => {
                let queue = backend.queue(name).await?;
                if self.queues.len() == HANDLES_CACHED_MAX {
                    self.queues.remove(0);
                }
                self.queues.push((hash, queue));
                self.queues.len() - 1
            }
        };
        Ok(&self.queues[index].1)
    }

    /// The reader `reader` of queue `queue`, both created on first use.
    pub async fn reader(
        &mut self,
        backend: &Backend,
        queue: &str,
        reader: &str,
    ) -> weir_backend::Result<&Reader> {
        let hash = names_hash(queue, Some(reader));
        let found = self.readers.iter().position(|(h, r)| {
            *h == hash && same_name(r.queue_name(), queue) && same_name(r.name(), reader)
        });
        let index = match found {
            Some(i) => i,
            None => {
                let q = self.queue(backend, queue).await?.clone();
                let handle = backend.reader(&q, reader).await?;
                let handle = self.named(handle);
                if self.readers.len() == HANDLES_CACHED_MAX {
                    self.readers.remove(0);
                }
                self.readers.push((hash, handle));
                self.readers.len() - 1
            }
        };
        Ok(&self.readers[index].1)
    }

    /// The reader a look without a wait takes from (see
    /// `weir_backend::Backend::reader_to_look`): `None` when the backend has nothing to
    /// take because the queue does not exist (JetStream does not create a queue for a
    /// `get`). Cached as [`Handles::reader`] caches.
    pub async fn reader_to_look(
        &mut self,
        backend: &Backend,
        queue: &str,
        reader: &str,
    ) -> weir_backend::Result<Option<&Reader>> {
        let hash = names_hash(queue, Some(reader));
        let found = self.readers.iter().position(|(h, r)| {
            *h == hash && same_name(r.queue_name(), queue) && same_name(r.name(), reader)
        });
        let index = match found {
            Some(i) => i,
            None => {
                let Some(handle) = backend.reader_to_look(queue, reader).await? else {
                    return Ok(None);
                };
                let handle = self.named(handle);
                if self.readers.len() == HANDLES_CACHED_MAX {
                    self.readers.remove(0);
                }
                self.readers.push((hash, handle));
                self.readers.len() - 1
            }
        };
        Ok(Some(&self.readers[index].1))
    }

    /// Forgets every handle on `queue`.
    pub fn evict(&mut self, queue: &str) {
        self.queues.retain(|(_, q)| q.name() != queue);
        self.readers.retain(|(_, r)| r.queue_name() != queue);
    }

    /// Forgets the handle on one reader.
    pub fn evict_reader(&mut self, queue: &str, reader: &str) {
        self.readers
            .retain(|(_, r)| !(same_name(r.queue_name(), queue) && same_name(r.name(), reader)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir::Store;

    #[test]
    fn hash_separates_queue_from_reader() {
        assert_ne!(names_hash("ab", Some("c")), names_hash("a", Some("bc")));
        assert_ne!(names_hash("q", Some("")), names_hash("q", None));
        assert_eq!(names_hash("q", Some("r")), names_hash("q", Some("r")));
    }

    #[tokio::test]
    async fn cache_hits_evicts_and_recreates() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path())?;
        let queues = Backend::Embedded(weir_backend::Embedded::new(store.clone()));
        let mut handles = Handles::default();
        handles
            .queue(&queues, "a")
            .await?
            .append(b"1", Default::default())
            .await?;
        // Same names, same handle: the reader sees the append made through the cache.
        let taken = handles
            .reader(&queues, "a", "")
            .await?
            .take(weir_backend::TakeMode::Take, std::time::Duration::ZERO)
            .await?;
        assert_eq!(taken.map(|t| t.item.data.to_vec()), Some(b"1".to_vec()));
        // More queues than the cache holds: the oldest is evicted and comes back.
        for i in 0..HANDLES_CACHED_MAX + 2 {
            let name = format!("q{i}");
            assert_eq!(handles.queue(&queues, &name).await?.name(), name);
        }
        assert!(handles.queues.len() <= HANDLES_CACHED_MAX);
        assert_eq!(handles.queue(&queues, "a").await?.name(), "a");
        // A deleted queue: evict, and the next lookup creates it afresh.
        store.delete_queue("a")?;
        handles.evict("a");
        assert!(handles.readers.is_empty());
        assert_eq!(handles.reader(&queues, "a", "r").await?.name(), "r");
        assert_eq!(handles.reader(&queues, "a", "r").await?.queue_name(), "a");
        Ok(())
    }

    /// A connection's reader handles, taken fresh or to look, name their leases after
    /// its peer; a cache with no peer leaves them unnamed.
    #[tokio::test]
    async fn leases_name_the_connection() -> Result<(), Box<dyn std::error::Error>> {
        use weir_backend::TakeMode;
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path())?;
        let queues = Backend::Embedded(weir_backend::Embedded::new(store));
        let peer: SocketAddr = "10.0.0.7:51234".parse()?;
        let mut handles = Handles::held_by(peer);
        let q = handles.queue(&queues, "a").await?.clone();
        q.append_batch(&[b"1", b"2", b"3"], Default::default())
            .await?;
        let wait = std::time::Duration::ZERO;
        let r = handles.reader(&queues, "a", "").await?;
        r.take(TakeMode::Lease, wait).await?.ok_or("an item")?;
        let look = handles.reader_to_look(&queues, "a", "x").await?;
        let look = look.ok_or("a reader to look")?;
        look.take(TakeMode::Lease, wait).await?.ok_or("an item")?;
        let mut unnamed = Handles::default();
        let plain = unnamed.reader(&queues, "a", "").await?;
        plain.take(TakeMode::Lease, wait).await?.ok_or("an item")?;
        let holders = |listed: Vec<weir_backend::PendingLease>| {
            listed
                .into_iter()
                .map(|p| p.holder.map(|h| h.to_string()))
                .collect::<Vec<_>>()
        };
        let named = Some("memcache 10.0.0.7:51234".to_string());
        assert_eq!(holders(plain.pending(10).await?), vec![named.clone(), None]);
        let look = handles.reader_to_look(&queues, "a", "x").await?;
        let look = look.ok_or("a reader to look")?;
        assert_eq!(holders(look.pending(10).await?), vec![named]);
        Ok(())
    }
}
