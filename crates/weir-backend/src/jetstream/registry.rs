//! The queues and readers this weir instance knows exist, so that finding one is a map
//! lookup (`existing_queue` must never wait on the network), and what it keeps per
//! queue: the queue's settings as the config gives them, and this instance's own
//! counters (JetStream has no per-subject totals).
//!
//! A queue exists on the cluster when its default reader's consumer `q~` does, or,
//! for a queue kept for its readers (`open_queue_for_readers`, the proxy's capture
//! queues), while one of its named readers' consumers does. The registry is filled
//! from the stream's consumer list when the stream is first set up, and from `stats`'
//! listings (queues with a default reader), then as queues and readers are used or
//! created; another instance's new queue is learnt when this instance first names it
//! (creating a consumer again is idempotent).
//! Its size is bounded by the stream's consumers (`consumers_max`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use weir::QueueConfig;

use super::layout::{consumer_name, Layout};

/// One queue.
pub(crate) struct QueueEntry {
    pub name: Arc<str>,
    pub subject: Arc<str>,
    /// `max_age` in ms; 0 for none.
    max_age_ms: AtomicU64,
    /// `open_timeout` in ms; 0 for none.
    open_timeout_ms: AtomicU64,
    max_item_size: AtomicU64,
    /// `max_deliveries`; 0 for none.
    max_deliveries: AtomicU64,
    /// `dead_letter_to`.
    dead_letter_to: Mutex<Option<Arc<str>>>,
    /// Items this instance appended since it started (`total_items`).
    pub appended: AtomicU64,
    /// When this instance last appended (Unix ms), for read-your-writes (see
    /// `reader::REPLICA_LAG`).
    pub appended_at_ms: AtomicU64,
    /// The stream sequence of this instance's latest append (read-your-writes).
    pub appended_seq: AtomicU64,
    /// Items below this stream sequence were purged by this instance (`flush`,
    /// `flush_all`, `delete`): one past its latest append when it purged. The purge
    /// is answered once a quorum applied it, but a consumer's leader on the third
    /// replica may still deliver a purged item for a moment; a take skips such items,
    /// so a `flush` then `get` through one instance never sees what it flushed.
    pub purged_below: AtomicU64,
    /// Kept for its named readers only (`open_queue_for_readers`): it must never get
    /// a default reader, which nobody would read.
    pub readers_only: AtomicBool,
    readers: Mutex<HashMap<Arc<str>, Arc<ReaderEntry>>>,
}

/// One reader of a queue.
pub(crate) struct ReaderEntry {
    pub name: Arc<str>,
    pub consumer: Arc<str>,
    /// `$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`.
    pub next_subject: Arc<str>,
    /// The consumer's AckWait in ms, as the server reported it.
    ack_wait_ms: AtomicU64,
    /// Items this instance skipped because they had expired.
    pub expired: AtomicU64,
    /// Items this instance dead-lettered (`max_deliveries`).
    pub dead_lettered: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn ms(d: Option<Duration>) -> u64 {
    d.map_or(0, |d| {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
    })
}

impl QueueEntry {
    pub fn new(name: &str, layout: &Layout, config: &QueueConfig) -> QueueEntry {
        let entry = QueueEntry {
            name: name.into(),
            subject: layout.subject(name).into(),
            max_age_ms: AtomicU64::new(0),
            open_timeout_ms: AtomicU64::new(0),
            max_item_size: AtomicU64::new(u64::MAX),
            max_deliveries: AtomicU64::new(0),
            dead_letter_to: Mutex::new(None),
            appended: AtomicU64::new(0),
            appended_at_ms: AtomicU64::new(0),
            appended_seq: AtomicU64::new(0),
            purged_below: AtomicU64::new(0),
            readers_only: AtomicBool::new(false),
            readers: Mutex::new(HashMap::new()),
        };
        entry.configure(config);
        entry
    }

    /// The queue's settings from the config (at creation and at `reload`).
    pub fn configure(&self, config: &QueueConfig) {
        self.max_age_ms.store(ms(config.max_age), Ordering::Relaxed);
        self.open_timeout_ms
            .store(ms(config.open_timeout), Ordering::Relaxed);
        self.max_item_size
            .store(config.max_item_size_bytes, Ordering::Relaxed);
        self.max_deliveries.store(
            config.max_deliveries.map_or(0, u64::from),
            Ordering::Relaxed,
        );
        *lock(&self.dead_letter_to) = config
            .dead_letter_to
            .as_deref()
            .filter(|to| **to != *self.name)
            .map(Arc::from);
    }

    /// Whether an item delivered `deliveries` times (this time included) came back
    /// `max_deliveries` times before, and is to be dead-lettered, not handed out.
    pub fn delivered_enough(&self, deliveries: u32) -> bool {
        match self.max_deliveries.load(Ordering::Relaxed) {
            0 => false,
            most => u64::from(deliveries) > most,
        }
    }

    /// Where dead letters go (never this queue itself).
    pub fn dead_letter_to(&self) -> Option<Arc<str>> {
        lock(&self.dead_letter_to).clone()
    }

    /// Whether this instance appended to the queue since it last purged it.
    pub fn appended_since_purge(&self) -> bool {
        let appended = self.appended_seq.load(Ordering::Relaxed);
        appended != 0 && appended >= self.purged_below.load(Ordering::Relaxed)
    }

    /// Whether an item of this queue was purged by this instance.
    pub fn purged(&self, seq: u64) -> bool {
        seq < self.purged_below.load(Ordering::Relaxed)
    }

    pub fn max_age_ms(&self) -> u64 {
        self.max_age_ms.load(Ordering::Relaxed)
    }

    pub fn open_timeout(&self) -> Option<Duration> {
        match self.open_timeout_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    pub fn max_item_size(&self) -> u64 {
        self.max_item_size.load(Ordering::Relaxed)
    }

    pub fn reader(&self, name: &str) -> Option<Arc<ReaderEntry>> {
        lock(&self.readers).get(name).cloned()
    }

    /// Records that the reader's consumer exists, with its AckWait.
    pub fn add_reader(&self, layout: &Layout, name: &str, ack_wait: Duration) -> Arc<ReaderEntry> {
        let mut readers = lock(&self.readers);
        if let Some(r) = readers.get(name) {
            r.set_ack_wait(ack_wait);
            return r.clone();
        }
        let consumer = consumer_name(&self.name, name);
        let entry = Arc::new(ReaderEntry {
            name: name.into(),
            next_subject: layout.next_subject(&consumer).into(),
            consumer: consumer.into(),
            ack_wait_ms: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
        });
        entry.set_ack_wait(ack_wait);
        readers.insert(entry.name.clone(), entry.clone());
        entry
    }

    pub fn forget_reader(&self, name: &str) {
        lock(&self.readers).remove(name);
    }

    /// Forgets every reader but the default one.
    pub fn forget_named_readers(&self) {
        lock(&self.readers).retain(|name, _| name.is_empty());
    }

    /// Items dead-lettered, per reader name.
    pub fn dead_letter_counts(&self) -> Vec<(Arc<str>, u64)> {
        lock(&self.readers)
            .values()
            .map(|r| (r.name.clone(), r.dead_lettered.load(Ordering::Relaxed)))
            .collect()
    }

    /// Items skipped as expired, per reader name.
    pub fn expired_counts(&self) -> Vec<(Arc<str>, u64)> {
        lock(&self.readers)
            .values()
            .map(|r| (r.name.clone(), r.expired.load(Ordering::Relaxed)))
            .collect()
    }
}

impl ReaderEntry {
    pub fn ack_wait(&self) -> Duration {
        Duration::from_millis(self.ack_wait_ms.load(Ordering::Relaxed))
    }

    fn set_ack_wait(&self, d: Duration) {
        self.ack_wait_ms.store(ms(Some(d)), Ordering::Relaxed);
    }
}

#[derive(Default)]
pub(crate) struct Registry {
    queues: Mutex<HashMap<Arc<str>, Arc<QueueEntry>>>,
}

impl Registry {
    pub fn get(&self, name: &str) -> Option<Arc<QueueEntry>> {
        lock(&self.queues).get(name).cloned()
    }

    /// The entry of `name`, made if new (a consumer of it exists: `q~`, or a named
    /// reader of a queue kept for its readers).
    pub fn add(
        &self,
        name: &str,
        layout: &Layout,
        config: impl FnOnce() -> QueueConfig,
    ) -> Arc<QueueEntry> {
        if let Some(q) = self.get(name) {
            return q;
        }
        let config = config();
        let mut queues = lock(&self.queues);
        queues
            .entry(name.into())
            .or_insert_with(|| Arc::new(QueueEntry::new(name, layout, &config)))
            .clone()
    }

    pub fn forget_all(&self) {
        lock(&self.queues).clear();
    }

    pub fn all(&self) -> Vec<Arc<QueueEntry>> {
        lock(&self.queues).values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> QueueEntry {
        let layout = Layout::new(&crate::JetStreamConfig::default()).unwrap();
        QueueEntry::new("q", &layout, &QueueConfig::default())
    }

    #[test]
    fn a_purge_covers_this_instances_appends_before_it_and_none_after() {
        let q = entry();
        assert!(!q.appended_since_purge(), "nothing appended yet");
        assert!(!q.purged(1));
        q.appended_seq.fetch_max(7, Ordering::Relaxed);
        assert!(q.appended_since_purge());
        // A purge sent after the append of 7.
        q.purged_below.fetch_max(8, Ordering::Relaxed);
        assert!(!q.appended_since_purge());
        assert!(q.purged(7) && q.purged(1));
        assert!(
            !q.purged(8),
            "an item stored after the purge is not skipped"
        );
        q.appended_seq.fetch_max(9, Ordering::Relaxed);
        assert!(q.appended_since_purge());
        assert!(!q.purged(9));
    }
}
