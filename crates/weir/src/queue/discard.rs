//! Dropping one item for a reader by its seq, out of order and without a lease: what
//! the work-queue features need to delete or kick a job that nobody holds (a ready or
//! buried job named by its id). Journaled as a confirmation of that one seq, so the
//! reader's out-of-order confirmations grow by one range until it reads past it.

use crate::error::{io_err, Result};
use crate::item::Item;
use crate::journal::JournalRecord;

use super::commit::Ticket;
use super::cursor::ReadAt;
use super::idle::MarkActiveOnDrop;
use super::queue_core::QueueCore;

impl QueueCore {
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
        let r = state.readers.at(slot);
        let pending = seq >= r.acked_below && seq < next_seq && !r.confirmed.contains(seq);
        if !pending || r.leases.values().any(|l| l.seq == seq) {
            return Ok((None, None));
        }
        let released = r.released.get(&seq).copied();
        let loc = match released {
            Some((loc, _)) => loc,
            None => {
                state.log.flush_staged()?;
                state
                    .log
                    .locate(next_seq, seq)
                    .map_err(io_err(|| "locating an item by its seq".into()))?
            }
        };
        let state = &mut *state;
        let read = state
            .log
            .read_at(&mut state.readers.at_mut(slot).read_buf, loc)
            .map_err(io_err(|| "reading an item by its seq".into()))?;
        let item = match read {
            ReadAt::Rec(header, data) if header.seq == seq => crate::frame::item(&header, data),
            _ => return Ok((None, None)),
        };
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
        let bytes = match released {
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
        Ok((Some(item), state.after_journal_write()))
    }
}
