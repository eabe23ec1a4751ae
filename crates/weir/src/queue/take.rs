//! Taking: a reader's next item (a released one first, else the one at its cursor,
//! stepping over segment ends, damage and items confirmed out of order), consumed
//! as a take, a lease, a peek, a discard or an expiry. An item that came back to the
//! reader `max_deliveries` times is dead-lettered when a take reaches it: moved to
//! `dead_letter_to` like an expired item to `expire_to` (or dropped, with none).
//! Released items come first, so that is the next take after its last return.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::frame::RecordHeader;
use crate::item::{Item, LeaseId, TakeMode, Taken};
use crate::journal::JournalRecord;
use crate::readers::Slot;
use crate::segment::Loc;

use super::commit::Ticket;
use super::cursor::ReadAt;
use super::cursor::Step;
use super::expire::{expiry_ms, is_expired, Move, MoveKind, EXPIRED_PER_CALL_MAX};
use super::idle::MarkActiveOnDrop;
use super::purpose::Purpose;
use super::queue_core::QueueCore;
use super::reader_state::{LeaseInfo, ReaderState};
use super::state::State;
use crate::error::io_err;

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
        crate::frame::item(&self.header, self.data)
    }
}

impl State {
    /// Counts `[from, to)` as lost to damage for the reader in `slot`.
    pub(super) fn lose(&mut self, slot: Slot, from: u64, to: u64) -> Result<()> {
        if from >= to {
            return Ok(());
        }
        let id = self.readers.at(slot).id;
        let reader = self.readers.name_at(slot);
        if self.retired.start <= from && to <= self.retired.end {
            tracing::warn!(dir = %self.dir().display(), reader, from, to, "items lost at the crash (announced when the queue opened) are skipped");
        } else {
            tracing::error!(dir = %self.dir().display(), reader, from, to, "items lost (damaged, or not on disk at a crash) are skipped");
        }
        self.journal_append(JournalRecord::Confirm { id, from, to })?;
        self.corrupt_records += to - from;
        self.readers.at_mut(slot).confirm_mem(from, to, 0);
        Ok(())
    }

    /// Finds the reader's next item: a released one first, else the one at its cursor.
    /// Moves the cursor over what it must (items confirmed out of order, segment ends,
    /// damage), but consumes nothing.
    pub(super) fn next_candidate(&mut self, slot: Slot) -> Result<Option<Candidate>> {
        loop {
            let next_seq = self.next_seq;
            let State { log, readers, .. } = self;
            let r = readers.at_mut(slot);
            if let Some((&seq, &(loc, len))) = r.released.iter().next() {
                let read = log
                    .read_at(&mut r.read_buf, loc)
                    .map_err(io_err(|| "reading a released item".into()))?;
                if let ReadAt::Rec(header, data) = read {
                    if header.seq == seq {
                        return Ok(Some(Candidate {
                            header,
                            data,
                            loc,
                            next_cursor: None,
                        }));
                    }
                }
                r.released.remove(&seq);
                r.pending_bytes = r.pending_bytes.saturating_sub(len as u64);
                self.lose(slot, seq, seq + 1)?;
                continue;
            }
            // Items confirmed below the cursor (out of order before a reopen, or a
            // segment deleted under it) are not read again.
            r.cursor_seq = r.cursor_seq.max(r.acked_below);
            if r.cursor_seq >= next_seq {
                return Ok(None);
            }
            let (expected, mut at) = (r.cursor_seq, r.cursor);
            let step = log.step(next_seq, &mut at, &mut r.read_buf, expected);
            r.cursor = at;
            let (header, data, at, next) = match step? {
                Step::Record {
                    header,
                    data,
                    at,
                    next,
                } => (header, data, at, next),
                Step::End => {
                    // At the end of what was written but behind next_seq: the items
                    // between were lost.
                    self.lose_to(slot, next_seq)?;
                    continue;
                }
            };
            if header.seq > expected {
                // Damage, or a segment missing, cost the items between.
                self.lose_to(slot, header.seq)?;
            }
            let r = self.readers.at_mut(slot);
            if r.confirmed.contains(header.seq) {
                // Confirmed out of order before a reopen: counted in the estimate of
                // `pending_bytes` made at open.
                r.pending_bytes = r.pending_bytes.saturating_sub(header.len as u64);
                r.cursor = next;
                r.cursor_seq = header.seq + 1;
                continue;
            }
            return Ok(Some(Candidate {
                header,
                data,
                loc: at,
                next_cursor: Some(next),
            }));
        }
    }

    /// Counts the items from the reader's cursor up to `to` as lost, and moves its
    /// cursor seq there.
    fn lose_to(&mut self, slot: Slot, to: u64) -> Result<()> {
        let from = self.readers.at_mut(slot).cursor_seq;
        self.lose(slot, from, to)?;
        let r = self.readers.at_mut(slot);
        r.cursor_seq = r.cursor_seq.max(to);
        Ok(())
    }

    /// Takes (or leases, peeks, discards, expires) the reader's next item; a lease
    /// records `holder` as who took it.
    pub(super) fn take_inner(
        &mut self,
        slot: Slot,
        purpose: Purpose,
        now: u64,
        moves: &mut Vec<Move>,
        holder: Option<&Arc<str>>,
    ) -> Result<Option<Taken>> {
        // Expired items at the head are dropped as they are met, but at most
        // `EXPIRED_PER_CALL_MAX` per call, so one call never holds the lock (or the
        // payloads being moved to `expire_to`) for a whole expired backlog.
        let mut expired_budget = EXPIRED_PER_CALL_MAX;
        loop {
            let Some(c) = self.next_candidate(slot)? else {
                return Ok(None);
            };
            let head = purpose == Purpose::ExpireHead;
            let kind = if is_expired(&c.header, now, self.config.max_age) {
                MoveKind::Expired
            } else if !head && self.delivered_enough(slot, c.header.seq) {
                MoveKind::DeadLetter
            } else {
                if head {
                    self.remember_head_expiry(slot, &c)?;
                    return Ok(None);
                }
                return self.consume(slot, c, purpose, holder).map(Some);
            };
            if let Some(item) = self.drop_item(slot, c, moves, head, kind)? {
                return Ok(Some(Taken {
                    item,
                    lease: None,
                    deliveries: 0,
                }));
            }
            expired_budget -= 1;
            if expired_budget == 0 {
                self.expired_budget_spent = true;
                return Ok(None);
            }
        }
    }

    /// Remembers when the unexpired head `c` can expire at the earliest, so that an
    /// `expire` before then needs no read (see `State::nothing_to_expire`).
    fn remember_head_expiry(&mut self, slot: Slot, c: &Candidate) -> Result<()> {
        let due_ms = expiry_ms(&c.header, self.config.max_age);
        let r = self.readers.at_mut(slot);
        if c.next_cursor.is_some() && r.released.is_empty() {
            r.head_expiry = Some((r.cursor_seq, due_ms));
        }
        Ok(())
    }

    /// Whether item `seq` came back to the reader in `slot` `max_deliveries` times.
    fn delivered_enough(&self, slot: Slot, seq: u64) -> bool {
        self.config
            .max_deliveries
            .is_some_and(|most| self.readers.at(slot).returns_of(seq) >= most)
    }

    /// Consumes the unexpired item `c` for `purpose`: a take or a discard confirms it
    /// (journaled), a lease holds it (for `holder`), a peek leaves it.
    fn consume(
        &mut self,
        slot: Slot,
        c: Candidate,
        purpose: Purpose,
        holder: Option<&Arc<str>>,
    ) -> Result<Taken> {
        debug_assert!(purpose != Purpose::ExpireHead);
        let returns = self.readers.at(slot).returns_of(c.header.seq);
        let deliveries = returns.saturating_add(1);
        match purpose {
            Purpose::Peek => Ok(Taken {
                item: c.into_item(),
                lease: None,
                deliveries: returns,
            }),
            Purpose::Take | Purpose::Discard | Purpose::ExpireHead => {
                let r = self.confirm_taken(slot, &c)?;
                if purpose == Purpose::Take {
                    r.taken += 1;
                    r.confirmed_total += 1;
                } else {
                    r.discarded += 1;
                }
                Ok(Taken {
                    item: c.into_item(),
                    lease: None,
                    deliveries,
                })
            }
            Purpose::Lease => {
                let now = self.clock.instant();
                let deadline = self.config.open_timeout.and_then(|t| now.checked_add(t));
                let held = Held {
                    taken_at: now,
                    deadline,
                    holder: holder.cloned(),
                };
                let lease = self.hold_lease(slot, &c, held, false)?;
                self.readers.at_mut(slot).taken += 1;
                Ok(Taken {
                    item: c.into_item(),
                    lease: Some(LeaseId(lease)),
                    deliveries,
                })
            }
        }
    }

    /// Drops the item `c`, expired or dead-lettered (`kind`): moved to the queue's
    /// target for it (held under an engine lease until it is there, see [`Move`]) or,
    /// with none, confirmed. Returns the item when `want` it.
    fn drop_item(
        &mut self,
        slot: Slot,
        c: Candidate,
        moves: &mut Vec<Move>,
        want: bool,
        kind: MoveKind,
    ) -> Result<Option<Item>> {
        let len = c.header.len as u64;
        if kind.target(&self.config, &self.name).is_some() {
            let held = Held {
                taken_at: self.clock.instant(),
                deadline: None,
                holder: None,
            };
            let lease = self.hold_lease(slot, &c, held, true)?;
            let r = self.readers.at_mut(slot);
            r.expire_moves += 1;
            r.expire_moves_bytes += len;
            *kind.counter(r) += 1;
            let item = c.into_item();
            let wanted = want.then(|| item.clone());
            moves.push(Move {
                reader: self.readers.name_at(slot).to_string(),
                lease,
                item,
                kind,
            });
            return Ok(wanted);
        }
        if kind == MoveKind::DeadLetter {
            tracing::warn!(queue = %self.name, seq = c.header.seq, "an item reached max_deliveries and the queue has no dead_letter_to: dropped");
        }
        *kind.counter(self.confirm_taken(slot, &c)?) += 1;
        Ok(want.then(|| c.into_item()))
    }

    /// Moves the reader past `c` and confirms it (journaled first); returns the reader.
    fn confirm_taken(&mut self, slot: Slot, c: &Candidate) -> Result<&mut ReaderState> {
        let seq = c.header.seq;
        let id = self.readers.at_mut(slot).id;
        self.journal_append(JournalRecord::Confirm {
            id,
            from: seq,
            to: seq + 1,
        })?;
        let r = self.readers.at_mut(slot);
        r.advance_past(seq, c.next_cursor);
        r.confirm_mem(seq, seq + 1, c.header.len as u64);
        Ok(r)
    }

    /// Moves the reader past `c` and holds it under a new lease (an engine lease, with
    /// no deadline, when `for_expire_to`: held until the item is appended to the
    /// `expire_to` queue); returns the lease id.
    fn hold_lease(
        &mut self,
        slot: Slot,
        c: &Candidate,
        held: Held,
        for_expire_to: bool,
    ) -> Result<u64> {
        let lease = self.next_lease_id;
        let r = self.readers.at_mut(slot);
        r.advance_past(c.header.seq, c.next_cursor);
        r.leases.insert(
            lease,
            LeaseInfo {
                seq: c.header.seq,
                loc: c.loc,
                len: c.header.len,
                deadline: held.deadline,
                taken_at: held.taken_at,
                holder: held.holder,
                for_expire_to,
            },
        );
        self.next_lease_id += 1;
        Ok(lease)
    }
}

/// When a new lease was taken, until when it lasts, and by whom.
struct Held {
    taken_at: Instant,
    deadline: Option<Instant>,
    holder: Option<Arc<str>>,
}

impl ReaderState {
    /// Moves past the item `seq` just consumed: the cursor goes to `next_cursor`, or,
    /// for a released item (`None`), the item leaves the released ones.
    fn advance_past(&mut self, seq: u64, next_cursor: Option<Loc>) {
        match next_cursor {
            Some(next) => {
                self.cursor = next;
                self.cursor_seq = seq + 1;
            }
            None => {
                self.released.remove(&seq);
            }
        }
    }
}

impl QueueCore {
    /// Takes, leases or peeks the next item of `reader`; a lease records `holder`.
    pub(crate) fn take(
        &self,
        reader: &str,
        mode: TakeMode,
        holder: Option<&Arc<str>>,
    ) -> Result<(Option<Taken>, Option<Ticket>)> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let purpose = match mode {
            TakeMode::Take => Purpose::Take,
            TakeMode::Lease => Purpose::Lease,
            TakeMode::Peek => Purpose::Peek,
        };
        let now = self.clock.now_ms();
        let mut wrote_any = false;
        loop {
            let mut moves = Vec::new();
            let result = (|| {
                let mut state = self.state.lock();
                // Before the reader's creation on first use, which journals it too: a
                // reader a `synced` read created is durable when the read returns.
                let journal_before = state.journal.written;
                let slot = state.usable_reader(reader)?;
                state.expired_budget_spent = false;
                let taken = state.take_inner(slot, purpose, now, &mut moves, holder)?;
                let wrote = state.journal.written != journal_before;
                if wrote {
                    state.after_write();
                }
                let next_seq = state.next_seq;
                let r = state.readers.at_mut(slot);
                r.settle(next_seq);
                r.check(next_seq);
                let again = taken.is_none() && state.expired_budget_spent;
                let ticket = state.ticket(false, 0, true);
                Ok::<_, Error>((taken, wrote, again, ticket))
            })();
            let moved = self.move_expired(moves);
            let (taken, wrote, again, ticket) = result?;
            let ticket = Ticket::covering(ticket, moved);
            wrote_any |= moved.is_some();
            wrote_any |= wrote;
            if again {
                // More expired items wait at the head: let others in, then go on.
                continue;
            }
            let ticket = if wrote_any { ticket } else { None };
            return Ok((taken, ticket));
        }
    }

    pub(crate) fn take_batch(
        &self,
        reader: &str,
        count_max: usize,
    ) -> Result<(Vec<Item>, Option<Ticket>)> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let now = self.clock.now_ms();
        loop {
            let mut moves = Vec::new();
            let result = (|| {
                let mut state = self.state.lock();
                let slot = state.usable_reader(reader)?;
                let mut items = Vec::new();
                state.expired_budget_spent = false;
                while items.len() < count_max {
                    match state.take_inner(slot, Purpose::Take, now, &mut moves, None) {
                        Ok(Some(t)) => items.push(t.item),
                        Ok(None) => break,
                        Err(e) if items.is_empty() => return Err(e),
                        Err(_) => break,
                    }
                }
                let ticket = state.after_journal_write();
                let next_seq = state.next_seq;
                state.readers.at_mut(slot).settle(next_seq);
                // Stopped by the expiry budget with nothing to show: go on after
                // letting go of the lock (and of the items being moved).
                let again = items.is_empty() && state.expired_budget_spent;
                Ok((items, again, ticket))
            })();
            let moved = self.move_expired(moves);
            let (items, again, ticket) = result?;
            let ticket = Ticket::covering(ticket, moved);
            if !again {
                return Ok((items, ticket));
            }
        }
    }
}
