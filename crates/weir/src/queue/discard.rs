//! One item of a reader by its seq, out of order and without a lease: looked at
//! (`inspect_seq`), or dropped (`discard_seq`), which is what the work-queue
//! features need to find, delete or kick a job that nobody holds (a ready or buried
//! job named by its id). A drop is journaled as a confirmation of that one seq, so
//! the reader's out-of-order confirmations grow by one range until it reads past it.
//! Finding the item reads its segment from the start: no index is kept.

use crate::error::{io_err, Result};
use crate::item::Item;
use crate::journal::JournalRecord;
use crate::readers::Slot;
use crate::segment::Loc;

use super::commit::Ticket;
use super::cursor::ReadAt;
use super::idle::MarkActiveOnDrop;
use super::queue_core::QueueCore;
use super::state::State;

/// Where a pending item stands for its reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Waiting to be taken (released ones included).
    Ready,
    /// Held under a lease.
    Leased,
}

/// A pending item found by its seq.
struct Pending {
    item: Item,
    standing: Standing,
    /// Its place and length when it is among the reader's released items.
    released: Option<(Loc, u32)>,
}

impl State {
    /// Item `seq` when it is pending for the reader in `slot` (not confirmed, stored,
    /// intact), with where it stands.
    fn pending_at(&mut self, slot: Slot, seq: u64) -> Result<Option<Pending>> {
        let next_seq = self.next_seq;
        let r = self.readers.at(slot);
        if seq < r.acked_below || seq >= next_seq || r.confirmed.contains(seq) {
            return Ok(None);
        }
        let lease = r.leases.values().find(|l| l.seq == seq).map(|l| l.loc);
        let released = r.released.get(&seq).copied();
        let loc = match lease.or(released.map(|(loc, _)| loc)) {
            Some(loc) => loc,
            None => {
                self.log.flush_staged()?;
                self.log
                    .locate(next_seq, seq)
                    .map_err(io_err(|| "locating an item by its seq".into()))?
            }
        };
        let read = self
            .log
            .read_at(&mut self.readers.at_mut(slot).read_buf, loc)
            .map_err(io_err(|| "reading an item by its seq".into()))?;
        let ReadAt::Rec(header, data) = read else {
            return Ok(None);
        };
        if header.seq != seq {
            return Ok(None);
        }
        Ok(Some(Pending {
            item: crate::frame::item(&header, data),
            standing: if lease.is_some() {
                Standing::Leased
            } else {
                Standing::Ready
            },
            released,
        }))
    }
}

impl QueueCore {
    /// Where item `seq` stands for `reader`, from memory alone (no read: an item
    /// lost to damage looks pending here); `None` when it is not pending.
    pub(crate) fn standing(&self, reader: &str, seq: u64) -> Result<Option<Standing>> {
        let mut state = self.state.lock();
        state.ready()?;
        let Some(r) = state.readers.get(reader) else {
            return Ok(None);
        };
        if seq < r.acked_below || seq >= state.next_seq || r.confirmed.contains(seq) {
            return Ok(None);
        }
        Ok(Some(if r.leases.values().any(|l| l.seq == seq) {
            Standing::Leased
        } else {
            Standing::Ready
        }))
    }

    /// Item `seq` and where it stands, when it is pending for `reader`.
    pub(crate) fn inspect_seq(&self, reader: &str, seq: u64) -> Result<Option<(Item, Standing)>> {
        let mut state = self.state.lock();
        state.ready()?;
        let Some(slot) = state.readers.slot(reader) else {
            return Ok(None);
        };
        Ok(state.pending_at(slot, seq)?.map(|p| (p.item, p.standing)))
    }

    /// Confirms item `seq` for `reader`, which must not hold it under a lease, and
    /// returns it as it was; `None` when it is not pending for the reader (confirmed
    /// already, never stored, lost, or leased: a leased item is its holder's to end).
    pub(crate) fn discard_seq(
        &self,
        reader: &str,
        seq: u64,
    ) -> Result<(Option<Item>, Option<Ticket>)> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let mut state = self.state.lock();
        state.ready()?;
        let next_seq = state.next_seq;
        let Some(slot) = state.readers.slot(reader) else {
            return Ok((None, None));
        };
        let Some(found) = state.pending_at(slot, seq)? else {
            return Ok((None, None));
        };
        if found.standing == Standing::Leased {
            return Ok((None, None));
        }
        let id = state.readers.at(slot).id;
        state.journal_append(JournalRecord::Confirm {
            id,
            from: seq,
            to: seq + 1,
        })?;
        let r = state.readers.at_mut(slot);
        // A released item is behind the cursor and counted in `pending_bytes`; one
        // ahead of it is subtracted when the cursor steps over it, as every item
        // confirmed out of order is.
        let bytes = match found.released {
            Some((_, len)) => {
                r.released.remove(&seq);
                u64::from(len)
            }
            None => 0,
        };
        r.confirm_mem(seq, seq + 1, bytes);
        r.head_expiry = None;
        r.settle(next_seq);
        r.check(next_seq);
        Ok((Some(found.item), state.after_journal_write()))
    }
}
