//! Where weir's front doors keep their queues: one interface, two homes.
//!
//! A front door (the memcache server, the event bus, the proxy's shadows, recordings,
//! dead letters, and capture export and import) names queues and readers,
//! appends, takes, leases, confirms and releases, walks what a queue keeps
//! ([`Scan`]), and runs the whole-store commands, all through [`Backend`], [`Queue`]
//! and [`Reader`], and only through them: what a front door needs besides (queue
//! options, forgetting readers, a scratch directory) is an operation here too
//! (`door_upkeep.rs`), never the engine's own store. One place still opens the
//! engine's store itself: the composition root (`weir-server`), which opens the
//! store this crate's [`Embedded`] runs on. The proxy's offline tools (`weir capture
//! export/import --data-dir`, `weir replay --data-dir`) open a stopped weir's data
//! directory with [`Embedded::open`] and go through this interface too
//! (`docs/architecture.md`).
//!
//! [`Backend`], [`Queue`], [`Reader`], [`Lease`] and [`Scan`] are each an enum over
//! the two implementations:
//!
//! - [`Embedded`]: the weir engine in this process, the default. Its arms call the
//!   engine's own futures in place: no allocation, no virtual call, and a future the
//!   size of the engine's (each method is one `match` the branch predictor learns).
//! - `jetstream::JetStream` (cargo feature `jetstream`): a NATS JetStream cluster, so
//!   that several stateless weir instances (processes) share the queues. Its arms
//!   box their futures, so the engine's path does not carry the network client's
//!   (much larger) state machines: one allocation per request, against a network
//!   round trip.
//!
//! A handle of one implementation given to the other (a JetStream [`Reader`] with an
//! embedded [`Lease`]) is a bug in the caller, never something a client can cause:
//! it panics rather than answer an error a front door would pass on as the client's.
//!
//! An enum rather than a trait object or a generic front door: `dyn` needs boxed
//! futures on every call (the embedded path included), and a front door generic over
//! a trait doubles its compiled code and threads a type parameter through every
//! command for no measured gain (see `docs/architecture.md`, "Backends").
//!
//! # The cargo feature `jetstream`
//!
//! Off by default: a library user gets the embedded engine alone, without the NATS
//! client (`async-nats` and its few dozen crates) and what only it needs (`base64`,
//! `futures-util`, `serde_json`, `time`), unless it asks for
//! `features = ["jetstream"]`. The feature adds the `jetstream` module and a
//! `JetStream` variant to each of those enums; without it each has its `Embedded`
//! variant alone and every method behaves as on the engine. [`JetStreamConfig`]
//! stays in either build, so that a front door reads a config file naming a cluster
//! and refuses it plainly ([`NO_JETSTREAM`]). [`SharedMap`] is in either build:
//! without the feature it has its data-directory variant alone. The `weir` binary
//! turns the feature on by default (`weir-server`'s own feature `jetstream`);
//! `cluster-tests` implies it.

#![forbid(unsafe_code)]

mod door_upkeep;
pub mod embedded;
mod error;
pub mod exposition;
#[cfg(feature = "jetstream")]
pub mod jetstream;
mod jetstream_config;
pub mod jobs;
pub mod listen;
mod local_map;
mod map_entry;
mod position;
mod readers_named;
mod redrive;
mod shared_map;
mod taken;

use std::sync::Arc;
use std::time::Duration;

pub use door_upkeep::{ForgottenReaders, LeaseTimeout, QueueOptions};
pub use embedded::Embedded;
pub use error::{Error, Kind, Result};
pub use jetstream_config::{JetStreamConfig, INSTANCES_STREAM_BYTES_MIN, REPLICAS_MAX};
pub use local_map::LocalMap;
pub use position::{ScanFrom, SeekTo};
use readers_named::check_readers_named;
pub use shared_map::{
    Entry as MapEntry, Expect, SharedMap, KEY_BYTES_MAX as MAP_KEY_BYTES_MAX,
    VALUE_BYTES_MAX as MAP_VALUE_BYTES_MAX,
};
pub use taken::{Lease, Taken};
pub use weir::StoreOptions;
pub use weir_types::{
    expiry_ms, is_reserved, now_ms, validate_queue_name, validate_reader_name, AppendOptions,
    ConfigError, InvalidName, Item, LeaseId, PendingLease, QueueStats, ReaderStats, TakeMode,
    BUS_DEAD_PREFIX, BUS_PREFIX, BUS_TOPIC_PREFIX, CREATIONS_AT_ONCE, NAME_LENGTH_MAX, NEVER,
    PENDING_LIST_MAX, PROXY_CAPTURE_PREFIX, READERS_PER_QUEUE_MAX, REDRIVE_PER_CALL_MAX,
};

/// Where the queues live.
pub enum Backend {
    Embedded(Embedded),
    #[cfg(feature = "jetstream")]
    JetStream(jetstream::JetStream),
}

/// A handle on one queue: cheap to clone, cached by connections.
#[derive(Clone)]
pub enum Queue {
    Embedded(weir::Queue),
    #[cfg(feature = "jetstream")]
    JetStream(jetstream::Queue),
}

/// A handle on one reader of a queue: cheap to clone, cached by connections.
#[derive(Clone)]
pub enum Reader {
    Embedded(weir::Reader),
    #[cfg(feature = "jetstream")]
    JetStream(jetstream::Reader),
}

/// A walk over the items a queue keeps (some reader has not confirmed them), in
/// order, without consuming or leasing anything: [`Backend::scan`].
pub enum Scan {
    Embedded(embedded::EmbeddedScan),
    #[cfg(feature = "jetstream")]
    JetStream(jetstream::Scan),
}

impl Scan {
    /// Up to `max` more items; empty once the walk has ended. Items appended after
    /// the walk began are not included; expired ones are left out.
    pub async fn next_page(&mut self, max: usize) -> Result<Vec<Item>> {
        match self {
            Scan::Embedded(s) => s.next_page(max).await,
            #[cfg(feature = "jetstream")]
            Scan::JetStream(s) => Box::pin(s.next_page(max)).await,
        }
    }
}

impl Backend {
    /// "embedded" or "jetstream", for `stats settings` and logs.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Backend::Embedded(_) => "embedded",
            #[cfg(feature = "jetstream")]
            Backend::JetStream(_) => "jetstream",
        }
    }

    /// The engine's store when the queues are in this process, for tests that look
    /// at what a door left in it. Doors never use it: they reach storage through
    /// this interface only (see `docs/architecture.md`, "Backends").
    #[doc(hidden)]
    pub fn engine_store_for_tests(&self) -> Option<&weir::Store> {
        match self {
            Backend::Embedded(e) => Some(e.store()),
            #[cfg(feature = "jetstream")]
            Backend::JetStream(_) => None,
        }
    }

    /// A small map kept with the queues, for a front door's own metadata and for
    /// choosing one door among several (compare-and-set writes): a file of the data
    /// directory on the embedded engine (this process's alone), the cluster's on
    /// JetStream (shared by every door). See [`SharedMap`].
    pub async fn shared_map(&self, name: &str) -> Result<SharedMap> {
        match self {
            Backend::Embedded(e) => e.shared_map(name).await.map(SharedMap::Local),
            #[cfg(feature = "jetstream")]
            Backend::JetStream(j) => j
                .shared_map(name)
                .await
                .map(|m| SharedMap::Cluster(Box::new(m))),
        }
    }

    /// The map `name` when this process is its only writer (the embedded engine, in
    /// its locked data directory): opened at once, nothing to wait for. `None` on
    /// JetStream, whose maps are the cluster's ([`Backend::shared_map`]), reached
    /// over the network and written by every door.
    pub async fn local_map(&self, name: &str) -> Result<Option<SharedMap>> {
        match self {
            Backend::Embedded(e) => e.shared_map(name).await.map(|m| Some(SharedMap::Local(m))),
            #[cfg(feature = "jetstream")]
            Backend::JetStream(_) => Ok(None),
        }
    }

    /// The queue if it exists; never creates, never waits on I/O.
    pub fn existing_queue(&self, name: &str) -> Result<Option<Queue>> {
        match self {
            Backend::Embedded(e) => Ok(e.existing_queue(name)?.map(Queue::Embedded)),
            #[cfg(feature = "jetstream")]
            Backend::JetStream(j) => Ok(j.existing_queue(name)?.map(Queue::JetStream)),
        }
    }

    /// The queue `name`, created on first use (within `max_queues`).
    pub async fn queue(&self, name: &str) -> Result<Queue> {
        match self {
            Backend::Embedded(e) => Ok(Queue::Embedded(e.queue(name).await?)),
            #[cfg(feature = "jetstream")]
            Backend::JetStream(j) => Ok(Queue::JetStream(Box::pin(j.queue(name)).await?)),
        }
    }

    /// The reader `name` of `queue`, created on first use.
    pub async fn reader(&self, queue: &Queue, name: &str) -> Result<Reader> {
        match (self, queue) {
            (Backend::Embedded(e), Queue::Embedded(q)) => {
                Ok(Reader::Embedded(e.reader(q, name).await?))
            }
            #[cfg(feature = "jetstream")]
            (Backend::JetStream(j), Queue::JetStream(q)) => {
                Ok(Reader::JetStream(Box::pin(j.reader(q, name)).await?))
            }
            #[cfg(feature = "jetstream")]
            _ => mismatch(),
        }
    }

    /// A queue whose items are kept for `readers` only, with a handle on each (in
    /// their order): for a front door that names every reader of a queue itself, as
    /// the proxy does for its shadows. It has no default reader: the memcache door's
    /// queues get one on JetStream (a `q~` consumer, made with the queue), which
    /// would keep every item forever here since nobody reads it. On JetStream the
    /// queue exists while one of its readers does, and an item appended while none
    /// does is not stored: name every reader before the first append. `readers`
    /// must not be empty nor name the default reader (`""`). A reader made here
    /// starts at the queue's oldest item, or with `new_at_end` after its newest one
    /// (a shadow added to a route that records must not replay the recording). Two
    /// callers making the same reader at once get one reader: one makes it, the other
    /// finds it made and leaves it where it stands (nothing appended between is
    /// skipped).
    pub async fn queue_for_readers(
        &self,
        name: &str,
        readers: &[&str],
        new_at_end: bool,
    ) -> Result<(Queue, Vec<Reader>)> {
        match self {
            Backend::Embedded(e) => {
                check_readers_named(readers)?;
                let queue = e.queue(name).await?;
                let mut handles = Vec::with_capacity(readers.len());
                for r in readers {
                    let reader = if new_at_end && !queue.has_reader(r) {
                        e.reader_at_end(&queue, r).await?
                    } else {
                        e.reader(&queue, r).await?
                    };
                    handles.push(Reader::Embedded(reader));
                }
                Ok((Queue::Embedded(queue), handles))
            }
            #[cfg(feature = "jetstream")]
            Backend::JetStream(j) => {
                let (queue, handles) =
                    Box::pin(j.queue_for_readers(name, readers, new_at_end)).await?;
                Ok((
                    Queue::JetStream(queue),
                    handles.into_iter().map(Reader::JetStream).collect(),
                ))
            }
        }
    }

    /// The reader a look without a wait (`get q`, `q/open`, `q/peek`) takes from;
    /// `None` when there is nothing to take because the queue does not exist. The
    /// embedded engine creates the queue and reader (Kestrel does); JetStream creates
    /// named readers (a fan-out reader exists from its first `get q+r`) but not a
    /// queue for a `get` of its default reader: a consumer is a replicated Raft group,
    /// and a `get` of a name nobody writes to must not leave one behind.
    pub async fn reader_to_look(&self, queue: &str, reader: &str) -> Result<Option<Reader>> {
        match self {
            Backend::Embedded(e) => {
                let q = e.queue(queue).await?;
                Ok(Some(Reader::Embedded(e.reader(&q, reader).await?)))
            }
            #[cfg(feature = "jetstream")]
            Backend::JetStream(j) if reader.is_empty() => {
                Ok(Box::pin(j.existing_default_reader(queue))
                    .await?
                    .map(Reader::JetStream))
            }
            #[cfg(feature = "jetstream")]
            Backend::JetStream(j) => {
                let q = Box::pin(j.queue(queue)).await?;
                Ok(Some(Reader::JetStream(
                    Box::pin(j.reader(&q, reader)).await?,
                )))
            }
        }
    }

    /// `delete q`: the queue, its items and readers; false when it did not exist.
    pub async fn delete_queue(&self, queue: &str) -> Result<bool> {
        match self {
            Backend::Embedded(e) => e.delete_queue(queue).await,
            #[cfg(feature = "jetstream")]
            Backend::JetStream(j) => Box::pin(j.delete_queue(queue)).await,
        }
    }

    /// `delete q.r`: one reader, its position and leases.
    pub async fn delete_reader(&self, queue: &str, reader: &str) -> Result<bool> {
        match self {
            Backend::Embedded(e) => e.delete_reader(queue, reader).await,
            #[cfg(feature = "jetstream")]
            Backend::JetStream(j) => Box::pin(j.delete_reader(queue, reader)).await,
        }
    }

    /// `flush q` (reader `None`: for every reader) or `flush q.r`; never creates.
    pub async fn flush(&self, queue: &str, reader: Option<&str>) -> Result<u64> {
        match self {
            Backend::Embedded(e) => e.flush(queue, reader).await,
            #[cfg(feature = "jetstream")]
            Backend::JetStream(j) => Box::pin(j.flush(queue, reader)).await,
        }
    }

    /// `flush_all`: every item of every queue but those `keep` names; queues and
    /// readers stay.
    pub async fn flush_all(&self, keep: fn(&str) -> bool) -> Result<()> {
        match self {
            Backend::Embedded(e) => e.flush_all(keep).await,
            #[cfg(feature = "jetstream")]
            Backend::JetStream(j) => Box::pin(j.flush_all(keep)).await,
        }
    }

    /// `flush_expired q` / `flush_all_expired` (`None`): how many were dropped or moved.
    pub async fn expire(&self, queue: Option<&str>) -> Result<u64> {
        match self {
            Backend::Embedded(e) => e.expire(queue).await,
            #[cfg(feature = "jetstream")]
            Backend::JetStream(j) => Box::pin(j.expire(queue)).await,
        }
    }

    /// The named queues' stats (every queue's when `None`); names that are not
    /// queues are left out.
    pub async fn stats(&self, names: Option<Vec<String>>) -> Result<Vec<QueueStats>> {
        match self {
            Backend::Embedded(e) => e.stats(names).await,
            #[cfg(feature = "jetstream")]
            Backend::JetStream(j) => Box::pin(j.stats(names)).await,
        }
    }

    /// Starts a walk over what `queue` keeps, without consuming anything (capture
    /// exports). On the engine a queue that does not exist is [`Kind::NotFound`]; on
    /// JetStream it gives an empty walk (a subject with no message is all there is
    /// to see), and the walk costs a round trip per item (see `jetstream::scan`).
    pub async fn scan(&self, queue: &str, from: ScanFrom) -> Result<Scan> {
        match self {
            Backend::Embedded(e) => Ok(Scan::Embedded(e.scan(queue, from).await?)),
            #[cfg(feature = "jetstream")]
            Backend::JetStream(j) => Ok(Scan::JetStream(Box::pin(j.scan(queue, from)).await?)),
        }
    }

    /// `reload`: the config file's queue settings.
    pub async fn set_options(&self, options: StoreOptions) -> Result<()> {
        match self {
            Backend::Embedded(e) => e.set_options(options).await,
            #[cfg(feature = "jetstream")]
            Backend::JetStream(j) => j.set_options(options),
        }
    }

    /// Unix milliseconds, as the backend counts expiry.
    pub fn now_ms(&self) -> u64 {
        match self {
            Backend::Embedded(e) => e.store().clock().now_ms(),
            #[cfg(feature = "jetstream")]
            Backend::JetStream(_) => weir_types::now_ms(),
        }
    }

    /// The most queues it creates (`usize::MAX`: no limit).
    pub fn queues_max(&self) -> usize {
        match self {
            Backend::Embedded(e) => e.store().queues_max(),
            #[cfg(feature = "jetstream")]
            Backend::JetStream(j) => j.queues_max(),
        }
    }

    /// The backend's own `stats settings` lines (embedded: none; the door prints the
    /// data directory itself).
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        match self {
            Backend::Embedded(_) => Vec::new(),
            #[cfg(feature = "jetstream")]
            Backend::JetStream(j) => j.settings(),
        }
    }

    /// Whether requests can be served now: always on the engine; on JetStream, while
    /// connected to the cluster with the stream set up (`/health` and
    /// `weir_backend_up` say so).
    pub fn is_up(&self) -> bool {
        match self {
            Backend::Embedded(_) => true,
            #[cfg(feature = "jetstream")]
            Backend::JetStream(j) => j.is_up(),
        }
    }

    /// Encodes the backend's own `/metrics` series (embedded: none).
    #[cfg_attr(not(feature = "jetstream"), allow(unused_variables))]
    pub fn encode_metrics(&self, enc: &mut exposition::DescriptorEncoder<'_>) -> std::fmt::Result {
        match self {
            Backend::Embedded(_) => Ok(()),
            #[cfg(feature = "jetstream")]
            Backend::JetStream(j) => j.encode_metrics(enc),
        }
    }

    /// A graceful shutdown has begun: what a closing connection gives back is not
    /// handed to another connection of this process (see
    /// `weir::Store::begin_shutdown`).
    pub fn begin_shutdown(&self) {
        match self {
            Backend::Embedded(e) => e.store().begin_shutdown(),
            #[cfg(feature = "jetstream")]
            Backend::JetStream(j) => j.begin_shutdown(),
        }
    }

    pub async fn close(&self) -> Result<()> {
        match self {
            Backend::Embedded(e) => e.close().await,
            #[cfg(feature = "jetstream")]
            Backend::JetStream(j) => Box::pin(j.close()).await,
        }
    }
}

impl Queue {
    #[inline]
    pub fn name(&self) -> &str {
        match self {
            Queue::Embedded(q) => q.name(),
            #[cfg(feature = "jetstream")]
            Queue::JetStream(q) => q.name(),
        }
    }

    /// Appends one item; returns its sequence number. `data` is borrowed from the
    /// caller's buffer and copied before anything waits.
    #[inline]
    pub async fn append(&self, data: &[u8], options: AppendOptions) -> Result<u64> {
        match self {
            Queue::Embedded(q) => Ok(q.append_async(data, options).await?),
            #[cfg(feature = "jetstream")]
            Queue::JetStream(q) => {
                Box::pin(q.append(bytes::Bytes::copy_from_slice(data), options)).await
            }
        }
    }

    /// Appends several items in order; returns the first one's sequence number. On
    /// the engine all or none, under one fsync; on JetStream one publish each, so a
    /// failure part-way leaves the first ones stored (the error says so). An empty
    /// batch is [`Kind::InvalidArgument`] on both.
    pub async fn append_batch(&self, items: &[&[u8]], options: AppendOptions) -> Result<u64> {
        match self {
            Queue::Embedded(q) => embedded::append_batch(q, items, options).await,
            #[cfg(feature = "jetstream")]
            Queue::JetStream(q) => Box::pin(q.append_batch(items, options)).await,
        }
    }

    /// `(oldest, next)`: the sequence number of the oldest item kept (`next` when
    /// none is) and a bound the next append's is at or above (on the engine exactly
    /// the next append's; on JetStream one past the newest item of every queue,
    /// which share one sequence). What [`Queue::seek_reader`] may reach.
    pub async fn bounds(&self) -> Result<(u64, u64)> {
        match self {
            Queue::Embedded(q) => embedded::bounds(q).await,
            #[cfg(feature = "jetstream")]
            Queue::JetStream(q) => Box::pin(q.bounds()).await,
        }
    }

    /// The sequence number of the first item appended at `ms` (Unix ms) or later,
    /// within [`Queue::bounds`]: `next` when every kept item is older.
    pub async fn seq_at_time(&self, ms: u64) -> Result<u64> {
        match self {
            Queue::Embedded(q) => embedded::seq_at_time(q, ms).await,
            #[cfg(feature = "jetstream")]
            Queue::JetStream(q) => Box::pin(q.seq_at_time(ms)).await,
        }
    }

    /// Whether the reader exists; never creates it (a reader made by a take starts
    /// at the oldest item, which a caller that manages its readers must not get).
    pub async fn has_reader(&self, reader: &str) -> Result<bool> {
        match self {
            Queue::Embedded(q) => Ok(q.has_reader(reader)),
            #[cfg(feature = "jetstream")]
            Queue::JetStream(q) => Box::pin(q.has_reader(reader)).await,
        }
    }

    /// Moves reader `reader` (replay back, or skip ahead): every kept item from the
    /// target on is pending for it again, none before. The target is clamped to what
    /// the reader may reach ([`Queue::bounds`]; on JetStream also not before a
    /// reader's start when it was made at the end). The leases the reader has open
    /// through this weir instance end: confirming one returns false. Returns where the reader
    /// now stands; `None` when it does not exist (it is not created).
    pub async fn seek_reader(&self, reader: &str, to: SeekTo) -> Result<Option<u64>> {
        match self {
            Queue::Embedded(q) => embedded::seek_reader(q, reader, to).await,
            #[cfg(feature = "jetstream")]
            Queue::JetStream(q) => Box::pin(q.seek_reader(reader, to)).await,
        }
    }
}

impl Reader {
    #[inline]
    pub fn name(&self) -> &str {
        match self {
            Reader::Embedded(r) => r.name(),
            #[cfg(feature = "jetstream")]
            Reader::JetStream(r) => r.name(),
        }
    }

    #[inline]
    pub fn queue_name(&self) -> &str {
        match self {
            Reader::Embedded(r) => r.queue_name(),
            #[cfg(feature = "jetstream")]
            Reader::JetStream(r) => r.queue_name(),
        }
    }

    /// Take, lease or peek, waiting up to `wait` for an item (ZERO: one look).
    /// Dropping the future while it waits takes nothing.
    #[inline]
    pub async fn take(&self, mode: TakeMode, wait: Duration) -> Result<Option<Taken>> {
        match self {
            Reader::Embedded(r) => Ok(r.take_async(mode, wait).await?.map(|t| Taken {
                item: t.item,
                lease: t.lease.map(Lease::Embedded),
                deliveries: t.deliveries,
            })),
            #[cfg(feature = "jetstream")]
            Reader::JetStream(r) => Box::pin(r.take(mode, wait)).await,
        }
    }

    /// Confirms a lease: the item is gone for this reader. False when the lease was
    /// not open (timed out, or the reader was flushed).
    #[inline]
    pub async fn confirm(&self, lease: &Lease) -> Result<bool> {
        match (self, lease) {
            (Reader::Embedded(r), Lease::Embedded(id)) => Ok(r.confirm_async(*id).await?),
            #[cfg(feature = "jetstream")]
            (Reader::JetStream(r), Lease::JetStream(l)) => Box::pin(r.confirm(l)).await,
            #[cfg(feature = "jetstream")]
            _ => mismatch(),
        }
    }

    /// Gives a leased item back, ahead of newer ones; its delivery count goes up by
    /// one. Never blocks and never awaits: it is called from `Drop` when a connection
    /// ends (on the engine, under `synced`, the count reaches the disk with the
    /// queue's next fsync).
    pub fn release(&self, lease: &Lease) -> Result<bool> {
        match (self, lease) {
            (Reader::Embedded(r), Lease::Embedded(id)) => Ok(r.release_nowait(*id)?),
            #[cfg(feature = "jetstream")]
            (Reader::JetStream(r), Lease::JetStream(l)) => r.release(l),
            #[cfg(feature = "jetstream")]
            _ => mismatch(),
        }
    }
}

impl Reader {
    /// Extends a lease before it times out (beanstalkd's `touch`): it now ends
    /// `extend` from now, or, with `None`, the reader's lease timeout from now (the
    /// queue's `open_timeout`). False when the lease is no longer open. On JetStream
    /// the extension is always the consumer's AckWait (`+WPI`): a chosen `extend` is
    /// refused there ([`Kind::Unsupported`]).
    pub async fn touch(&self, lease: &Lease, extend: Option<Duration>) -> Result<bool> {
        match (self, lease) {
            (Reader::Embedded(r), Lease::Embedded(id)) => Ok(r.touch(*id, extend)?),
            #[cfg(feature = "jetstream")]
            (Reader::JetStream(r), Lease::JetStream(l)) => Box::pin(r.touch(l, extend)).await,
            #[cfg(feature = "jetstream")]
            _ => mismatch(),
        }
    }
}

impl Reader {
    /// A handle on the same reader whose leases name `holder` as who holds them in
    /// [`Reader::pending`] (a door names one per client connection, e.g.
    /// `"memcache 10.0.0.7:51234"`). Name a handle once and keep it: each lease
    /// shares the name, so a take allocates nothing for it. On JetStream, which
    /// lists no leases, the handle is returned unnamed.
    pub fn with_holder(&self, holder: Arc<str>) -> Reader {
        match self {
            Reader::Embedded(r) => Reader::Embedded(r.with_holder(holder)),
            #[cfg(feature = "jetstream")]
            Reader::JetStream(r) => Reader::JetStream(r.clone()),
        }
    }

    /// The reader's open leases, lowest seq first, at most `limit` (and at most
    /// [`PENDING_LIST_MAX`]), each with its holder, age, time left, delivery count and
    /// length (Redis's `XPENDING`; see `weir::Reader::pending`). A listed lease is
    /// [`Lease::Embedded`] of its `lease` id. Refused on JetStream
    /// ([`Kind::Unsupported`]: `docs/cluster.md`).
    pub async fn pending(&self, limit: usize) -> Result<Vec<PendingLease>> {
        match self {
            Reader::Embedded(r) => Ok(r.pending(limit)),
            #[cfg(feature = "jetstream")]
            Reader::JetStream(r) => r.pending(limit),
        }
    }
}

/// What a door says when asked for JetStream in a build without it.
pub const NO_JETSTREAM: &str =
    "this build of weir has no JetStream support (cargo feature `jetstream`)";

/// A handle of one backend given to another (a reader of one with a lease of the
/// other): a programmer error in the caller, which no client input can cause. It
/// panics: an error would reach the client as if its request were at fault.
#[cfg(feature = "jetstream")]
#[track_caller]
fn mismatch() -> ! {
    panic!("weir-backend: a handle of one backend (embedded or JetStream) was given to the other")
}

#[cfg(all(test, feature = "jetstream"))]
mod tests {
    use super::*;

    /// A JetStream lease given to an engine reader: a bug in the caller, which
    /// crashes rather than reach a client as an ordinary error.
    #[tokio::test]
    #[should_panic(expected = "a handle of one backend")]
    async fn a_handle_of_the_other_backend_panics() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = weir::Store::open(dir.path()).expect("a store");
        let backend = Backend::Embedded(Embedded::new(store));
        let queue = backend.queue("q").await.expect("a queue");
        let reader = backend.reader(&queue, "").await.expect("a reader");
        let lease = Lease::JetStream(jetstream::Lease::for_tests("$JS.ACK.S.C.1.1.1.0.0", 1));
        let _ = reader.release(&lease);
    }
}
