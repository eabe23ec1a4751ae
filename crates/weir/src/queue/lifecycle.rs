//! A queue's configuration, the creation and deletion of its readers, flushing, and
//! the end of the queue: deleted (`retire`) or closed with the store.

use std::fs;
use std::path::Path;

use crate::config::QueueConfig;
use crate::error::{Error, Result};
use crate::journal::JournalRecord;
use crate::name::validate_reader_name;

use super::idle::MarkActiveOnDrop;
use super::queue_core::QueueCore;

impl QueueCore {
    pub(crate) fn config(&self) -> QueueConfig {
        self.state.lock().config.clone()
    }

    /// `config().priority_default` without the copy (the jobs' hot path asks it).
    pub(crate) fn priority_default(&self) -> u32 {
        self.state.lock().config.priority_default
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
