//! The JetStream backend: queues in a NATS JetStream cluster, so that several
//! stateless weir instances share them.
//!
//! One stream holds every queue (a subject each); each reader is a durable pull
//! consumer (see `layout.rs`); what every reader of a queue confirmed is purged by the
//! instances' sweeps (`sweep.rs`). A publish awaits its PubAck (stored on a
//! quorum); a take is a one-message pull and, for a plain `get`, a double ack before
//! the reply; a lease is a delivered, unacknowledged message that the instance keeps
//! alive while its connection holds it (`leases.rs`). Failures of the moment (a leader
//! election, a lost connection) are retried until `unavailable_retry_ms` and then
//! answered as [`Kind::Unavailable`] (`api.rs`, `errors.rs`).
//!
//! The handles ([`Queue`], [`Reader`]) are cheap clones of shared entries of the
//! `registry.rs`, so that an instance's handle cache works as with the engine.
//!
//! This file is the composition: the handles' methods, each a call into the file that
//! does the work. What those files share is in leaves they import without reaching
//! back here: the handles' structs (`handles.rs`), their shared state `Inner`
//! (`inner.rs`), a lease's handle (`lease.rs`), the stats snapshot (`stats_cache.rs`)
//! and the sweep's marks (`sweeper.rs`).
//!
//! Differences from the engine, on purpose (see `docs/cluster.md`):
//! - `delete q` keeps the queue's default-reader consumer: the queue is emptied and its
//!   named readers deleted, but it still exists (with 0 items), so a `set` from an instance
//!   that still holds a handle on it lands in it instead of vanishing.
//! - A plain take is at-least-once: an instance that dies between the pull and its ack
//!   leaves the item to come back after AckWait.
//! - `peek` reads from the reader's ack floor, skipping this instance's leases: it can show
//!   an item leased at another instance (see `reader.rs`).
//! - A `get` of a queue that does not exist creates nothing ([`JetStream::existing_default_reader`]).
//! - Leases given back are redelivered in the order they were given back.
//! - A confirmed item leaves the stream at the next sweep (`sweep_ms`), not at once:
//!   a reader moved back (`seek`) can meet it again until then.
//! - `flush_expired` counts nothing: the server drops expired items itself (each item
//!   carries a `Nats-TTL`), and a take skips one that expired before that.

mod admin;
mod api;
mod connect;
mod dead_letter;
mod errors;
mod failover;
mod handles;
mod inner;
mod instances;
mod layout;
pub(crate) mod lease;
mod leases;
mod left;
pub mod map;
mod metrics;
mod probe;
mod pub_ack;
mod pull;
mod queue;
mod reader;
mod records;
mod registry;
mod scan;
mod seek;
mod setup;
mod stats;
mod stats_cache;
mod sweep;
mod sweeper;

use std::sync::atomic::Ordering;
use std::sync::PoisonError;
use std::time::Duration;

pub use crate::jetstream_config::{JetStreamConfig, INSTANCES_STREAM_BYTES_MIN};
use bytes::Bytes;
pub use handles::{JetStream, Queue, Reader};
pub use lease::Lease;
pub use scan::Scan;
use weir::StoreOptions;
use weir_types::{AppendOptions, QueueStats, TakeMode};

use self::metrics::Op;
use crate::error::{Error, Kind, Result};
use crate::taken::Taken;

impl JetStream {
    /// Connects (in the background when the cluster is unreachable: calls answer
    /// `Unavailable` until it is there) and sets the stream up (create, or update when
    /// its configuration differs; retried in the background, and before any call,
    /// until it succeeds). Fails at once on settings that cannot work (names,
    /// credentials) or a stream the cluster refuses to set up.
    pub async fn connect(config: JetStreamConfig, options: StoreOptions) -> Result<JetStream> {
        setup::connect(config, options).await
    }

    /// The queue if this instance knows it exists; never waits on the network.
    pub fn existing_queue(&self, name: &str) -> Result<Option<Queue>> {
        weir_types::validate_queue_name(name)?;
        Ok(self.inner.registry.get(name).map(|entry| Queue {
            entry,
            inner: self.inner.clone(),
        }))
    }

    /// The queue, created (its default reader's consumer) on first use.
    pub async fn queue(&self, name: &str) -> Result<Queue> {
        let opened = self.inner.open_queue(name).await;
        self.inner.api.metrics.count(Op::Open, &opened);
        let entry = opened?;
        Ok(Queue {
            entry,
            inner: self.inner.clone(),
        })
    }

    /// A queue kept for `readers` only (no default reader), with their handles; see
    /// [`crate::Backend::queue_for_readers`].
    pub async fn queue_for_readers(
        &self,
        name: &str,
        readers: &[&str],
        new_at_end: bool,
    ) -> Result<(Queue, Vec<Reader>)> {
        let opened = self
            .inner
            .open_queue_for_readers(name, readers, new_at_end)
            .await;
        self.inner.api.metrics.count(Op::Open, &opened);
        let (entry, readers) = opened?;
        let handles = readers
            .into_iter()
            .map(|r| Reader {
                queue: entry.clone(),
                entry: r,
                inner: self.inner.clone(),
            })
            .collect();
        let queue = Queue {
            entry,
            inner: self.inner.clone(),
        };
        Ok((queue, handles))
    }

    /// The default reader of `queue` when the queue exists; never creates it (a `get`
    /// of a queue nobody wrote to must not make a replicated consumer).
    pub async fn existing_default_reader(&self, queue: &str) -> Result<Option<Reader>> {
        let Some(entry) = self.inner.find_queue(queue).await? else {
            return Ok(None);
        };
        let reader = self.inner.open_reader(&entry, "").await?;
        Ok(Some(Reader {
            queue: entry,
            entry: reader,
            inner: self.inner.clone(),
        }))
    }

    /// The reader `name` of `queue` (its consumer created on first use).
    pub async fn reader(&self, queue: &Queue, name: &str) -> Result<Reader> {
        let opened = self.inner.open_reader(&queue.entry, name).await;
        self.inner.api.metrics.count(Op::Open, &opened);
        let entry = opened?;
        Ok(Reader {
            queue: queue.entry.clone(),
            entry,
            inner: self.inner.clone(),
        })
    }

    /// Empties the queue and deletes its named readers; its default reader stays (see
    /// the module doc). False when it did not exist.
    pub async fn delete_queue(&self, queue: &str) -> Result<bool> {
        let result = self.inner.delete_queue(queue).await;
        self.inner.api.metrics.count(Op::Admin, &result);
        result
    }

    pub async fn delete_reader(&self, queue: &str, reader: &str) -> Result<bool> {
        let result = self.inner.delete_reader(queue, reader).await;
        self.inner.api.metrics.count(Op::Admin, &result);
        result
    }

    /// `flush q` (every reader: the subject purged) or `flush q.r` (the reader starts
    /// again after the newest item).
    pub async fn flush(&self, queue: &str, reader: Option<&str>) -> Result<u64> {
        let result = self.inner.flush(queue, reader).await;
        self.inner.api.metrics.count(Op::Admin, &result);
        result
    }

    pub async fn flush_all(&self, keep: fn(&str) -> bool) -> Result<()> {
        let result = self.inner.flush_all(keep).await;
        self.inner.api.metrics.count(Op::Admin, &result);
        result
    }

    /// The server drops expired items itself (`Nats-TTL`): nothing to do, 0.
    pub async fn expire(&self, queue: Option<&str>) -> Result<u64> {
        if let Some(name) = queue {
            weir_types::validate_queue_name(name)?;
        }
        Ok(0)
    }

    /// The named queues' stats (all when `None`), sorted by name; from a snapshot at
    /// most `stats_cache_ms` old.
    pub async fn stats(&self, names: Option<Vec<String>>) -> Result<Vec<QueueStats>> {
        let result = self.inner.stats(names).await;
        self.inner.api.metrics.count(Op::Stats, &result);
        result
    }

    /// `reload`: the queues' `max_age` (new items), `open_timeout` (new readers) and
    /// `max_item_size_bytes`.
    pub fn set_options(&self, options: StoreOptions) -> Result<()> {
        for queue in self.inner.registry.all() {
            queue.configure(&options.config(&queue.name));
        }
        *self
            .inner
            .options
            .write()
            .unwrap_or_else(PoisonError::into_inner) = options;
        Ok(())
    }

    pub fn queues_max(&self) -> usize {
        usize::MAX
    }

    pub fn settings(&self) -> Vec<(&'static str, String)> {
        let c = &self.inner.config;
        vec![
            ("backend_servers", c.servers.join(",")),
            ("backend_stream", c.stream.clone()),
            ("backend_subject_prefix", c.subject_prefix.clone()),
            ("backend_replicas", c.replicas.to_string()),
            ("backend_max_consumers", c.consumers_max.to_string()),
            ("backend_lease_timeout_ms", c.lease_timeout_ms.to_string()),
            (
                "backend_instance_timeout_ms",
                c.instance_timeout_ms.to_string(),
            ),
            (
                "backend_unavailable_retry_ms",
                c.unavailable_retry_ms.to_string(),
            ),
            ("backend_sweep_ms", c.sweep_ms.to_string()),
            ("backend_ping_interval_ms", c.ping_interval_ms.to_string()),
            ("backend_failover_ms", c.failover_ms.to_string()),
            (
                "backend_instances_stream_bytes",
                c.instances_stream_bytes.to_string(),
            ),
        ]
    }

    /// The cluster's map `name`, set up on first use (see [`map`]).
    pub async fn shared_map(&self, name: &str) -> Result<map::SharedMap> {
        let api = self.inner.api.clone();
        map::SharedMap::open(
            api,
            &self.inner.layout.stream,
            name,
            self.inner.config.replicas,
        )
        .await
    }

    /// Encodes the backend's own `/metrics` series.
    pub fn encode_metrics(
        &self,
        enc: &mut crate::exposition::DescriptorEncoder<'_>,
    ) -> std::fmt::Result {
        self.inner.api.metrics.encode(enc, self.is_up())
    }

    /// The backend's own `/metrics` series, as text (for tests and tools).
    pub fn render_metrics(&self, out: &mut String) {
        let snapshot = metrics::Snapshot {
            metrics: std::sync::Arc::clone(&self.inner.api.metrics),
            up: self.is_up(),
        };
        out.push_str(&crate::exposition::text(snapshot));
    }

    /// Connected to the cluster, with the stream set up (`weir_backend_up`).
    pub fn is_up(&self) -> bool {
        self.inner.is_up() && self.inner.ready.load(Ordering::Acquire)
    }

    /// A graceful shutdown has begun. Leases released from now on (the connections
    /// closing) are still given back at once: other instances' clients get them, where
    /// the embedded engine keeps them for after its restart. `close` sends what is
    /// queued before the connection to the cluster ends.
    pub fn begin_shutdown(&self) {}

    /// Sends the releases still queued, flushes and closes the connection, and stops
    /// the backend's runtime.
    pub async fn close(&self) -> Result<()> {
        setup::close(self).await;
        Ok(())
    }
}

impl Queue {
    pub fn name(&self) -> &str {
        &self.entry.name
    }

    /// Publishes one item and waits for the cluster's PubAck; returns its stream
    /// sequence (0 for an item already expired, which is not published).
    pub async fn append(&self, data: Bytes, options: AppendOptions) -> Result<u64> {
        let result = queue::append(&self.inner, &self.entry, data, options).await;
        self.inner.api.metrics.count(Op::Append, &result);
        // This instance changed the figures: its next `stats` shows it (read your writes).
        self.inner.stats_cache.invalidate();
        result
    }
}

impl Reader {
    pub fn name(&self) -> &str {
        &self.entry.name
    }

    pub fn queue_name(&self) -> &str {
        &self.queue.name
    }

    /// Take, lease or peek, waiting up to `wait` (ZERO: one look). Dropping the future
    /// while it waits takes nothing: a message delivered to the abandoned pull is
    /// given back at once.
    pub async fn take(&self, mode: TakeMode, wait: Duration) -> Result<Option<Taken>> {
        let op = match mode {
            TakeMode::Take => Op::Take,
            TakeMode::Lease => Op::Lease,
            TakeMode::Peek => Op::Peek,
        };
        let result = match mode {
            TakeMode::Peek => self.peek().await,
            _ => self.take_or_lease(mode, wait).await,
        };
        self.inner.api.metrics.count(op, &result);
        if !matches!(op, Op::Peek) {
            self.inner.stats_cache.invalidate();
        }
        if matches!(&result, Err(e) if e.kind() == Kind::NotFound) {
            self.queue.forget_reader(&self.entry.name);
        }
        result
    }

    /// Acknowledges the lease (and waits for the cluster to record it).
    pub async fn confirm(&self, lease: &Lease) -> Result<bool> {
        let forgot = self.inner.leases.forget(&lease.reply);
        if forgot == leases::Forgot::Ended {
            // Its reader was moved: the item may be pending again under a new
            // delivery, which this acknowledgement would confirm.
            let ended = Ok(false);
            self.inner.api.metrics.count(Op::Confirm, &ended);
            return ended;
        }
        let result = self.ack(&lease.reply).await;
        if let leases::Forgot::Held {
            record: Some(record),
            ..
        } = forgot
        {
            // After the ack: an instance killed between the two leaves a record whose
            // -NAK finds the item no longer pending. An ack not known to be
            // recorded leaves the item maybe pending: its line goes as a release's.
            if matches!(result, Ok(true)) {
                record.confirmed(&self.inner.api, &lease.reply).await;
            } else {
                record.ended(&self.inner.api, &[&lease.reply]).await;
            }
        }
        self.inner.api.metrics.count(Op::Confirm, &result);
        self.inner.stats_cache.invalidate();
        result
    }

    /// Refused ([`Kind::Unsupported`], see `docs/cluster.md`): a reader's leases are
    /// spread over every instance, and this instance's registry (`leases.rs`) keeps
    /// its leases by ack subject, for renewing them, not by reader, and without the
    /// holder, age, delivery count or length a listing shows.
    pub fn pending(&self, _limit: usize) -> Result<Vec<weir_types::PendingLease>> {
        Err(Error::new(
            Kind::Unsupported,
            "listing a reader's open leases (pending) is not supported on the jetstream backend",
        ))
    }

    /// Gives the leased item back, ahead of newer ones (`-NAK`, sent by the nak pump).
    /// Never blocks or awaits.
    pub fn release(&self, lease: &Lease) -> Result<bool> {
        let (record, nak_by, sure_until) = match self.inner.leases.forget(&lease.reply) {
            leases::Forgot::Held {
                record,
                nak_by,
                sure_until,
            } => (record, nak_by, Some(sure_until)),
            leases::Forgot::Unknown => (None, None, None),
            // Given back by other instances already (this instance was taken for dead).
            leases::Forgot::Lost => return Ok(true),
            // Its reader was moved: nothing to give back.
            leases::Forgot::Ended => return Ok(false),
        };
        let release = leases::Release {
            reply: lease.reply.clone(),
            record,
            nak_by,
            sure_until,
        };
        let result = if self.inner.leases.nak(release) {
            Ok(true)
        } else {
            Err(Error::new(Kind::Closed, "the jetstream backend is closed"))
        };
        self.inner.api.metrics.count(Op::Release, &result);
        self.inner.stats_cache.invalidate();
        result
    }
}
