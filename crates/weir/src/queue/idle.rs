//! Idle queues cost nothing: the background thread's `tick` (staged appends written,
//! mapping windows given back, lease timeouts, periodic fsync), files closed after
//! [`IDLE_CLOSE`] unused or past the store's descriptor budget, and the list of active
//! queues the background thread visits (a queue comes off it when it has nothing
//! left to do, and back on at its next operation).

use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::config::Durability;
use crate::error::{Error, Result};
use crate::segment::{Loc, Segment};

use super::queue_core::QueueCore;
use super::state::State;

/// A queue not written for this long gives back its mapping windows (their RSS); the
/// next write maps again. Bounds the memory of many idle queues.
pub(super) const IDLE_UNMAP: std::time::Duration = std::time::Duration::from_secs(2);

/// In `buffered` mode, appends staged in memory (see `mapfile.rs`) are written to the
/// file once the oldest has waited this long, if the buffer has not filled first: the
/// bound on what a killed process can lose, besides a buffer's worth.
pub(crate) const BUFFERED_STAGE_MS_MAX: u64 = 50;

/// A queue not used for this long closes its files (segments, journal), so that
/// thousands of idle queues hold no descriptors; the next operation opens them again
/// (two `open`s and, for a write, a new mapping window).
pub(super) const IDLE_CLOSE: std::time::Duration = std::time::Duration::from_secs(10);

/// Calls [`QueueCore::mark_active`] when dropped: at the end of an operation, after
/// the state lock (declared first, so dropped last).
pub(super) struct MarkActiveOnDrop<'a>(pub(super) &'a QueueCore);

impl Drop for MarkActiveOnDrop<'_> {
    fn drop(&mut self) {
        self.0.mark_active();
        // An operation that reopened files may have put the store over its budget;
        // the background thread would notice within a tick, but a loop over
        // thousands of idle queues reopens them faster than that.
        if self.0.budget.as_ref().is_some_and(|b| b.over()) {
            if let Some(store) = self.0.store.upgrade() {
                store.enforce_files_budget(false);
            }
        }
    }
}

impl State {
    /// Whether the queue holds any descriptor now.
    pub(super) fn any_file_open(&self) -> bool {
        self.log.writer.is_open()
            || self.journal.is_open()
            || self.log.segments.iter().any(Segment::is_open)
    }

    /// Closes every descriptor the queue holds, so that an idle queue costs none; the
    /// next operation opens them again ([`State::ready`]). What `stats` would read from
    /// the files is read first. Staged bytes are written first; if that fails nothing
    /// is closed. Returns whether anything was open.
    pub(super) fn close_files(&mut self) -> Result<bool> {
        if !self.any_file_open() || self.unsynced_writes() {
            // Written and not fsync'ed: the descriptors stay until the fsync, since a
            // write-back error is reported only through a descriptor that was open
            // when it happened (see `roll`). `tick` syncs an idle queue first.
            return Ok(false);
        }
        let next_seq = self.next_seq;
        // Read only where the oldest item moved since the last close: a queue closed
        // and reopened by a whole-store command reads nothing here.
        let enqueued = |loc: Option<Loc>, kept: Option<(Loc, u64)>| {
            let loc = loc?;
            match kept {
                Some((at, ms)) if at == loc => Some((loc, ms)),
                _ => self.log.header_at(loc).map(|h| (loc, h.enqueued_at_ms)),
            }
        };
        let floor = enqueued(
            self.floor_loc.filter(|_| self.floor < next_seq),
            self.floor_oldest,
        );
        let oldest: Vec<Option<(Loc, u64)>> = self
            .readers
            .values()
            .map(|r| enqueued(r.oldest_loc(next_seq), r.oldest_enqueued))
            .collect();
        let dir = self.dir().to_path_buf();
        let err = |e| Error::io(format!("closing the files of {}", dir.display()), e);
        self.log.writer.close().map_err(err)?;
        self.journal.close().map_err(err)?;
        for seg in self.log.segments.iter_mut() {
            seg.close_file();
        }
        self.mapped = false;
        self.floor_oldest = floor;
        for (r, t) in self.readers.values_mut().zip(oldest) {
            r.oldest_enqueued = t;
            r.read_buf.clear();
        }
        self.floor_read_buf.clear();
        Ok(true)
    }

    /// Gives back the mapping windows of a queue not written for [`IDLE_UNMAP`].
    pub(super) fn tick_unmap(&mut self, now: Instant, queue: &str) {
        if std::mem::take(&mut self.wrote) {
            self.last_write = now;
        } else if self.mapped && now.duration_since(self.last_write) >= IDLE_UNMAP {
            match self.log.writer.unmap() {
                Ok(()) => {
                    self.journal.unmap();
                    self.mapped = false;
                }
                Err(e) => {
                    tracing::error!(queue, error = %e, "could not write staged appends; they stay staged and are tried again");
                }
            }
        }
    }

    /// Writes staged appends (`buffered`) once the oldest has waited
    /// [`BUFFERED_STAGE_MS_MAX`], and retries a durability switch whose first attempt
    /// failed (`set_config`).
    pub(super) fn tick_staged(&mut self, now: Instant, queue: &str) {
        if let Err(e) = self.apply_staging() {
            tracing::error!(queue, error = %e, "could not write staged appends; they stay staged and are tried again");
        }
        let waited = self
            .log
            .writer
            .staged_since()
            .is_some_and(|t| now.duration_since(t).as_millis() as u64 >= BUFFERED_STAGE_MS_MAX);
        if waited {
            if let Err(e) = self.log.flush_staged() {
                tracing::error!(queue, error = %e, "could not write staged appends; they stay staged and are tried again");
            }
        }
    }

    /// Closes the files of a queue unused for [`IDLE_CLOSE`], and in a queue in use
    /// the sealed segments nobody reads. Returns whether an fsync must come first
    /// (an idle `buffered` queue with writes not synced: see `close_files`).
    pub(super) fn tick_close(&mut self, now: Instant, queue: &str) -> bool {
        if std::mem::take(&mut self.used) {
            self.last_used = now;
        }
        if !self.any_file_open() {
            return false;
        }
        if now.duration_since(self.last_used) < IDLE_CLOSE {
            self.close_unused_segments();
            return false;
        }
        if self.unsynced_writes() {
            return true;
        }
        if let Err(e) = self.close_files() {
            tracing::error!(queue, error = %e, "could not close the files of an idle queue");
        }
        false
    }

    /// Whether the background thread must come back (see [`QueueCore::tick`]).
    pub(super) fn needs_tick(&self) -> bool {
        let periodic = matches!(self.config.durability, Durability::Periodic(_));
        let sync_pending =
            self.dirty || self.created_unsynced || self.dir_dirty || self.reader_list_dirty;
        self.any_file_open()
            || self.mapped
            || self.log.writer.staged_len() > 0
            || self.log.writer.staging_differs(self.staging_wanted())
            || (periodic && sync_pending)
            || ((self.config.open_timeout.is_some() || self.lease_deadlines)
                && self
                    .readers
                    .values()
                    .any(|r| r.leases.len() as u64 > r.expire_moves))
    }

    /// Closes the descriptors of sealed segments that no reader's cursor (nor the
    /// floor) is in; a lease or a released item in one opens it again when read.
    /// Runs every tick of a queue in use, so it allocates nothing and looks only at
    /// sealed segments still open: a queue with one segment (most) costs a length
    /// check, whatever its number of readers.
    pub(super) fn close_unused_segments(&mut self) {
        let last = self.log.segments.len().saturating_sub(1);
        let floor = self.floor_loc.map(|l| l.segment_first_seq);
        let readers = &self.readers;
        for seg in self.log.segments.iter_mut().take(last) {
            if !seg.is_open() {
                continue;
            }
            let first = seg.first_seq;
            let in_use = floor == Some(first)
                || readers
                    .values()
                    .any(|r| r.cursor.segment_first_seq == first);
            if !in_use {
                seg.close_file();
            }
        }
    }
}

impl QueueCore {
    /// Writes what the segment writer has staged (`buffered`) to the file.
    pub(super) fn write_staged(&self) -> Result<()> {
        self.state.lock().log.flush_staged()
    }

    /// Periodic work, from the store's background thread: unmap idle windows, write
    /// staged appends that waited long enough, release timed-out leases, close the
    /// files of a queue idle for [`IDLE_CLOSE`], fsync when the interval has passed.
    /// Returns whether the queue needs more of it later: a queue that is idle, closed
    /// and synced drops off the background thread's list until its next operation
    /// ([`QueueCore::mark_active`]), so thousands of idle queues cost it nothing.
    pub(crate) fn tick(&self, now: Instant) -> bool {
        #[cfg(feature = "fault-injection")]
        crate::fault::ticked(&self.dir);
        let (sync_due, needs) = {
            let mut state = self.state.lock();
            if state.closed || state.deleted {
                return false;
            }
            state.tick_unmap(now, &self.name);
            state.tick_staged(now, &self.name);
            // Past the start of a shutdown, timed-out leases stay out too (see
            // `Store::begin_shutdown`).
            if !self.is_shutting_down() {
                let lease_now = state.clock.instant_or(|| now);
                for name in state.tick_leases(lease_now) {
                    if let Some(r) = state.readers.get(&name) {
                        self.wake_reader(r);
                    }
                }
            }
            let sync_to_close = state.tick_close(now, &self.name);
            let sync_due = sync_to_close
                || match state.config.durability {
                    Durability::Periodic(interval) => {
                        state.dirty && now.duration_since(state.last_sync) >= interval
                    }
                    _ => false,
                };
            (sync_due, state.needs_tick())
        };
        if sync_due {
            if let Err(e) = self.sync_now() {
                tracing::error!(queue = %self.name, error = %e, "periodic fsync failed");
            }
        }
        needs
    }

    /// Puts the queue on the store's list of queues its background thread visits,
    /// unless it is there: called after every operation, since most leave work for
    /// later (an fsync due, a window to unmap, files to close, a lease to time out).
    /// One relaxed load when the queue is on the list already, which is the common
    /// case. (See `tick` for why a load ordered only by the state lock suffices.)
    pub(crate) fn mark_active(&self) {
        if self.active.load(Ordering::Relaxed) {
            return;
        }
        if !self.active.swap(true, Ordering::SeqCst) {
            if let (Some(store), Some(me)) = (self.store.upgrade(), self.me.upgrade()) {
                store.activate(me);
            }
        }
    }

    /// Called by the background thread before it ticks the queue, which it has just
    /// taken off its list: a `mark_active` from now on puts it back. Clearing the flag
    /// before the tick looks at the state (under the state lock, which every operation
    /// takes before its `mark_active`) means no operation can slip between the two
    /// unseen.
    pub(crate) fn clear_active(&self) {
        self.active.store(false, Ordering::SeqCst);
    }

    /// Closes the queue's files now, if open (the store is over its descriptor budget
    /// and this queue was used least recently). True when it closed anything; false
    /// too when the queue is busy right now (which makes it no candidate): this never
    /// waits for a queue's lock, so it can run at the end of any operation.
    pub(crate) fn close_files(&self) -> bool {
        let Some(mut state) = self.state.try_lock() else {
            return false;
        };
        if state.closed || state.deleted {
            return false;
        }
        match state.close_files() {
            Ok(closed) => closed,
            Err(e) => {
                tracing::error!(queue = %self.name, error = %e, "could not close the files of a queue");
                false
            }
        }
    }

    /// When the queue was last used, for the descriptor budget's choice; `None` when it
    /// is busy right now (in use: no candidate). Never waits, see `close_files`.
    pub(crate) fn last_used(&self) -> Option<Instant> {
        // Used since the background thread last looked: as good as now.
        let now = Instant::now();
        self.state
            .try_lock()
            .map(|state| if state.used { now } else { state.last_used })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failure is a panic

    use std::time::{Duration, Instant};

    use super::IDLE_CLOSE;
    use crate::{AppendOptions, Store};

    /// Looking at a queue's bounds (the bus's janitor does, every second for every
    /// topic) is not a use: the queue still closes its files once idle. Before, the
    /// look kept them open for as long as it was repeated.
    #[test]
    fn a_look_at_the_bounds_does_not_keep_files_open() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let queue = store.queue("q").unwrap();
        let seq = queue.append(b"one", AppendOptions::default()).unwrap();
        let core = &queue.core;
        let t0 = Instant::now();
        core.tick(t0);
        assert!(core.state.lock().any_file_open());
        let step = IDLE_CLOSE / 4;
        for i in 1..=8u32 {
            assert_eq!(queue.seq_bounds().unwrap().1, seq + 1);
            // The first idle tick may fsync before it closes: tick twice.
            core.tick(t0 + step * i);
            core.tick(t0 + step * i + Duration::from_millis(1));
        }
        assert!(
            !core.state.lock().any_file_open(),
            "files closed after {:?} with only looks at the bounds",
            step * 8
        );
        store.close().unwrap();
    }
}
