//! Leases: `confirm` journals the leased item as done, `release` puts it back ahead of
//! newer items, and lease timeouts (`open_timeout`) release them from `tick`.

use std::time::Instant;

use crate::error::Result;
use crate::item::LeaseId;
use crate::journal::JournalRecord;

use super::commit::Ticket;
use super::idle::MarkActiveOnDrop;
use super::queue_core::QueueCore;
use super::state::State;

impl State {
    /// Releases the leases past their `open_timeout`; returns the readers to wake.
    pub(super) fn tick_leases(&mut self, now: Instant) -> Vec<String> {
        let mut woke = Vec::new();
        if self.config.open_timeout.is_none() {
            return woke;
        }
        for (name, r) in self.readers.iter_mut() {
            let due: Vec<u64> = r
                .leases
                .iter()
                .filter(|(_, l)| !l.moving && l.deadline.is_some_and(|d| d <= now))
                .map(|(&id, _)| id)
                .collect();
            for id in &due {
                if let Some(l) = r.leases.remove(id) {
                    r.released.insert(l.seq, (l.loc, l.len));
                }
            }
            if !due.is_empty() {
                woke.push(name.clone());
            }
        }
        woke
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
        let Some(info) = r.leases.get(&lease.0).filter(|l| !l.moving) else {
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

    pub(crate) fn release(&self, reader: &str, lease: LeaseId) -> Result<bool> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let mut state = self.state.lock();
        state.check_usable()?;
        let Some(r) = state.readers.get_mut(reader) else {
            return Ok(false);
        };
        if r.leases.get(&lease.0).is_none_or(|l| l.moving) {
            return Ok(false);
        }
        if self.is_shutting_down() {
            // Kept leased: delivered again after the restart, not to another reader
            // of this process (see `Store::begin_shutdown`).
            return Ok(true);
        }
        let Some(info) = r.leases.remove(&lease.0) else {
            return Ok(false);
        };
        r.released.insert(info.seq, (info.loc, info.len));
        if let Some(r) = state.readers.get(reader) {
            self.wake_reader(r);
        }
        Ok(true)
    }
}
