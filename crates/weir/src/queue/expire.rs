//! Expiry: when an item expires (its own time or the queue's `max_age`), `expire`
//! (drop every expired head now), the queue's floor when it has no reader, and the
//! moves of expired items to the queue's `expire_to` queue, which happen outside this
//! queue's lock and confirm the item only once it is in the target.

use std::time::Duration;

use crate::config::QueueConfig;
use crate::error::{Error, Result};
use crate::frame::RecordHeader;
use crate::item::{self, AppendOptions, Item};
use crate::journal::JournalRecord;
use crate::readers::Slot;

use super::commit::Ticket;
use super::cursor::Step;
use super::idle::MarkActiveOnDrop;
use super::purpose::Purpose;
use super::queue_core::QueueCore;
use super::reader_state::ReaderState;
use super::state::State;
use crate::error::io_err;

/// Most expired items one take drops (or moves) before it lets go of the lock.
pub(super) const EXPIRED_PER_CALL_MAX: u32 = 1024;
// A take counts this budget down to zero: it must start above it.
const _: () = assert!(EXPIRED_PER_CALL_MAX > 0);

/// An expired item on its way to the queue's `expire_to` queue. A take meets it under
/// this queue's lock, but the append to the target must happen outside it (one queue
/// lock at a time, and queues may expire into each other). So the item is held under a
/// lease, not confirmed: the confirmation is journaled only once the item is in the
/// target. A process killed in between moves it again after the restart (a duplicate
/// in the target) instead of losing it from both queues.
pub(super) struct Move {
    pub(super) reader: String,
    pub(super) lease: u64,
    pub(super) item: Item,
    pub(super) kind: MoveKind,
}

/// Why an item leaves its queue without being handed out, which says where it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MoveKind {
    /// It expired: to `expire_to`.
    Expired,
    /// It came back `max_deliveries` times: to `dead_letter_to`.
    DeadLetter,
}

impl MoveKind {
    /// The queue it goes to under `config`, if any (never the queue `name` itself).
    pub(super) fn target<'a>(self, config: &'a QueueConfig, name: &str) -> Option<&'a str> {
        let target = match self {
            MoveKind::Expired => config.expire_to.as_deref(),
            MoveKind::DeadLetter => config.dead_letter_to.as_deref(),
        };
        target.filter(|t| *t != name)
    }

    /// The reader's counter of such items.
    pub(super) fn counter(self, r: &mut ReaderState) -> &mut u64 {
        match self {
            MoveKind::Expired => &mut r.expired,
            MoveKind::DeadLetter => &mut r.dead_lettered,
        }
    }
}

/// When the item `h` heads expires (see [`item::expiry_ms`], the one rule).
pub(super) fn expiry_ms(h: &RecordHeader, max_age: Option<Duration>) -> u64 {
    item::expiry_ms(h.expires_at_ms, h.enqueued_at_ms, max_age)
}

/// Whether the item `h` heads has expired at `now_ms`.
pub(crate) fn is_expired(h: &RecordHeader, now_ms: u64, max_age: Option<Duration>) -> bool {
    expiry_ms(h, max_age) <= now_ms
}

impl State {
    /// Ends the lease of a [`Move`]: confirmed (journaled) when `done`, else released,
    /// so that a later take moves the item again. A lease gone meanwhile (the reader
    /// was flushed or deleted) needs nothing.
    pub(super) fn finish_move(&mut self, m: &Move, done: bool) {
        let next_seq = self.next_seq;
        let Some((id, seq, loc, len)) = self.readers.get(&m.reader).and_then(|r| {
            let l = r.leases.get(&m.lease).filter(|l| l.for_expire_to)?;
            Some((r.id, l.seq, l.loc, l.len))
        }) else {
            return;
        };
        let confirmed = done
            && {
                let rec = JournalRecord::Confirm {
                    id,
                    from: seq,
                    to: seq + 1,
                };
                match self.journal_append(rec) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::error!(dir = %self.dir().display(), error = %e, "could not confirm a moved item; it stays and is moved again");
                        false
                    }
                }
            };
        let Some(r) = self.readers.get_mut(&m.reader) else {
            return;
        };
        r.leases.remove(&m.lease);
        r.expire_moves = r.expire_moves.saturating_sub(1);
        r.expire_moves_bytes = r.expire_moves_bytes.saturating_sub(len as u64);
        if confirmed {
            r.confirm_mem(seq, seq + 1, len as u64);
        } else {
            // Not woken for: an item that cannot be moved yet would only be met again.
            r.released.insert(seq, (loc, len));
            let counter = m.kind.counter(r);
            *counter = counter.saturating_sub(1);
        }
        r.settle(next_seq);
        r.check(next_seq);
    }

    /// Drops the oldest item of a queue with no reader (only if it has expired, when
    /// `only_expired`); false when there is none to drop.
    pub(super) fn advance_floor(&mut self, only_expired: bool, now: u64) -> Result<bool> {
        if self.floor >= self.next_seq {
            self.floor_bytes = 0;
            return Ok(false);
        }
        let mut at = match self.floor_loc {
            Some(loc) => loc,
            None => {
                self.log.flush_staged()?;
                self.log
                    .locate(self.next_seq, self.floor)
                    .map_err(io_err(|| "locating the oldest item".into()))?
            }
        };
        let step = self
            .log
            .step(self.next_seq, &mut at, &mut self.floor_read_buf, self.floor);
        self.floor_loc = Some(at);
        let (header, next) = match step? {
            Step::Record { header, next, .. } => (header, next),
            Step::End => return Ok(false),
        };
        if only_expired && !is_expired(&header, now, self.config.max_age) {
            self.floor_head_expiry = Some((self.floor, expiry_ms(&header, self.config.max_age)));
            return Ok(false);
        }
        self.journal_append(JournalRecord::Floor(header.seq + 1))?;
        self.floor = header.seq + 1;
        self.floor_loc = Some(next);
        self.floor_bytes = self.floor_bytes.saturating_sub(header.len as u64);
        Ok(true)
    }

    /// Whether an `expire` now would find nothing, known from memory alone: every
    /// reader (or the queue, with none) is empty, or its head was seen unexpired and
    /// cannot expire before a time still to come.
    pub(super) fn nothing_to_expire(&self, now: u64) -> bool {
        if self.readers.is_empty() {
            return self.floor >= self.next_seq
                || self
                    .floor_head_expiry
                    .is_some_and(|(floor, due)| floor == self.floor && now < due);
        }
        self.readers.values().all(|r| {
            r.released.is_empty()
                && (r.cursor_seq >= self.next_seq
                    || r.head_expiry
                        .is_some_and(|(seq, due)| seq == r.cursor_seq && now < due))
        })
    }
}

impl QueueCore {
    pub(crate) fn expire(&self) -> Result<u64> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let now = self.clock.now_ms();
        let mut moves = Vec::new();
        let result = (|| -> Result<(u64, Option<Ticket>)> {
            let mut state = self.state.lock();
            state.check_usable()?;
            if state.nothing_to_expire(now) {
                // Known without a read: a whole-store `flush_all_expired` over thousands
                // of idle queues opens none of their files.
                return Ok((0, None));
            }
            state.ready()?;
            let mut count = 0u64;
            if state.readers.is_empty() {
                while state.advance_floor(true, now)? {
                    state.floor_expired += 1;
                    count += 1;
                }
            } else {
                let slots: Vec<Slot> = state.readers.slots().collect();
                let mut most = 0;
                for slot in slots {
                    let mut n = 0;
                    while state
                        .take_inner(slot, Purpose::ExpireHead, now, &mut moves, None)?
                        .is_some()
                    {
                        n += 1;
                    }
                    most = most.max(n);
                }
                count = most;
            }
            state.after_write();
            Ok((count, state.ticket(false, 0, true)))
        })();
        let moved = self.move_expired(moves);
        let (count, ticket) = result?;
        self.wait_durable(Ticket::covering(ticket, moved))?;
        Ok(count)
    }

    /// Appends expired items to the queue's `expire_to` queue, and dead letters to its
    /// `dead_letter_to` queue, outside our lock, then ends their leases here (see
    /// [`Move`]): confirmed once the target has the item (or refused it for good),
    /// released to be moved again by a later take when the append failed for a
    /// reason that can pass.
    ///
    /// Returns what the caller must wait for before it returns under `synced`: the
    /// journal records that end the moves, like the rest of what the operation wrote
    /// (else a power cut could undo a move the call reported, and the item be moved
    /// again). The target's append has its own queue's durability.
    pub(super) fn move_expired(&self, moves: Vec<Move>) -> Option<Ticket> {
        if moves.is_empty() {
            return None;
        }
        let config = self.state.lock().config.clone();
        let Some(store) = self.store.upgrade() else {
            // The store is going away, and these leases with it: a restart
            // delivers the items again, and moves them then.
            return None;
        };
        let mut opened: Vec<(String, Result<std::sync::Arc<QueueCore>>)> = Vec::new();
        let mut outcomes: Vec<(Move, bool)> = Vec::with_capacity(moves.len());
        for m in moves {
            // The setting changed since the take: dropped, as a take would now.
            let Some(target) = m.kind.target(&config, &self.name) else {
                outcomes.push((m, true));
                continue;
            };
            if !opened.iter().any(|(name, _)| name == target) {
                opened.push((target.to_string(), store.clone().queue_for_use(target)));
            }
            let done = match opened.iter().find(|(name, _)| name == target) {
                Some((_, Ok(q))) => {
                    // A job keeps its id, priority and ttr where it goes.
                    let options = AppendOptions {
                        flags: m.item.flags,
                        expires_at_ms: 0,
                        sync: false,
                        job: m.item.job,
                    };
                    // A `buffered` target writes what it staged before this queue
                    // confirms: the confirmation must not survive a kill that the
                    // moved item would not.
                    // The target's own durability is met before this queue
                    // confirms: a power cut must not keep the confirmation without
                    // the item (a synced target fsyncs it here).
                    let appended = q
                        .append_batch(&[&m.item.data[..]], options)
                        .and_then(|(_, ticket)| q.wait_durable(ticket))
                        .and_then(|()| q.write_staged());
                    match appended {
                        Ok(()) => true,
                        Err(e) => self.move_failed(target, &e),
                    }
                }
                Some((_, Err(e))) => self.move_failed(target, e),
                None => false,
            };
            outcomes.push((m, done));
        }
        #[cfg(feature = "fault-injection")]
        crate::fault::reached(crate::fault::MOVE_APPENDED);
        let mut state = self.state.lock();
        if state.ready().is_err() {
            // Closed or deleted meanwhile: the leases went with it.
            return None;
        }
        for (m, done) in &outcomes {
            state.finish_move(m, *done);
        }
        state.after_journal_write()
    }

    /// Logs a move that failed with `e`; true when the item is to be dropped anyway
    /// (the target refused it: too large, full and refusing, a bad name), false when it
    /// stays in this queue to be moved again later (I/O, disk full, closing).
    pub(super) fn move_failed(&self, target: &str, e: &Error) -> bool {
        use crate::error::ErrorKind;
        let retry = matches!(
            e.kind(),
            ErrorKind::Io
                | ErrorKind::DiskFull
                | ErrorKind::Closed
                | ErrorKind::NotFound
                | ErrorKind::TooManyQueues
        );
        if retry {
            tracing::warn!(from = %self.name, to = %target, error = %e, "could not move an expired or dead-lettered item; it stays here and is moved again later");
        } else {
            tracing::error!(from = %self.name, to = %target, error = %e, "the target queue refused an expired or dead-lettered item; it is dropped");
        }
        !retry
    }
}
