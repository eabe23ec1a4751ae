//! Leases: `confirm` journals the leased item as done, `release` puts it back ahead of
//! newer items, lease timeouts (`open_timeout`, or a deadline `touch` set) release them
//! from `tick`, and `touch` moves a lease's deadline. Each time an item comes back
//! unconfirmed its return count is journaled: its delivery count, which
//! `max_deliveries` goes by (see `take.rs`).

use std::time::{Duration, Instant};

use crate::error::Result;
use crate::item::LeaseId;
use crate::journal::JournalRecord;
use crate::readers::Slot;

use super::commit::Ticket;
use super::idle::MarkActiveOnDrop;
use super::queue_core::QueueCore;
use super::state::State;

impl State {
    /// Releases the leases past their deadline; returns the readers to wake.
    pub(super) fn tick_leases(&mut self, now: Instant) -> Vec<String> {
        let mut woke = Vec::new();
        if self.config.open_timeout.is_none() && !self.lease_deadlines {
            return woke;
        }
        let mut any_deadline = false;
        let slots: Vec<Slot> = self.readers.slots().collect();
        for slot in slots {
            let r = self.readers.at_mut(slot);
            any_deadline |= r.leases.values().any(|l| l.deadline.is_some());
            let due: Vec<u64> = r
                .leases
                .iter()
                .filter(|(_, l)| !l.for_expire_to && l.deadline.is_some_and(|d| d <= now))
                .map(|(&id, _)| id)
                .collect();
            for id in &due {
                self.give_back(slot, *id);
            }
            if !due.is_empty() {
                woke.push(self.readers.name_at(slot).to_string());
            }
        }
        self.lease_deadlines &= any_deadline;
        woke
    }

    /// Ends lease `id` of the reader in `slot` unconfirmed: the item goes back ahead of
    /// newer ones, and its return count goes up by one (journaled; a journal that
    /// cannot be written loses the count, never the item).
    fn give_back(&mut self, slot: Slot, id: u64) {
        let r = self.readers.at_mut(slot);
        let Some(info) = r.leases.remove(&id) else {
            return;
        };
        r.released.insert(info.seq, (info.loc, info.len));
        let count = r.returns_of(info.seq).saturating_add(1);
        r.returns.insert(info.seq, count);
        let rec = JournalRecord::Returns {
            id: r.id,
            seq: info.seq,
            count,
        };
        if let Err(e) = self.journal_append(rec) {
            tracing::warn!(dir = %self.dir().display(), error = %e, "could not journal an item's delivery count");
        }
    }
}

impl QueueCore {
    /// Whether the store has begun shutting down (see `Store::begin_shutdown`).
    pub(super) fn is_shutting_down(&self) -> bool {
        self.store.upgrade().is_some_and(|s| s.shutting_down())
    }

    pub(crate) fn confirm(&self, reader: &str, lease: LeaseId) -> Result<(bool, Option<Ticket>)> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let mut state = self.state.lock();
        state.ready()?;
        let Some(r) = state.readers.get(reader) else {
            return Ok((false, None));
        };
        let id = r.id;
        let Some(info) = r.leases.get(&lease.0).filter(|l| !l.for_expire_to) else {
            return Ok((false, None));
        };
        let (seq, len) = (info.seq, info.len as u64);
        state.journal_append(JournalRecord::Confirm {
            id,
            from: seq,
            to: seq + 1,
        })?;
        let next_seq = state.next_seq;
        if let Some(r) = state.readers.get_mut(reader) {
            r.leases.remove(&lease.0);
            r.confirm_mem(seq, seq + 1, len);
            r.confirmed_total += 1;
            r.settle(next_seq);
            r.check(next_seq);
        }
        Ok((true, state.after_journal_write()))
    }

    /// Gives the lease's item back; the ticket covers its return count's journal record.
    pub(crate) fn release(&self, reader: &str, lease: LeaseId) -> Result<(bool, Option<Ticket>)> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let mut state = self.state.lock();
        state.check_usable()?;
        let Some(slot) = state.readers.slot(reader) else {
            return Ok((false, None));
        };
        let r = state.readers.at(slot);
        if r.leases.get(&lease.0).is_none_or(|l| l.for_expire_to) {
            return Ok((false, None));
        }
        if self.is_shutting_down() {
            // Kept leased: delivered again after the restart, not to another reader
            // of this process (see `Store::begin_shutdown`).
            return Ok((true, None));
        }
        state.give_back(slot, lease.0);
        self.wake_reader(state.readers.at(slot));
        Ok((true, state.after_journal_write()))
    }

    /// How long lease `lease` has before it times out: `None` when it is not open,
    /// `Duration::MAX` when it has no deadline.
    pub(crate) fn lease_time_left(&self, reader: &str, lease: LeaseId) -> Option<Duration> {
        let state = self.state.lock();
        let info = state.readers.get(reader)?.leases.get(&lease.0)?;
        Some(match info.deadline {
            Some(deadline) => deadline.saturating_duration_since(state.clock.instant()),
            None => Duration::MAX,
        })
    }

    /// Moves lease `lease`'s deadline to `extend` from now, or, with `None`, to the
    /// queue's `open_timeout` from now (a lease with neither keeps none). False when
    /// the lease is unknown (confirmed, released or timed out already).
    pub(crate) fn touch(
        &self,
        reader: &str,
        lease: LeaseId,
        extend: Option<Duration>,
    ) -> Result<bool> {
        let _active = MarkActiveOnDrop(self);
        let mut state = self.state.lock();
        state.check_usable()?;
        let now = state.clock.instant();
        let timeout = extend.or(state.config.open_timeout);
        let deadline = timeout.and_then(|t| now.checked_add(t));
        let custom = extend.is_some();
        let Some(info) = state
            .readers
            .get_mut(reader)
            .and_then(|r| r.leases.get_mut(&lease.0))
            .filter(|l| !l.for_expire_to)
        else {
            return Ok(false);
        };
        info.deadline = deadline;
        state.lease_deadlines |= custom && deadline.is_some();
        Ok(true)
    }
}
