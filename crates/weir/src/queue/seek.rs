//! Moving a reader to a chosen seq (replay, or skipping ahead), and finding the seq of
//! an enqueue time, without a per-item index in memory.
//!
//! A seek restates the reader in the journal (`ReaderCreate` with its own id and the
//! new `acked_below`), which recovery already applies as "this reader now stands here,
//! nothing confirmed above": no new record kind, so older binaries read journals
//! written by this one. The reader's leases end with the seek (a later confirm of one
//! says the lease is unknown), as a flush of the reader does.
//!
//! Finding a seq by time reads the first record of segments to pick the one segment
//! that holds it (a binary search: enqueue times grow with seqs, as the clock does),
//! then scans that segment's headers, outside the queue's lock so appends go on.

use std::sync::Arc;

use super::idle::MarkActiveOnDrop;
use super::queue_core::QueueCore;
use super::state::State;
use crate::error::io_err;
use crate::error::{Error, Result};
use crate::journal::JournalRecord;
use crate::segment::{self, Loc, FILE_HEADER_BYTES};

/// The seqs a reader can be moved to: `(oldest, next)`, the oldest item still on
/// disk and not dropped for every reader, and the seq the next append gets.
pub(super) fn seek_bounds(state: &State) -> (u64, u64) {
    let on_disk = state
        .log
        .segments
        .front()
        .map_or(state.next_seq, |s| s.first_seq);
    let oldest = on_disk.max(state.floor).min(state.next_seq);
    (oldest, state.next_seq)
}

impl State {
    /// Moves reader `name` to `seq` (clamped to [`seek_bounds`]): every item from
    /// there on is pending for it again, and none before. Returns where it stands.
    fn seek_reader(&mut self, name: &str, seq: u64) -> Result<u64> {
        self.usable_reader(name)?;
        self.log.flush_staged()?;
        let (oldest, next_seq) = seek_bounds(self);
        let target = seq.clamp(oldest, next_seq);
        let cursor = self
            .log
            .locate(next_seq, target)
            .map_err(io_err(|| "locating a reader's new position".into()))?;
        let pending_bytes = self.log.span_payload_bytes(cursor, next_seq - target);
        let Some((id, name_owned)) = self.readers.get(name).map(|r| (r.id, name.to_string()))
        else {
            return Ok(target);
        };
        self.journal_append(JournalRecord::ReaderCreate {
            id,
            acked_below: target,
            name: name_owned,
        })?;
        let Some(r) = self.readers.get_mut(name) else {
            return Ok(target);
        };
        r.acked_below = target;
        r.confirmed.clear();
        r.leases.clear();
        r.expire_moves = 0;
        r.expire_moves_bytes = 0;
        r.released.clear();
        r.forget_returns();
        r.cursor_seq = target;
        r.cursor = cursor;
        r.pending_bytes = pending_bytes;
        r.read_buf.clear();
        r.oldest_enqueued = None;
        r.head_expiry = None;
        r.check(next_seq);
        // Skipping ahead may have freed segments; going back frees none.
        self.reclaim();
        Ok(target)
    }
}

impl QueueCore {
    /// See [`crate::Reader::seek`].
    pub(crate) fn seek(&self, reader: &str, seq: u64) -> Result<u64> {
        self.seek_locked(reader, seq, true)?
            .ok_or_else(|| Error::NotFound {
                what: format!("reader {reader:?}"),
            })
    }

    /// See [`crate::Queue::seek_reader`]: the look for the reader and its move are
    /// one hold of the lock, so a reader deleted a moment before is not made again.
    pub(crate) fn seek_existing(&self, reader: &str, seq: u64) -> Result<Option<u64>> {
        self.seek_locked(reader, seq, false)
    }

    /// Moves `reader` to `seq`; when it does not exist, makes it first (`create`)
    /// or answers `None`.
    fn seek_locked(&self, reader: &str, seq: u64, create: bool) -> Result<Option<u64>> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let mut state = self.state.lock();
        if !create && !state.readers.contains_key(reader) {
            return Ok(None);
        }
        let target = state.seek_reader(reader, seq)?;
        if let Some(r) = state.readers.get(reader) {
            self.wake_reader(r);
        }
        // Under `synced`, durable when this returns, like every journaled operation.
        let ticket = state.after_journal_write();
        drop(state);
        self.wait_durable(ticket)?;
        Ok(Some(target))
    }

    /// See [`crate::Queue::reader_at_end`]: the reader's creation and its move to
    /// the end under one hold of the lock, so no append lands between them and two
    /// callers cannot both move it (the second finds it made and leaves it).
    pub(crate) fn ensure_reader_at_end(&self, reader: &str) -> Result<()> {
        let _active = MarkActiveOnDrop(self);
        let mut state = self.state.lock();
        state.ready()?;
        if state.readers.contains_key(reader) {
            return Ok(());
        }
        crate::name::validate_reader_name(reader)?;
        state.create_reader(reader, true)?;
        // The items before it may now be kept for no reader.
        state.reclaim();
        let ticket = state.after_journal_write();
        drop(state);
        self.wait_durable(ticket)
    }

    /// See [`crate::Queue::seq_bounds`].
    pub(crate) fn seq_bounds(&self) -> Result<(u64, u64)> {
        // Not `ready`: the bounds are in memory, and a look at them (the bus's
        // retention janitor, every second for every topic) must not keep an idle
        // queue's files open.
        let state = self.state.lock();
        state.check_usable()?;
        Ok(seek_bounds(&state))
    }

    /// See [`crate::Queue::seq_at_time`].
    pub(crate) fn seq_at_time(&self, at_ms: u64) -> Result<u64> {
        let _active = MarkActiveOnDrop(self);
        // Under the lock: pick the segment (one header read per step of the binary
        // search) and take what scanning it needs; the scan itself runs unlocked.
        let (file, first_seq, seed, limit, after) = {
            let mut state = self.state.lock();
            state.ready()?;
            state.log.flush_staged()?;
            let (oldest, next_seq) = seek_bounds(&state);
            let log = &state.log;
            let first_time = |i: usize| {
                let loc = Loc {
                    segment_first_seq: log.segments[i].first_seq,
                    off: FILE_HEADER_BYTES,
                };
                // An unreadable first record counts as early: the scan decides.
                log.header_at(loc).map_or(0, |h| h.enqueued_at_ms)
            };
            // Segments whose first item is older than `at_ms`: the answer lies in the
            // last of them, or at the start of the one after it.
            let before = partition_point(log.segments.len(), |i| first_time(i) < at_ms);
            if before == 0 {
                return Ok(oldest);
            }
            let i = before - 1;
            let after = log.segments.get(before).map_or(next_seq, |s| s.first_seq);
            let file = Arc::clone(
                log.file(i)
                    .map_err(io_err(|| "opening a segment to find a time".into()))?,
            );
            let seg = &log.segments[i];
            (
                file,
                seg.first_seq,
                seg.seed,
                log.data_end(i),
                after.max(oldest),
            )
        };
        let (_, found) =
            segment::locate_first(&file, first_seq, seed, limit, |h| h.enqueued_at_ms >= at_ms)
                .map_err(io_err(|| "scanning a segment for a time".into()))?;
        let (oldest, next_seq) = self.seq_bounds()?;
        Ok(found.unwrap_or(after).clamp(oldest, next_seq))
    }
}

/// The first index in `0..len` for which `pred` is false, `pred` being true then false
/// along the range (as `slice::partition_point`, over indexes).
fn partition_point(len: usize, pred: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, len);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::partition_point;

    #[test]
    fn partition_point_finds_the_first_false() {
        let v = [1, 3, 5, 7, 9];
        for x in 0..11 {
            let want = v.partition_point(|&e| e < x);
            assert_eq!(partition_point(v.len(), |i| v[i] < x), want, "x = {x}");
        }
        assert_eq!(partition_point(0, |_| true), 0);
    }
}
