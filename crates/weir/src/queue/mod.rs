//! `QueueCore`: one queue's state behind one lock, and every operation on it.
//!
//! The state is small and bounded: the list of segment files, the writer's mapping
//! window, and per reader a position, its out-of-order confirmations (as ranges), its
//! leases and released items, and one read-ahead buffer. Nothing here grows with the
//! backlog; items live only in the segment files (and the OS page cache).
//!
//! Every operation takes the queue's lock once, does its work without system calls in
//! the common case (appends and confirmations are stores into mappings), and returns a
//! [`Ticket`](commit::Ticket) when the caller must wait for an fsync (`synced` durability). The wait
//! happens outside the lock, through group commit: the first waiter fsyncs for all,
//! and at the end of its round wakes only the waiters the round covered, plus the
//! oldest one it did not cover to lead the next round. Waking every waiter each round
//! (a condition variable's `notify_all`) cost more than the fsync itself with 64
//! threads on 2 cores: most of them woke only to sleep again.
//!
//! Where each part lives: `log.rs` the segment files and reading records; `state.rs`
//! the state behind the lock and the helpers every operation shares; `append.rs`,
//! `take.rs`, `leases.rs` and `expire.rs` the operations; `reader_state.rs` one
//! reader's position and leases; `commit.rs` group commit; `wake.rs` waiting readers;
//! `open.rs` opening and recovery; `seek.rs` moving a reader and finding a seq by time; `idle.rs` the background tick and closing idle
//! files; `stats.rs` statistics and iteration; `handle.rs` the public [`Queue`].
//!
//! Invariants per reader (checked by `ReaderState::check` in debug builds):
//! - `acked_below <= next_seq` and `cursor_seq <= next_seq`;
//! - every leased or released seq lies in `[acked_below, cursor_seq)` and is not
//!   confirmed; every unconfirmed seq below the cursor is leased or released;
//! - after a reopen the cursor restarts at `acked_below`, so confirmations made out of
//!   order before the restart can lie above it (or pull `acked_below` past it): reading
//!   skips those items.

mod append;
mod commit;
mod cursor;
mod expire;
mod handle;
mod idle;
mod iter;
mod leases;
mod log;
mod open;
mod reader_state;
mod seek;
mod state;
mod stats;
mod take;
mod wake;

use self::commit::SyncState;
use self::idle::MarkActiveOnDrop;
use self::state::State;
use crate::clock::Clock;
use crate::config::QueueConfig;
use crate::file_cell::FilesBudget;
use crate::journal::JournalRecord;
use crate::name::validate_reader_name;
use crate::store::StoreInner;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Weak};
use std::{fs, io};

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};

pub use self::handle::Queue;
pub use self::iter::Iter;

pub(crate) struct QueueCore {
    pub(crate) name: String,
    /// The store's clock (a copy of `State::clock`, read without the lock).
    clock: Clock,
    dir: PathBuf,
    store: Weak<StoreInner>,
    /// This queue, for handing itself to the store's list of active queues.
    me: Weak<QueueCore>,
    /// On the store's list of queues its background thread visits (see `tick`).
    active: AtomicBool,
    /// The store's descriptor budget (`None` once the store is gone).
    budget: Option<Arc<FilesBudget>>,
    state: Mutex<State>,
    sync: Mutex<SyncState>,
    /// Bumped whenever an item may have become available; blocking (thread) waiters
    /// sleep on `wake_cv` until it moves.
    wake_gen: AtomicU64,
    wake_lock: Mutex<()>,
    wake_cv: Condvar,
    blocking_waiters: AtomicU64,
}

fn is_disk_full(e: &io::Error) -> bool {
    crate::error::is_disk_full(e)
}

fn io_err(context: impl FnOnce() -> String) -> impl FnOnce(io::Error) -> Error {
    move |e| Error::io(context(), e)
}

impl QueueCore {
    pub(crate) fn config(&self) -> QueueConfig {
        self.state.lock().config.clone()
    }

    pub(crate) fn set_config(&self, config: QueueConfig) {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let mut state = self.state.lock();
        state.config = config;
        // `max_age` may have changed: when the heads expire is not known any more.
        state.floor_head_expiry = None;
        for r in state.readers.values_mut() {
            r.head_expiry = None;
        }
        if let Err(e) = state.apply_staging() {
            // Staging stays on: its bytes are kept and written by a later flush.
            tracing::error!(queue = %self.name, error = %e, "could not write staged appends");
        }
    }

    /// Creates the reader `name` if it does not exist; under `synced` its creation is
    /// durable when this returns (its journal record, the reader list, the directory).
    pub(crate) fn ensure_reader(&self, name: &str) -> Result<()> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let ticket = {
            let mut state = self.state.lock();
            let journal_before = state.journal.written;
            state.usable_reader(name)?;
            if state.journal.written != journal_before {
                state.ticket(false, 0, true)
            } else {
                None
            }
        };
        self.wait_durable(ticket)
    }

    pub(crate) fn has_reader(&self, name: &str) -> bool {
        self.state.lock().readers.contains_key(name)
    }

    pub(crate) fn reader_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.state.lock().readers.keys().cloned().collect();
        names.sort();
        names
    }

    pub(crate) fn delete_reader(&self, name: &str) -> Result<bool> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        validate_reader_name(name)?;
        let mut state = self.state.lock();
        state.ready()?;
        let Some(r) = state.readers.get(name) else {
            return Ok(false);
        };
        let (id, acked, bytes) = (r.id, r.acked_below, r.pending_bytes);
        let last = state.readers.len() == 1;
        if last {
            // With no reader left the queue keeps what this one had not confirmed.
            state.journal_append(JournalRecord::Floor(acked))?;
        }
        state.journal_append(JournalRecord::ReaderDelete { id })?;
        if let Some(r) = state.readers.remove(name) {
            r.notify.notify_waiters();
        }
        if let Err(e) = state.write_reader_list(None) {
            // The journal has the deletion; a stale list only matters if the journal is
            // lost too, and then the reader comes back (keeping items, never losing any).
            tracing::warn!(queue = %self.name, error = %e, "could not rewrite the reader list after deleting a reader");
        }
        if last {
            state.floor = acked;
            state.floor_bytes = bytes;
            state.floor_loc = None;
        }
        // Under `synced`, durable when this returns, like every journaled operation.
        let ticket = state.after_journal_write();
        drop(state);
        self.wait_durable(ticket)?;
        Ok(true)
    }

    pub(crate) fn flush(&self, reader: Option<&str>) -> Result<u64> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let mut state = self.state.lock();
        state.ready()?;
        let dropped = match reader {
            Some(name) => {
                state.usable_reader(name)?;
                state.flush_reader(name)?
            }
            None => {
                let mut dropped = if state.readers.is_empty() {
                    state.next_seq - state.floor
                } else {
                    0
                };
                let names: Vec<String> = state.readers.keys().cloned().collect();
                for name in names {
                    dropped = dropped.max(state.flush_reader(&name)?);
                }
                let next = state.next_seq;
                if state.floor < next {
                    // Nothing to record when the floor is there already: a flush of an
                    // empty queue writes nothing (and opens no file).
                    state.journal_append(JournalRecord::Floor(next))?;
                }
                state.floor = next;
                state.floor_bytes = 0;
                state.floor_loc = None;
                if state.hold.is_some() {
                    // A flush of the whole queue is the operator's word that nothing
                    // before it is wanted, by known readers or lost ones.
                    let held = state.hold.take();
                    if let Err(e) = state.write_reader_list(None) {
                        state.hold = held;
                        return Err(e);
                    }
                    tracing::info!(queue = %self.name, "flushed: items are no longer held for readers lost with the reader journal");
                }
                dropped
            }
        };
        // Under `synced`, durable when this returns, like every journaled operation.
        let ticket = state.after_journal_write();
        drop(state);
        self.wait_durable(ticket)?;
        Ok(dropped)
    }

    /// Marks the queue deleted (every handle gets `NotFound` from now on) and moves its
    /// directory to `tomb`, for the store to remove. Called under the store's map lock.
    pub(crate) fn retire(&self, tomb: &Path) -> Result<()> {
        let mut state = self.state.lock();
        if let Err(e) = fs::rename(&self.dir, tomb) {
            return Err(Error::io(format!("deleting {}", self.dir.display()), e));
        }
        state.deleted = true;
        // The directory is on its way out: what is staged is dropped with it.
        let end = state.log.writer.file_end();
        state.log.writer.unstage_from(end);
        let _ = state.log.writer.unmap();
        state.journal.unmap();
        for r in state.readers.values() {
            r.notify.notify_waiters();
        }
        drop(state);
        self.wake_blocking();
        Ok(())
    }

    /// Syncs the files; the queue refuses work afterwards. Nothing is cut: the space
    /// reserved ahead of the last segment's data (zeroes) is kept for the next run
    /// to append into, and opening recognises it at a glance (`segment::scan`). Cutting
    /// cost an `ftruncate` per queue, 0.1 s for 458 idle queues at shutdown.
    pub(crate) fn close(&self) -> Result<()> {
        let synced = self.sync_now();
        let mut state = self.state.lock();
        if state.closed || state.deleted {
            return synced;
        }
        state.closed = true;
        for r in state.readers.values() {
            r.notify.notify_waiters();
        }
        drop(state);
        self.wake_blocking();
        synced
    }
}
