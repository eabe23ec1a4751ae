//! A publish's wake-ups of the delivery workers: per worker, one "something new" flag
//! per topic ([`WakeFlags`]), and per topic, the wake-ups of its subscribers' workers
//! ([`TopicWake`]).
//!
//! A worker of 1,000 topics woken by one publish looks at one topic: the first
//! wake-up since its last look lists the topic, and the worker takes the list. The
//! bus builds the wake-ups (`bus.rs`), a publish sets them (`api/topics.rs`), the
//! worker reads and clears them (`worker.rs`); this file names none of those.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// The wake-up of one subscriber's worker by one topic: the worker looks at that
/// topic's reader, not at every one of its topics.
#[derive(Clone)]
pub struct TopicWake {
    notify: Arc<Notify>,
    /// Set before the worker is woken; the worker clears it before it looks.
    pending: Arc<AtomicBool>,
    /// The worker's flags, whose list of topics flagged this wake-up joins.
    pub(crate) flags: Arc<WakeFlags>,
    topic: Arc<str>,
}

impl TopicWake {
    /// The wake-up of the worker whose flags are `flags`, by `topic`.
    pub fn new(notify: Arc<Notify>, flags: Arc<WakeFlags>, topic: &str) -> TopicWake {
        TopicWake {
            notify,
            pending: flags.flag(topic),
            flags,
            topic: Arc::from(topic),
        }
    }

    /// Whether both wake up the same worker.
    pub(crate) fn same_worker(&self, other: &TopicWake) -> bool {
        Arc::ptr_eq(&self.flags, &other.flags)
    }

    /// Tells the worker that the topic has something new. The first wake-up since
    /// the worker's last look lists the topic, so that a worker of 1,000 topics
    /// woken by one publish looks at one flag, not at 1,000.
    pub fn notify_one(&self) {
        if !self.pending.swap(true, Ordering::AcqRel) {
            self.flags.listed.lock().push(Arc::clone(&self.topic));
        }
        self.notify.notify_one();
    }
}

/// A worker's "something new" flags, one per topic, shared with the topics'
/// [`TopicWake`]s, and the topics whose flag was set since the worker last looked.
#[derive(Default)]
pub struct WakeFlags {
    flags: Mutex<HashMap<String, Arc<AtomicBool>>>,
    /// A topic joins when its flag goes from clear to set, and the worker clears a
    /// flag only after it took this list: so a topic is in it at most twice (once
    /// more if the worker cleared its flag while looking at it for another
    /// reason), and the list is bounded by the worker's topics.
    listed: Mutex<Vec<Arc<str>>>,
}

impl WakeFlags {
    /// The flag of `topic` (made set: a new source is looked at once).
    pub fn flag(&self, topic: &str) -> Arc<AtomicBool> {
        let mut flags = self.flags.lock();
        Arc::clone(
            flags
                .entry(topic.to_owned())
                .or_insert_with(|| Arc::new(AtomicBool::new(true))),
        )
    }

    /// Forgets the flag of a topic whose wake-ups no longer reach this worker. Only
    /// the bus calls it, as it rebuilds a topic's wake-ups, so that a wake-up and the
    /// worker's source always share one flag: a worker pruning by the settings it last
    /// adopted could drop a flag a newer change had just linked, and the topic would
    /// then wait for the sweep at every publish.
    pub fn forget(&self, topic: &str) {
        self.flags.lock().remove(topic);
    }

    /// The topics flagged since the last call, emptying the list, with their flags
    /// cleared (before the worker looks: a publish meanwhile sets a flag again and
    /// lists its topic). Cleared by name, through the flag the topic's wake-ups hold
    /// now, so a source built before its topic's wake-ups were rebuilt (holding an
    /// older flag) cannot leave the current flag set and the topic never listed again.
    pub fn take_listed(&self) -> Vec<Arc<str>> {
        let listed = std::mem::take(&mut *self.listed.lock());
        let flags = self.flags.lock();
        for topic in &listed {
            if let Some(flag) = flags.get(&**topic) {
                flag.swap(false, Ordering::AcqRel);
            }
        }
        listed
    }
}
