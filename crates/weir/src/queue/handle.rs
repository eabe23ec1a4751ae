//! `Queue`: a handle on one named queue of a store.
//!
//! Handles are cheap to clone and `Send + Sync`; all of them share one [`QueueCore`],
//! which holds the queue's lock, its segment files and its readers.

use super::iter::Iter;
use crate::config::QueueConfig;
use crate::error::Result;
use crate::item::AppendOptions;
use crate::queue::queue_core::QueueCore;
use crate::reader::Reader;
use crate::stats::QueueStats;
use std::sync::Arc;

/// A named, append-only, durable sequence of items.
#[derive(Clone)]
pub struct Queue {
    pub(crate) core: Arc<QueueCore>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").field("name", &self.name()).finish()
    }
}

impl Queue {
    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.core.name
    }

    /// The settings in force.
    pub fn config(&self) -> QueueConfig {
        self.core.config()
    }

    /// Replaces the settings; takes effect for the next call.
    pub fn set_config(&self, config: QueueConfig) {
        self.core.set_config(config)
    }

    /// Appends one item and returns its sequence number, once the queue's durability
    /// (or `options.sync`) is met. Blocks for an fsync in `synced` mode.
    pub fn append(&self, data: &[u8], options: AppendOptions) -> Result<u64> {
        let (seq, ticket) = self.core.append_batch(&[data], options)?;
        self.core.wait_durable(ticket)?;
        Ok(seq)
    }

    /// Appends several items at once, all or none; returns the first sequence number.
    /// One fsync covers the whole batch in `synced` mode.
    pub fn append_batch(&self, items: &[&[u8]], options: AppendOptions) -> Result<u64> {
        let (seq, ticket) = self.core.append_batch(items, options)?;
        self.core.wait_durable(ticket)?;
        Ok(seq)
    }

    /// [`Queue::append`] for async callers: an fsync wait runs on tokio's blocking pool,
    /// so the runtime's threads never block on the disk. `data` is anything that
    /// derefs to bytes (`&[u8]`, `Bytes`, `Vec<u8>`); it is copied into the queue
    /// before the first await.
    pub async fn append_async(
        &self,
        data: impl AsRef<[u8]>,
        options: AppendOptions,
    ) -> Result<u64> {
        let (seq, ticket) = self.core.append_batch(&[data.as_ref()], options)?;
        self.core.wait_durable_async(ticket).await?;
        Ok(seq)
    }

    /// A handle on the reader `name` ("" is the default reader); creates it on first
    /// use, positioned at the oldest item the queue keeps.
    pub fn reader(&self, name: &str) -> Result<Reader> {
        self.core.ensure_reader(name)?;
        Ok(Reader {
            core: Arc::clone(&self.core),
            name: Arc::from(name),
            holder: None,
        })
    }

    /// A handle on the reader `name`; when it does not exist yet, creates it after
    /// the newest item (it gets only what is appended from now on). The creation and
    /// the move are one step under the queue's lock: an append cannot fall between
    /// them, and a reader that exists (made by another caller a moment ago) is left
    /// where it stands, never moved to the end again.
    pub fn reader_at_end(&self, name: &str) -> Result<Reader> {
        self.core.ensure_reader_at_end(name)?;
        Ok(Reader {
            core: Arc::clone(&self.core),
            name: Arc::from(name),
            holder: None,
        })
    }

    /// The seqs a reader can be moved to with [`Reader::seek`](crate::Reader::seek):
    /// `(oldest, next)`, the oldest item still kept on disk (for some reader, or by
    /// retention) and the seq the next append gets. Items are dropped a segment at a
    /// time, so `oldest` can lie before every reader's position.
    ///
    /// Read from memory under the queue's lock: no file is opened, and the look does
    /// not count as a use (an idle queue still closes its files after its idle time).
    pub fn seq_bounds(&self) -> Result<(u64, u64)> {
        self.core.seq_bounds()
    }

    /// The seq of the first item enqueued at or after `at_ms` (Unix milliseconds),
    /// within [`Queue::seq_bounds`]: `next` when every kept item is older, `oldest`
    /// when none is. Reads one record header per step of a binary search over the
    /// segments, then the headers of one segment; no index is kept in memory. Enqueue
    /// times follow the clock: if it was stepped back, the answer is the first item at
    /// or after `at_ms` in the segment the search picks.
    pub fn seq_at_time(&self, at_ms: u64) -> Result<u64> {
        self.core.seq_at_time(at_ms)
    }

    /// Moves the reader `name` to `seq` as [`Reader::seek`](crate::Reader::seek) does,
    /// if it exists; `None` when it does not. The look and the move are one step under
    /// the queue's lock: a reader deleted a moment before is not made again (a
    /// handle's `seek` makes its reader when it is missing).
    pub fn seek_reader(&self, name: &str, seq: u64) -> Result<Option<u64>> {
        self.core.seek_existing(name, seq)
    }

    /// Whether the reader `name` exists (a look, no file work, nothing created).
    pub fn has_reader(&self, name: &str) -> bool {
        self.core.has_reader(name)
    }

    /// Names of the readers that exist.
    pub fn reader_names(&self) -> Vec<String> {
        self.core.reader_names()
    }

    /// Deletes a reader and its position; false when there was none.
    pub fn delete_reader(&self, name: &str) -> Result<bool> {
        self.core.delete_reader(name)
    }

    /// Drops every item for every reader (and for a queue with no reader); returns how
    /// many items the most-behind reader lost.
    pub fn flush(&self) -> Result<u64> {
        self.core.flush(None)
    }

    /// Drops or moves (to `expire_to`) the expired items at the head of every reader;
    /// returns how many were dropped or moved.
    pub fn expire(&self) -> Result<u64> {
        self.core.expire()
    }

    /// Counters and gauges of the queue and each reader.
    pub fn stats(&self) -> QueueStats {
        self.core.stats()
    }

    /// Every kept item in order, without consuming anything.
    pub fn iter(&self) -> Result<Iter> {
        self.core.iter()
    }

    /// fdatasyncs everything written so far.
    pub fn sync(&self) -> Result<()> {
        self.core.sync_now()
    }
}
