//! Waking readers that wait for items: async waiters through each reader's `Notify`,
//! thread waiters through one condition variable and a generation counter.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;

use crate::error::{Error, Result};

use super::idle::MarkActiveOnDrop;
use super::queue_core::QueueCore;
use super::reader_state::ReaderState;
use super::state::State;

/// Counts a waiter for `stats` while it lives.
pub(crate) struct WaiterGuard(pub(super) Option<Arc<AtomicU64>>);

impl Drop for WaiterGuard {
    fn drop(&mut self) {
        if let Some(w) = &self.0 {
            w.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl QueueCore {
    /// Wakes waiters after items became available for every reader (`count` of them).
    pub(super) fn wake_all_readers(&self, state: &State, count: u64) {
        for r in state.readers.values() {
            let waiting = r.waiters.load(Ordering::SeqCst);
            for _ in 0..waiting.min(count) {
                r.notify.notify_one();
            }
        }
        self.wake_blocking();
    }

    pub(super) fn wake_reader(&self, r: &ReaderState) {
        if r.waiters.load(Ordering::SeqCst) > 0 {
            r.notify.notify_one();
        }
        self.wake_blocking();
    }

    pub(super) fn wake_blocking(&self) {
        self.wake_gen.fetch_add(1, Ordering::SeqCst);
        if self.blocking_waiters.load(Ordering::SeqCst) > 0 {
            let _g = self.wake_lock.lock();
            self.wake_cv.notify_all();
        }
    }

    pub(crate) fn wake_gen(&self) -> u64 {
        self.wake_gen.load(Ordering::SeqCst)
    }

    /// Sleeps until something may have become available (`wake_gen` moved from `gen`)
    /// or `deadline`; false on timeout.
    pub(crate) fn wait_blocking(&self, reader: &str, gen: u64, deadline: Instant) -> bool {
        let _guard = self.waiter_guard(reader);
        self.blocking_waiters.fetch_add(1, Ordering::SeqCst);
        let mut woke = true;
        {
            let mut g = self.wake_lock.lock();
            while self.wake_gen.load(Ordering::SeqCst) == gen {
                if self.wake_cv.wait_until(&mut g, deadline).timed_out() {
                    woke = self.wake_gen.load(Ordering::SeqCst) != gen;
                    break;
                }
            }
        }
        self.blocking_waiters.fetch_sub(1, Ordering::SeqCst);
        woke
    }

    pub(crate) fn reader_notify(&self, reader: &str) -> Result<Arc<Notify>> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let mut state = self.state.lock();
        state.usable_reader(reader)?;
        match state.readers.get(reader) {
            Some(r) => Ok(Arc::clone(&r.notify)),
            None => Err(Error::NotFound {
                what: format!("reader {reader:?}"),
            }),
        }
    }

    pub(crate) fn waiter_guard(&self, reader: &str) -> WaiterGuard {
        let waiters = self
            .state
            .lock()
            .readers
            .get(reader)
            .map(|r| Arc::clone(&r.waiters));
        WaiterGuard(waiters.inspect(|w| {
            w.fetch_add(1, Ordering::SeqCst);
        }))
    }
}
