//! Appending: a batch written all or nothing into the segment being written, the roll
//! to a new segment when it is full, the room made under `max_items`/`max_bytes`
//! (`make_room`, which may discard the oldest items), and the deletion of segments
//! every reader is done with (`reclaim`).

use std::sync::Arc;
use std::{fs, io};

use crate::error::{Error, Result};
use crate::frame::{
    decode_header, encode_header, encode_job, JOB_EXTENSION_BYTES, RECORD_HEADER_BYTES,
    RECORD_PAYLOAD_BYTES_MAX,
};
use crate::item::AppendOptions;
use crate::mapfile::STAGE_BYTES;
use crate::readers::Slot;
use crate::segment::FILE_HEADER_BYTES;

use super::commit::Ticket;
use super::expire::Move;
use super::idle::MarkActiveOnDrop;
use super::log::create_segment;
use super::purpose::Purpose;
use super::queue_core::QueueCore;
use super::state::State;

/// When every reader has confirmed everything and the segment being written is at
/// least this large, a new segment is started so the old one can be deleted: disk use
/// follows the backlog down instead of waiting for the segment to fill.
pub(super) const ROLL_WHEN_EMPTY_BYTES: u64 = 4 * 1024 * 1024;
// Rolling needs a segment with records in it (never an empty one).
const _: () = assert!(ROLL_WHEN_EMPTY_BYTES > FILE_HEADER_BYTES);

impl State {
    /// Starts a new segment at `next_seq`; the current one is sealed.
    pub(super) fn roll(&mut self) -> Result<()> {
        debug_assert!(
            self.log.writer.end() > FILE_HEADER_BYTES,
            "never roll an empty segment"
        );
        // What is staged belongs to the segment being sealed: written before the seal,
        // or the roll fails and it stays staged.
        self.log.flush_staged()?;
        let dir = self.dir().to_path_buf();
        let (segment, mut map) = create_segment(
            &dir,
            self.next_seq,
            self.config.segment_size_bytes,
            self.tally.clone(),
        )?;
        if let Err(e) = map.set_staging(self.staging_wanted()) {
            return Err(Error::io(format!("writing {}", map.path().display()), e));
        }
        let mut old = std::mem::replace(&mut self.log.writer, map);
        if let Some(last) = self.log.segments.back_mut() {
            last.end = old.end();
        }
        if let Err(e) = old.trim() {
            tracing::warn!(path = %old.path().display(), error = %e, "could not trim a sealed segment");
        }
        // Sealed segments are fsync'ed off the append path, by the next fsync of the
        // queue: a group commit (synced, or an append with `sync`), the periodic sync
        // (periodic), or an explicit sync or close (buffered: its contract is that an
        // OS crash may lose what was not synced, so nothing syncs it in the
        // background). Doing it here, inline, would write up to a whole segment to
        // disk inside one append.
        // The writer's own descriptor is kept until then: a write-back error is
        // reported to an fsync through a descriptor that was open when it happened,
        // and may be lost once none is (the inode can leave the cache).
        match old.file() {
            Ok(file) => self
                .unsynced
                .push((old.path().to_path_buf(), Arc::clone(file))),
            Err(e) => {
                tracing::error!(path = %old.path().display(), error = %e, "a sealed segment lost its descriptor before its fsync");
                self.poisoned = Some(format!("sealed segment without a descriptor: {e}"));
            }
        }
        self.log.segments.push_back(segment);
        self.dir_dirty = true;
        self.dirty = true;
        Ok(())
    }

    /// Deletes the segments every reader is done with.
    pub(super) fn reclaim(&mut self) {
        let keep = self.oldest_kept();
        if keep == self.next_seq
            && self.log.writer.end() >= ROLL_WHEN_EMPTY_BYTES
            && self.log.writer.end() > FILE_HEADER_BYTES
        {
            if let Err(e) = self.roll() {
                tracing::warn!(error = %e, "could not start a new segment for an empty queue");
            }
        }
        while self.log.segments.len() > 1 && self.log.segments[1].first_seq <= keep {
            let Some(seg) = self.log.segments.pop_front() else {
                break;
            };
            if self
                .floor_loc
                .is_some_and(|l| l.segment_first_seq == seg.first_seq)
            {
                self.floor_loc = None;
            }
            self.unsynced.retain(|(path, _)| *path != seg.path);
            if let Err(e) = fs::remove_file(&seg.path) {
                tracing::warn!(path = %seg.path.display(), error = %e, "could not delete a consumed segment");
            }
            // The deletion is made durable by the queue's next fsync.
            self.dir_dirty = true;
        }
    }

    /// Appends a batch, all or nothing: the room for every record is reserved before
    /// the first byte is written, all records but the last carry the "more" bit (so a
    /// crash in the middle is cut on recovery), and a batch never spans segments.
    pub(super) fn append_records(
        &mut self,
        items: &[&[u8]],
        options: &AppendOptions,
        now: u64,
    ) -> Result<u64> {
        let extension = if options.job.is_some() {
            JOB_EXTENSION_BYTES as u64
        } else {
            0
        };
        let total: u64 = items
            .iter()
            .map(|d| RECORD_HEADER_BYTES as u64 + extension + d.len() as u64)
            .sum();
        if self.log.writer.end() + total > self.config.segment_size_bytes
            && self.log.writer.end() > FILE_HEADER_BYTES
        {
            self.roll()?;
        }
        // Retries a switch of durability whose first attempt failed (see `set_config`):
        // never stage a `periodic` or `synced` append.
        self.apply_staging()?;
        if !self.reserve.as_ref().is_none_or(|r| r.appends_allowed()) {
            return Err(Error::io(
                format!("appending to {}", self.log.writer.path().display()),
                io::Error::from_raw_os_error(libc::ENOSPC),
            ));
        }
        if let Err(e) = self.log.writer.reserve(total) {
            return Err(Error::io(
                format!("appending to {}", self.log.writer.path().display()),
                e,
            ));
        }
        let batch_start = self.log.writer.end();
        let first = self.next_seq;
        let bytes = self.write_records(items, options, now)?;
        if self.log.writer.staged_len() > STAGE_BYTES {
            // A batch (or item) larger than the staging buffer was staged whole; write it
            // before the call returns, so a killed process never loses more than one
            // buffer. If that fails the batch never happened.
            if let Err(e) = self.log.writer.flush_staged() {
                self.log.writer.unstage_from(batch_start);
                return Err(Error::io(
                    format!("appending to {}", self.log.writer.path().display()),
                    e,
                ));
            }
        }
        if let Some(last) = self.log.segments.back_mut() {
            last.end = self.log.writer.end();
        }
        let count = items.len() as u64;
        assert!(
            count > 0 && self.next_seq == first,
            "next_seq only grows, by the batch"
        );
        self.next_seq += count;
        for r in self.readers.values_mut() {
            r.pending_bytes += bytes;
        }
        self.floor_bytes += bytes;
        self.total_appended += count;
        self.dirty = true;
        self.wrote = true;
        self.mapped = true;
        Ok(first)
    }

    /// Encodes the batch's records from `next_seq` on and writes them after the room
    /// `reserve` made for them; every record but the last carries the "more" bit.
    /// Returns the payload bytes written.
    fn write_records(&mut self, items: &[&[u8]], options: &AppendOptions, now: u64) -> Result<u64> {
        // The writer always writes the last segment.
        let seed = self.log.segments.back().map_or(0, |s| s.seed);
        let mut bytes = 0u64;
        for (i, data) in items.iter().enumerate() {
            let seq = self.next_seq + i as u64;
            let more = i + 1 < items.len();
            let mut header = [0u8; RECORD_HEADER_BYTES];
            let ext = options.job.as_ref().map(encode_job);
            let parts: &[&[u8]] = match &ext {
                Some(ext) => &[ext, data],
                None => &[data],
            };
            encode_header(
                &mut header,
                seed,
                seq,
                now,
                options.expires_at_ms,
                options.flags,
                more,
                ext.is_some(),
                parts,
            );
            let len: usize = parts.iter().map(|p| p.len()).sum();
            debug_assert_eq!(
                decode_header(&header).map(|h| (h.seq, h.len as usize)),
                Some((seq, len)),
                "a record's header decodes to what was encoded"
            );
            let appended = match &ext {
                Some(ext) => self.log.writer.append(&[&header, ext, data]),
                None => self.log.writer.append(&[&header, data]),
            };
            if let Err(e) = appended {
                // Unreachable after `reserve`; were it reached, the records written are
                // past `next_seq` and a crash cuts them (no last record of the batch).
                return Err(Error::io(
                    format!("appending to {}", self.log.writer.path().display()),
                    e,
                ));
            }
            bytes += len as u64;
        }
        Ok(bytes)
    }

    /// Makes room for `count` items of `bytes` under `max_items`/`max_bytes`.
    pub(super) fn make_room(
        &mut self,
        count: u64,
        bytes: u64,
        now: u64,
        moves: &mut Vec<Move>,
    ) -> Result<()> {
        let (max_items, max_bytes) = (self.config.max_items, self.config.max_bytes);
        if max_items == u64::MAX && max_bytes == u64::MAX {
            return Ok(());
        }
        let full = || Error::Full {
            queue: String::new(),
        };
        if count > max_items || bytes > max_bytes {
            return Err(full());
        }
        loop {
            let (items, held) = self.room_used();
            if items + count <= max_items && held + bytes <= max_bytes {
                return Ok(());
            }
            if !self.config.discard_old_when_full {
                return Err(full());
            }
            let mut progress = false;
            if self.readers.is_empty() {
                if self.advance_floor(false, now)? {
                    self.floor_discarded += 1;
                    progress = true;
                }
            } else {
                let behind: Vec<Slot> = self
                    .readers
                    .slots()
                    .filter(|&slot| {
                        let (items, held) = self.readers.at(slot).room_used(self.next_seq);
                        items + count > max_items || held + bytes > max_bytes
                    })
                    .collect();
                for slot in behind {
                    self.expired_budget_spent = false;
                    let expired_before = self.readers.at(slot).expired;
                    // Dropping (or moving) expired items on the way makes room too, even
                    // when no unexpired item follows them.
                    if self
                        .take_inner(slot, Purpose::Discard, now, moves, None)?
                        .is_some()
                        || self.readers.at(slot).expired != expired_before
                    {
                        progress = true;
                    }
                }
            }
            self.reclaim();
            if !progress {
                return Err(full());
            }
        }
    }

    /// [`State::most_behind`], less the items being moved to `expire_to`: what
    /// `max_items` and `max_bytes` are checked against.
    pub(super) fn room_used(&self) -> (u64, u64) {
        if self.readers.is_empty() {
            return (self.next_seq - self.floor, self.floor_bytes);
        }
        let mut items = 0;
        let mut bytes = 0;
        for r in self.readers.values() {
            let (i, b) = r.room_used(self.next_seq);
            items = items.max(i);
            bytes = bytes.max(b);
        }
        (items, bytes)
    }

    /// The most-behind reader's (items, bytes); the queue's own when it has no reader.
    pub(super) fn most_behind(&self) -> (u64, u64) {
        if self.readers.is_empty() {
            return (self.next_seq - self.floor, self.floor_bytes);
        }
        let mut items = 0;
        let mut bytes = 0;
        for r in self.readers.values() {
            items = items.max(r.pending_items(self.next_seq));
            bytes = bytes.max(r.pending_bytes);
        }
        (items, bytes)
    }
}

impl QueueCore {
    pub(crate) fn append_batch(
        &self,
        items: &[&[u8]],
        options: AppendOptions,
    ) -> Result<(u64, Option<Ticket>)> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        if items.is_empty() {
            return Err(Error::InvalidArgument(
                "an append needs at least one item".into(),
            ));
        }
        if options.job.is_some() && items.len() > 1 {
            return Err(Error::InvalidArgument(
                "a job is appended one at a time (each has an id of its own)".into(),
            ));
        }
        let now = self.clock.now_ms();
        let mut moves = Vec::new();
        // A closure, so that every way out (a refusal after `make_room` met expired
        // items, an I/O error) still reaches `move_expired` below: the items it holds
        // for moving would otherwise stay held, neither moved nor delivered, until a
        // restart.
        let result = (|| {
            let mut state = self.state.lock();
            state.ready()?;
            // A job's extension counts against the format's bound, not the queue's.
            let extension = options.job.map_or(0, |_| JOB_EXTENSION_BYTES as u64);
            let max = state
                .config
                .max_item_size_bytes
                .min(RECORD_PAYLOAD_BYTES_MAX - extension);
            let mut bytes = 0u64;
            for data in items {
                if data.len() as u64 > max {
                    return Err(Error::TooLarge {
                        size_bytes: data.len() as u64,
                        size_bytes_max: max,
                    });
                }
                bytes += data.len() as u64;
            }
            match state.make_room(items.len() as u64, bytes, now, &mut moves) {
                Ok(()) => {}
                Err(Error::Full { .. }) => {
                    return Err(Error::Full {
                        queue: self.name.clone(),
                    })
                }
                Err(e) => return Err(e),
            }
            let first = state.append_records(items, &options, now)?;
            self.wake_all_readers(&state, items.len() as u64);
            state.maybe_rotate_journal();
            let last = state.next_seq - 1;
            Ok((first, state.ticket(options.sync, last, !moves.is_empty())))
        })();
        let moved = self.move_expired(moves);
        let (first, ticket) = result?;
        Ok((first, Ticket::covering(ticket, moved)))
    }
}
