//! Taking: a reader's next item (a released one first, else the one at its cursor,
//! stepping over segment ends, damage and items confirmed out of order), consumed
//! as a take, a lease, a peek, a discard or an expiry.

use std::time::Instant;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::frame::RecordHeader;
use crate::item::{now_ms, Item, LeaseId, TakeMode, Taken};
use crate::journal::JRecord;
use crate::segment::{self, Loc, FILE_HEADER_BYTES};

use super::commit::Ticket;
use super::expire::{expiry_ms, is_expired, Move, EXPIRED_PER_CALL_MAX};
use super::idle::MarkActiveOnDrop;
use super::log::{locate_in, read_at, seg_file, seg_index, ReadAt};
use super::reader_state::{LeaseInfo, ReaderState};
use super::state::State;
use super::{io_err, QueueCore};

/// What a reader's next item is and where it comes from.
pub(super) struct Candidate {
    pub(super) header: RecordHeader,
    pub(super) data: Bytes,
    pub(super) loc: Loc,
    /// Where the cursor goes when this item is consumed; `None` for a released item.
    pub(super) next_cursor: Option<Loc>,
}

impl Candidate {
    /// The item, its payload moved out: a clone of a fresh `Bytes` would make it shared
    /// (an allocation) only to drop one of the two handles at once.
    pub(super) fn into_item(self) -> Item {
        Item {
            seq: self.header.seq,
            data: self.data,
            flags: self.header.flags,
            enqueued_at_ms: self.header.enqueued_at_ms,
            expires_at_ms: self.header.expires_at_ms,
        }
    }

    pub(super) fn item(&self) -> Item {
        Item {
            seq: self.header.seq,
            data: self.data.clone(),
            flags: self.header.flags,
            enqueued_at_ms: self.header.enqueued_at_ms,
            expires_at_ms: self.header.expires_at_ms,
        }
    }
}

/// What a take is for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Purpose {
    Take,
    Lease,
    Peek,
    /// Drop the oldest item to make room.
    Discard,
    /// Drop the next item only if it has expired.
    ExpireHead,
}

impl State {
    /// Counts `[from, to)` as lost to damage for reader `name`.
    pub(super) fn lose(&mut self, name: &str, from: u64, to: u64) -> Result<()> {
        let Some(id) = self.readers.get(name).map(|r| r.id) else {
            return Ok(());
        };
        if from >= to {
            return Ok(());
        }
        tracing::error!(dir = %self.dir().display(), reader = name, from, to, "items lost (damaged, or not on disk at a crash) are skipped");
        self.journal_append(JRecord::Confirm { id, from, to })?;
        self.corrupt_records += to - from;
        if let Some(r) = self.readers.get_mut(name) {
            r.confirm_mem(from, to, 0);
        }
        Ok(())
    }

    /// Finds the reader's next item: a released one first, else the one at its cursor.
    /// Moves the cursor over what it must (items confirmed out of order, segment ends,
    /// damage), but consumes nothing.
    pub(super) fn next_candidate(&mut self, name: &str) -> Result<Option<Candidate>> {
        let not_found = || Error::NotFound {
            what: format!("reader {name:?}"),
        };
        loop {
            let next_seq = self.next_seq;
            let State {
                segments,
                writer,
                readers,
                ..
            } = self;
            let r = readers.get_mut(name).ok_or_else(not_found)?;
            if let Some((&seq, &(loc, len))) = r.released.iter().next() {
                let read = read_at(segments, writer, &mut r.rb, loc)
                    .map_err(io_err(|| "reading a released item".into()))?;
                if let ReadAt::Rec(h, data) = read {
                    if h.seq == seq {
                        return Ok(Some(Candidate {
                            header: h,
                            data,
                            loc,
                            next_cursor: None,
                        }));
                    }
                }
                r.released.remove(&seq);
                r.pending_bytes = r.pending_bytes.saturating_sub(len as u64);
                self.lose(name, seq, seq + 1)?;
                continue;
            }
            if r.cursor_seq >= next_seq {
                return Ok(None);
            }
            let cursor = r.cursor;
            let read = read_at(segments, writer, &mut r.rb, cursor)
                .map_err(io_err(|| format!("reading segment {}", cursor.seg)))?;
            match read {
                ReadAt::Rec(h, data) if h.seq >= r.cursor_seq => {
                    if h.seq > r.cursor_seq {
                        let from = r.cursor_seq;
                        self.lose(name, from, h.seq)?;
                        let r = self.readers.get_mut(name).ok_or_else(not_found)?;
                        r.cursor_seq = h.seq;
                    }
                    let r = self.readers.get_mut(name).ok_or_else(not_found)?;
                    let next = Loc {
                        seg: cursor.seg,
                        off: cursor.off + h.record_bytes(),
                    };
                    // After a reopen the cursor starts at the oldest unconfirmed item;
                    // items confirmed out of order before the restart are skipped here.
                    if h.seq < r.acked_below || r.confirmed.contains(h.seq) {
                        // Counted in the estimate of `pending_bytes` made at open.
                        r.pending_bytes = r.pending_bytes.saturating_sub(h.len as u64);
                        r.cursor = next;
                        r.cursor_seq = h.seq + 1;
                        continue;
                    }
                    return Ok(Some(Candidate {
                        header: h,
                        data,
                        loc: cursor,
                        next_cursor: Some(next),
                    }));
                }
                ReadAt::End => {
                    let i = seg_index(segments, cursor.seg).unwrap_or(0);
                    if i + 1 >= segments.len() {
                        // The cursor is at the end of what was written but behind
                        // next_seq: the items between were lost.
                        let from = r.cursor_seq;
                        self.lose(name, from, next_seq)?;
                        let r = self.readers.get_mut(name).ok_or_else(not_found)?;
                        r.cursor_seq = next_seq;
                        continue;
                    }
                    let first = segments[i + 1].first_seq;
                    r.cursor = Loc {
                        seg: first,
                        off: FILE_HEADER_BYTES,
                    };
                    if first > r.cursor_seq {
                        let from = r.cursor_seq;
                        self.lose(name, from, first)?;
                        let r = self.readers.get_mut(name).ok_or_else(not_found)?;
                        r.cursor_seq = r.cursor_seq.max(first);
                    }
                }
                ReadAt::Rec(..) | ReadAt::Bad => {
                    let i = seg_index(segments, cursor.seg).unwrap_or(0);
                    let seg = &segments[i];
                    let active = i + 1 == segments.len();
                    if active {
                        // The scan below reads the file: staged bytes must be in it.
                        writer
                            .flush_staged()
                            .map_err(io_err(|| format!("writing {}", seg.path.display())))?;
                    }
                    let limit = if active { writer.end() } else { seg.end };
                    let seq_max = if active {
                        next_seq - 1
                    } else {
                        segments[i + 1].first_seq.saturating_sub(1)
                    };
                    let file = seg_file(segments, writer, i)
                        .map_err(io_err(|| format!("opening {}", seg.path.display())))?;
                    let found = segment::resync(
                        file,
                        seg.seed,
                        cursor.off + 1,
                        limit,
                        r.cursor_seq,
                        seq_max,
                    )
                    .map_err(io_err(|| format!("reading segment {}", seg.path.display())))?;
                    tracing::error!(path = %seg.path.display(), offset = cursor.off, "damaged record; skipping to the next valid one");
                    r.rb.clear();
                    // The items skipped are counted by `lose` once the cursor lands.
                    r.cursor.off = match found {
                        Some((at, _)) => at,
                        None => limit,
                    };
                }
                ReadAt::Missing => {
                    // Its segment was deleted because every seq in it is confirmed.
                    r.cursor_seq = r.cursor_seq.max(r.acked_below);
                    let seq = r.cursor_seq;
                    writer
                        .flush_staged()
                        .map_err(io_err(|| format!("writing {}", writer.path().display())))?;
                    let loc = locate_in(segments, writer, next_seq, seq)
                        .map_err(io_err(|| "locating a reader".into()))?;
                    r.cursor = loc;
                    r.rb.clear();
                }
            }
        }
    }

    /// Takes (or leases, peeks, discards, expires) the reader's next item.
    pub(super) fn take_inner(
        &mut self,
        name: &str,
        purpose: Purpose,
        now: u64,
        moves: &mut Vec<Move>,
    ) -> Result<Option<Taken>> {
        // Expired items at the head are dropped as they are met, but at most
        // `EXPIRED_PER_CALL_MAX` per call, so one call never holds the lock (or the
        // payloads being moved to `expire_to`) for a whole expired backlog.
        let mut expired_budget = EXPIRED_PER_CALL_MAX;
        loop {
            let Some(c) = self.next_candidate(name)? else {
                return Ok(None);
            };
            let expired = is_expired(&c.header, now, &self.config);
            if purpose == Purpose::ExpireHead && !expired {
                // Remember when this head can expire at the earliest, so that an
                // `expire` before then needs no read (see `State::nothing_to_expire`).
                let due_ms = expiry_ms(&c.header, &self.config);
                if let Some(r) = self.readers.get_mut(name) {
                    if c.next_cursor.is_some() && r.released.is_empty() {
                        r.head_expiry = Some((r.cursor_seq, due_ms));
                    }
                }
                return Ok(None);
            }
            let seq = c.header.seq;
            let len = c.header.len as u64;
            let id = match self.readers.get(name) {
                Some(r) => r.id,
                None => {
                    return Err(Error::NotFound {
                        what: format!("reader {name:?}"),
                    })
                }
            };
            let consume = |r: &mut ReaderState| match c.next_cursor {
                Some(next) => {
                    r.cursor = next;
                    r.cursor_seq = seq + 1;
                }
                None => {
                    r.released.remove(&seq);
                }
            };
            if expired {
                let moving = self
                    .config
                    .expire_to
                    .as_deref()
                    .is_some_and(|to| to != self.name);
                if moving {
                    let lease_id = self.next_lease_id;
                    self.next_lease_id += 1;
                    if let Some(r) = self.readers.get_mut(name) {
                        consume(r);
                        r.leases.insert(
                            lease_id,
                            LeaseInfo {
                                seq,
                                loc: c.loc,
                                len: c.header.len,
                                deadline: None,
                                moving: true,
                            },
                        );
                        r.moving += 1;
                        r.moving_bytes += len;
                        r.expired += 1;
                    }
                    moves.push(Move {
                        reader: name.to_string(),
                        lease: lease_id,
                        item: c.item(),
                    });
                } else {
                    self.journal_append(JRecord::Confirm {
                        id,
                        from: seq,
                        to: seq + 1,
                    })?;
                    if let Some(r) = self.readers.get_mut(name) {
                        consume(r);
                        r.confirm_mem(seq, seq + 1, len);
                        r.expired += 1;
                    }
                }
                if purpose == Purpose::ExpireHead {
                    return Ok(Some(Taken {
                        item: c.item(),
                        lease: None,
                    }));
                }
                expired_budget -= 1;
                if expired_budget == 0 {
                    self.expired_budget_spent = true;
                    return Ok(None);
                }
                continue;
            }
            let lease_timeout = self.config.open_timeout;
            return match purpose {
                Purpose::Peek => Ok(Some(Taken {
                    item: c.into_item(),
                    lease: None,
                })),
                Purpose::Take | Purpose::Discard | Purpose::ExpireHead => {
                    self.journal_append(JRecord::Confirm {
                        id,
                        from: seq,
                        to: seq + 1,
                    })?;
                    if let Some(r) = self.readers.get_mut(name) {
                        consume(r);
                        r.confirm_mem(seq, seq + 1, len);
                        if purpose == Purpose::Take {
                            r.taken += 1;
                            r.confirmed_total += 1;
                        } else {
                            r.discarded += 1;
                        }
                    }
                    Ok(Some(Taken {
                        item: c.into_item(),
                        lease: None,
                    }))
                }
                Purpose::Lease => {
                    let lease_id = self.next_lease_id;
                    self.next_lease_id += 1;
                    if let Some(r) = self.readers.get_mut(name) {
                        consume(r);
                        r.leases.insert(
                            lease_id,
                            LeaseInfo {
                                seq,
                                loc: c.loc,
                                len: c.header.len,
                                deadline: lease_timeout.and_then(|t| Instant::now().checked_add(t)),
                                moving: false,
                            },
                        );
                        r.taken += 1;
                    }
                    Ok(Some(Taken {
                        item: c.into_item(),
                        lease: Some(LeaseId(lease_id)),
                    }))
                }
            };
        }
    }
}

impl QueueCore {
    pub(crate) fn take(&self, reader: &str, mode: TakeMode) -> Result<(Option<Taken>, Ticket)> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let purpose = match mode {
            TakeMode::Take => Purpose::Take,
            TakeMode::Lease => Purpose::Lease,
            TakeMode::Peek => Purpose::Peek,
        };
        let now = now_ms();
        let mut wrote_any = false;
        loop {
            let mut moves = Vec::new();
            let result = (|| {
                let mut st = self.state.lock();
                st.usable_reader(reader)?;
                let journal_before = st.journal.written;
                st.expired_budget_spent = false;
                let taken = st.take_inner(reader, purpose, now, &mut moves)?;
                let wrote = st.journal.written != journal_before;
                if wrote {
                    st.reclaim();
                    st.maybe_rotate_journal();
                }
                let next_seq = st.next_seq;
                if let Some(r) = st.readers.get_mut(reader) {
                    r.settle(next_seq);
                    r.check(next_seq);
                }
                let again = taken.is_none() && st.expired_budget_spent;
                let ticket = Self::ticket(&st, false, 0, true);
                Ok::<_, Error>((taken, wrote, again, ticket))
            })();
            self.move_expired(moves);
            let (taken, wrote, again, ticket) = result?;
            wrote_any |= wrote;
            if again {
                // More expired items wait at the head: let others in, then go on.
                continue;
            }
            let ticket = if wrote_any { ticket } else { Ticket(None) };
            return Ok((taken, ticket));
        }
    }

    pub(crate) fn take_batch(&self, reader: &str, count_max: usize) -> Result<(Vec<Item>, Ticket)> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let now = now_ms();
        loop {
            let mut moves = Vec::new();
            let result = (|| {
                let mut st = self.state.lock();
                st.usable_reader(reader)?;
                let mut items = Vec::new();
                st.expired_budget_spent = false;
                while items.len() < count_max {
                    match st.take_inner(reader, Purpose::Take, now, &mut moves) {
                        Ok(Some(t)) => items.push(t.item),
                        Ok(None) => break,
                        Err(e) if items.is_empty() => return Err(e),
                        Err(_) => break,
                    }
                }
                st.reclaim();
                st.maybe_rotate_journal();
                let next_seq = st.next_seq;
                if let Some(r) = st.readers.get_mut(reader) {
                    r.settle(next_seq);
                }
                // Stopped by the expiry budget with nothing to show: go on after
                // letting go of the lock (and of the items being moved).
                let again = items.is_empty() && st.expired_budget_spent;
                Ok((items, again, Self::ticket(&st, false, 0, true)))
            })();
            self.move_expired(moves);
            let (items, again, ticket) = result?;
            if !again {
                return Ok((items, ticket));
            }
        }
    }
}
