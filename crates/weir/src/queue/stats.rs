//! Statistics of a queue and its readers, answered from memory (an idle queue's files
//! stay closed), and the iterator over its kept items.

use std::sync::atomic::Ordering;

use super::iter::{Iter, IterSegment};
use crate::error::Result;
use crate::segment::Loc;
use crate::stats::{QueueStats, ReaderStats};

use super::idle::MarkActiveOnDrop;
use super::queue_core::QueueCore;
use crate::error::io_err;

impl QueueCore {
    pub(crate) fn stats(&self) -> QueueStats {
        let state = self.state.lock();
        let now = self.clock.now_ms();
        // An idle queue's files are closed: its ages were read before they were, and
        // a whole-store `stats` reopens nothing.
        // Every change to what `stats` reports here reads or writes a file (opening it),
        // so while none is open the ages kept at the last close are current.
        let open = state.any_file_open();
        let age_at = |loc: Loc| {
            state
                .log
                .header_at(loc)
                .map_or(0, |h| now.saturating_sub(h.enqueued_at_ms))
        };
        let mut readers = Vec::with_capacity(state.readers.len());
        for (name, r) in state.readers.iter() {
            let age_ms = if open {
                r.oldest_loc(state.next_seq).map_or(0, age_at)
            } else {
                r.oldest_enqueued.map_or(0, |(_, t)| now.saturating_sub(t))
            };
            readers.push(ReaderStats {
                name: name.clone(),
                items: r.pending_items(state.next_seq),
                bytes: r.pending_bytes,
                taken: r.taken,
                confirmed: r.confirmed_total,
                expired: r.expired,
                dead_lettered: r.dead_lettered,
                discarded: r.discarded,
                open_leases: (r.leases.len() as u64).saturating_sub(r.expire_moves),
                waiters: r.waiters.load(Ordering::SeqCst),
                age_ms,
            });
        }
        readers.sort_by(|a, b| a.name.cmp(&b.name));
        let (items, bytes) = state.most_behind();
        let age_ms = if state.readers.is_empty() {
            if state.floor >= state.next_seq {
                0
            } else if open {
                state.floor_loc.map_or(0, age_at)
            } else {
                state.floor_oldest.map_or(0, |(_, t)| now.saturating_sub(t))
            }
        } else {
            readers.iter().map(|r| r.age_ms).max().unwrap_or(0)
        };
        let disk_bytes = state.log.disk_bytes() + state.journal.size_bytes();
        QueueStats {
            name: self.name.clone(),
            items,
            bytes,
            total_items: state.total_appended,
            expired: readers.iter().map(|r| r.expired).sum::<u64>() + state.floor_expired,
            dead_lettered: readers.iter().map(|r| r.dead_lettered).sum(),
            discarded: readers.iter().map(|r| r.discarded).sum::<u64>() + state.floor_discarded,
            open_leases: readers.iter().map(|r| r.open_leases).sum(),
            waiters: readers.iter().map(|r| r.waiters).sum(),
            age_ms,
            disk_bytes,
            corrupt_records: state.corrupt_records,
            readers,
        }
    }

    pub(crate) fn iter(&self) -> Result<Iter> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let mut state = self.state.lock();
        state.ready()?;
        // The iterator reads the files, outside the lock.
        state.log.flush_staged()?;
        let start = state.oldest_kept();
        let loc = state
            .log
            .locate(state.next_seq, start)
            .map_err(io_err(|| "locating the oldest item".into()))?;
        let n = state.log.segments.len();
        let segments = state
            .log
            .segments
            .iter()
            .enumerate()
            .filter(|(_, s)| s.first_seq >= loc.segment_first_seq)
            .map(|(i, s)| IterSegment {
                first_seq: s.first_seq,
                seed: s.seed,
                path: s.path.clone(),
                file: if i + 1 == n {
                    state.log.writer.file().ok().cloned()
                } else {
                    s.file_if_open().cloned()
                },
                end: if i + 1 == n {
                    state.log.writer.end()
                } else {
                    s.end
                },
            })
            .collect();
        Ok(Iter::new(
            segments,
            loc.off,
            start,
            state.next_seq,
            self.clock.now_ms(),
            state.config.max_age,
        ))
    }
}
