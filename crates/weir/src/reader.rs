//! `Reader`: a named position in a queue, with its leases.
//!
//! Every reader sees every item (fanout); handles on the same reader compete for items
//! (work queue). A lease is an item handed out but not yet confirmed; release returns it
//! to the reader ahead of newer items.
//!
//! A handle may be named ([`Reader::with_holder`]): every lease it takes records that
//! name as its holder, shown by [`Reader::pending`]. The name is set once per handle
//! (a front door names one per client connection) and each lease keeps a clone of
//! its `Arc`, so a take pays a reference count increment, never an allocation. A
//! name is a handle's, not the reader's: handles on one reader with different names
//! compete for its items as any handles do.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::item::{Item, Lease, LeaseId, TakeMode, Taken};
use crate::queue::queue_core::QueueCore;
use weir_types::PendingLease;

/// What a timeout too large to add to the clock is cut to (about 30 years).
const WAIT_FOREVER: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// A handle on one reader of one queue.
#[derive(Clone)]
pub struct Reader {
    pub(crate) core: Arc<QueueCore>,
    pub(crate) name: Arc<str>,
    /// Who takes through this handle ([`Reader::with_holder`]).
    pub(crate) holder: Option<Arc<str>>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("queue", &self.queue_name())
            .field("name", &self.name())
            .field("holder", &self.holder())
            .finish()
    }
}

impl Reader {
    /// The reader's name ("" for the default reader).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name of the queue it reads.
    pub fn queue_name(&self) -> &str {
        &self.core.name
    }

    /// A handle on the same reader whose leases record `holder` as who holds them
    /// (see [`Reader::pending`]), e.g. `"memcache 10.0.0.7:51234"`. Name a handle
    /// once and keep it: the name is shared, not copied, by every lease it takes.
    pub fn with_holder(&self, holder: Arc<str>) -> Reader {
        Reader {
            core: Arc::clone(&self.core),
            name: Arc::clone(&self.name),
            holder: Some(holder),
        }
    }

    /// Who this handle takes for ([`Reader::with_holder`]); `None` when unnamed.
    pub fn holder(&self) -> Option<&str> {
        self.holder.as_deref()
    }

    /// The reader's open leases, lowest seq first, at most `limit` (and at most
    /// [`PENDING_LIST_MAX`](crate::PENDING_LIST_MAX)): each with its lease id, item
    /// seq, holder, age, time left before it times out, delivery count and payload
    /// length (Redis's `XPENDING`). Leases of every handle on the reader are listed;
    /// the engine's own (items being moved to `expire_to` or `dead_letter_to`) are
    /// not. Read from memory under the queue's lock; empty when the reader has none
    /// or was deleted.
    pub fn pending(&self, limit: usize) -> Vec<PendingLease> {
        self.core.pending(&self.name, limit)
    }

    /// Takes the next item and confirms it at once; `None` when there is none.
    pub fn take(&self) -> Result<Option<Item>> {
        Ok(self.take_mode(TakeMode::Take)?.map(|t| t.item))
    }

    /// Takes the next item under a lease.
    pub fn take_leased(&self) -> Result<Option<Lease>> {
        Ok(self.take_mode(TakeMode::Lease)?.and_then(|t| {
            t.lease.map(|id| Lease {
                id,
                item: t.item,
                deliveries: t.deliveries,
            })
        }))
    }

    /// Looks at the next item without taking it.
    pub fn peek(&self) -> Result<Option<Item>> {
        Ok(self.take_mode(TakeMode::Peek)?.map(|t| t.item))
    }

    /// Takes, leases or peeks, by `mode`, without waiting.
    pub fn take_mode(&self, mode: TakeMode) -> Result<Option<Taken>> {
        let (taken, ticket) = self.core.take(&self.name, mode, self.holder.as_ref())?;
        self.core.wait_durable(ticket)?;
        Ok(taken)
    }

    /// Takes and confirms up to `count_max` items at once.
    pub fn take_batch(&self, count_max: usize) -> Result<Vec<Item>> {
        let (items, ticket) = self.core.take_batch(&self.name, count_max)?;
        self.core.wait_durable(ticket)?;
        Ok(items)
    }

    /// Like [`Reader::take_mode`], but waits up to `timeout` for an item to arrive,
    /// blocking the calling thread. An append wakes the waiter at once.
    pub fn take_timeout(&self, mode: TakeMode, timeout: Duration) -> Result<Option<Taken>> {
        // `Duration::MAX` means "wait for ever": cap it rather than overflow.
        let now = Instant::now();
        let deadline = now
            .checked_add(timeout)
            .unwrap_or_else(|| now + WAIT_FOREVER);
        loop {
            // Read the wake generation before looking, so an append between the look
            // and the wait is not missed.
            let gen = self.core.wake_gen();
            if let Some(taken) = self.take_mode(mode)? {
                return Ok(Some(taken));
            }
            if Instant::now() >= deadline || !self.core.wait_blocking(&self.name, gen, deadline) {
                return self.take_mode(mode);
            }
        }
    }

    /// Like [`Reader::take_timeout`] for async callers: the task sleeps, no thread does.
    ///
    /// Dropping the future while it waits for an item takes nothing. One window is
    /// inherent to a plain take (`TakeMode::Take`) on a `synced` queue: the item is
    /// confirmed first and then fsync'ed, and a future dropped during that fsync has
    /// taken the item without receiving it. Take under a lease (`TakeMode::Lease`) for
    /// at-least-once delivery.
    pub async fn take_async(&self, mode: TakeMode, timeout: Duration) -> Result<Option<Taken>> {
        if timeout.is_zero() {
            // No wait: one look under the queue's lock, without registering as a
            // waiter (which costs two more lock holds and a shared counter).
            let (taken, ticket) = self.core.take(&self.name, mode, self.holder.as_ref())?;
            self.core.wait_durable_async(ticket).await?;
            return Ok(taken);
        }
        let now = tokio::time::Instant::now();
        let deadline = now
            .checked_add(timeout)
            .unwrap_or_else(|| now + WAIT_FOREVER);
        loop {
            // Register as a waiter before looking, so an append between the look and
            // the wait wakes us: the appender sees the waiter count under the queue's
            // lock after our look, or our look sees its item.
            let notify = self.core.reader_notify(&self.name)?;
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let waiter = self.core.waiter_guard(&self.name);
            let (taken, ticket) = self.core.take(&self.name, mode, self.holder.as_ref())?;
            if taken.is_some() {
                drop(waiter);
                self.core.wait_durable_async(ticket).await?;
                return Ok(taken);
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                drop(waiter);
                let (taken, ticket) = self.core.take(&self.name, mode, self.holder.as_ref())?;
                self.core.wait_durable_async(ticket).await?;
                return Ok(taken);
            }
        }
    }

    /// Confirms a lease: the item is done for this reader. False when the lease is
    /// unknown (already confirmed, released, or timed out).
    pub fn confirm(&self, lease: LeaseId) -> Result<bool> {
        let (found, ticket) = self.core.confirm(&self.name, lease)?;
        self.core.wait_durable(ticket)?;
        Ok(found)
    }

    /// [`Reader::confirm`] for async callers.
    pub async fn confirm_async(&self, lease: LeaseId) -> Result<bool> {
        let (found, ticket) = self.core.confirm(&self.name, lease)?;
        self.core.wait_durable_async(ticket).await?;
        Ok(found)
    }

    /// Releases a lease: the item goes back to this reader, ahead of newer items, its
    /// delivery count one higher (durable under the queue's durability rule, as a
    /// confirmation is). False when the lease is unknown.
    pub fn release(&self, lease: LeaseId) -> Result<bool> {
        let (found, ticket) = self.core.release(&self.name, lease)?;
        self.core.wait_durable(ticket)?;
        Ok(found)
    }

    /// [`Reader::release`] for callers that cannot wait (a `Drop` on an event loop):
    /// under `synced` the return count is on disk with the queue's next fsync, not on
    /// return (a power cut before it can count one delivery fewer).
    pub fn release_nowait(&self, lease: LeaseId) -> Result<bool> {
        Ok(self.core.release(&self.name, lease)?.0)
    }

    /// [`Reader::release`] for async callers.
    pub async fn release_async(&self, lease: LeaseId) -> Result<bool> {
        let (found, ticket) = self.core.release(&self.name, lease)?;
        self.core.wait_durable_async(ticket).await?;
        Ok(found)
    }

    /// Extends a lease before it times out: it now ends `extend` from now, or, with
    /// `None`, the queue's `open_timeout` from now (beanstalkd's `touch`, SQS's
    /// ChangeMessageVisibility). A lease the queue gives no timeout keeps none unless
    /// `extend` gives one. False when the lease is unknown (confirmed, released or
    /// timed out already). Kept in memory only: leases do not outlive the process.
    pub fn touch(&self, lease: LeaseId, extend: Option<Duration>) -> Result<bool> {
        self.core.touch(&self.name, lease, extend)
    }

    /// How long a lease has before it times out: `None` when it is not open (confirmed,
    /// released, timed out), `Duration::MAX` when it has no deadline.
    pub fn lease_time_left(&self, lease: LeaseId) -> Option<Duration> {
        self.core.lease_time_left(&self.name, lease)
    }

    /// Drops item `seq` for this reader, out of order, without taking it under a lease:
    /// confirmed (journaled like any confirmation) and returned as it was. `None` when
    /// it is not pending for this reader: confirmed already, never stored, or held
    /// under a lease (which is its holder's to end). Finding the item reads from its
    /// segment's start (no index is kept), so this is for the odd item named by an
    /// operator or a client, not for a queue's flow.
    pub fn discard(&self, seq: u64) -> Result<Option<Item>> {
        let (item, ticket) = self.core.discard_seq(&self.name, seq)?;
        self.core.wait_durable(ticket)?;
        Ok(item)
    }

    /// Moves this reader to `seq`: every kept item from there on is pending for it
    /// again (replay) or every item before it is dropped for it (skipping ahead).
    /// `seq` is clamped to [`Queue::seq_bounds`](crate::Queue::seq_bounds); returns
    /// where the reader now stands. Its open leases end (confirming one afterwards
    /// returns false); other readers are untouched. Journaled like a confirmation:
    /// durable on return under `synced`.
    pub fn seek(&self, seq: u64) -> Result<u64> {
        self.core.seek(&self.name, seq)
    }

    /// Drops every item for this reader; returns how many.
    pub fn flush(&self) -> Result<u64> {
        self.core.flush(Some(&self.name))
    }
}
