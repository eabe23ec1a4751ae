//! One reader's state in memory: its position (`acked_below`, out-of-order
//! confirmations, cursor), its leases and released items, its read-ahead buffer and
//! counters. Bounded by what is leased or released, never by the backlog.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;

use crate::intervals::IntervalSet;
use crate::segment::{Loc, ReadBuf};

pub(super) struct LeaseInfo {
    pub(super) seq: u64,
    pub(super) loc: Loc,
    pub(super) len: u32,
    pub(super) deadline: Option<Instant>,
    /// When it was taken, by the queue's clock: its age in a listing (`pending.rs`).
    pub(super) taken_at: Instant,
    /// Who took it, as the taking [`Reader`](crate::Reader) handle was named (a clone
    /// of its `Arc`: no allocation); `None` for an unnamed taker and the engine.
    pub(super) holder: Option<Arc<str>>,
    /// Held by the engine for an expired item being moved to `expire_to` (see
    /// [`Move`](super::expire::Move)), not by a caller: no timeout, and no caller may confirm or release it.
    pub(super) for_expire_to: bool,
}

pub(super) struct ReaderState {
    pub(super) id: u32,
    pub(super) acked_below: u64,
    pub(super) confirmed: IntervalSet,
    pub(super) cursor_seq: u64,
    pub(super) cursor: Loc,
    pub(super) leases: BTreeMap<u64, LeaseInfo>,
    /// Released items, redelivered first in seq order: seq -> (loc, payload length).
    pub(super) released: BTreeMap<u64, (Loc, u32)>,
    /// Pending items that came back unconfirmed (released, timed out), and how many
    /// times: their delivery counts, journaled (`JournalRecord::Returns`). An entry
    /// goes when its item is confirmed; so the map holds at most the items leased
    /// and then given back, not the backlog.
    pub(super) returns: BTreeMap<u64, u32>,
    pub(super) pending_bytes: u64,
    pub(super) read_buf: ReadBuf,
    pub(super) notify: Arc<Notify>,
    pub(super) waiters: Arc<AtomicU64>,
    pub(super) taken: u64,
    pub(super) confirmed_total: u64,
    pub(super) expired: u64,
    pub(super) discarded: u64,
    pub(super) dead_lettered: u64,
    /// Leases held for items being moved to `expire_to`, and their payload bytes.
    pub(super) expire_moves: u64,
    pub(super) expire_moves_bytes: u64,
    /// Where the oldest item this reader holds is and when it was enqueued, as read
    /// when the queue's files were last closed, so that `stats` needs no descriptor
    /// while they are.
    pub(super) oldest_enqueued: Option<(Loc, u64)>,
    /// `(cursor_seq, ms)`: the item at the cursor, found unexpired by an `expire`,
    /// cannot expire before `ms` (valid while the cursor has not moved, nothing was
    /// released and the settings are the same), so the next `expire` before then reads
    /// nothing.
    pub(super) head_expiry: Option<(u64, u64)>,
}

impl ReaderState {
    /// Where the oldest item this reader has not confirmed is: leased, released, or at
    /// the cursor.
    pub(super) fn oldest_loc(&self, next_seq: u64) -> Option<Loc> {
        let mut oldest: Option<(u64, Loc)> = None;
        for l in self.leases.values() {
            if oldest.is_none_or(|(s, _)| l.seq < s) {
                oldest = Some((l.seq, l.loc));
            }
        }
        if let Some((&s, &(loc, _))) = self.released.iter().next() {
            if oldest.is_none_or(|(o, _)| s < o) {
                oldest = Some((s, loc));
            }
        }
        if oldest.is_none() && self.cursor_seq < next_seq {
            oldest = Some((self.cursor_seq, self.cursor));
        }
        oldest.map(|(_, loc)| loc)
    }

    pub(super) fn pending_items(&self, next_seq: u64) -> u64 {
        next_seq - self.acked_below - self.confirmed.count()
    }

    /// What this reader holds against `max_items`/`max_bytes`: items being moved to
    /// `expire_to` are on their way out and count as gone, as they did when a move
    /// confirmed them at once.
    pub(super) fn room_used(&self, next_seq: u64) -> (u64, u64) {
        (
            self.pending_items(next_seq)
                .saturating_sub(self.expire_moves),
            self.pending_bytes.saturating_sub(self.expire_moves_bytes),
        )
    }

    /// Records `[from, to)` as confirmed in memory (the journal was written already).
    pub(super) fn confirm_mem(&mut self, from: u64, to: u64, bytes: u64) {
        let from = from.max(self.acked_below);
        if from >= to {
            return;
        }
        if from == self.acked_below && self.confirmed.is_empty() {
            self.acked_below = to;
        } else {
            self.confirmed.insert(from, to);
            while let Some(end) = self.confirmed.take_range_at(self.acked_below) {
                self.acked_below = end;
            }
        }
        crate::journal::prune_returns(
            &mut self.returns,
            self.acked_below,
            &self.confirmed,
            from,
            to,
        );
        self.pending_bytes = self.pending_bytes.saturating_sub(bytes);
    }

    /// How many times the item `seq` came back to this reader unconfirmed.
    pub(super) fn returns_of(&self, seq: u64) -> u32 {
        if self.returns.is_empty() {
            return 0;
        }
        self.returns.get(&seq).copied().unwrap_or(0)
    }

    /// Forgets every return count (the reader was moved: `seek`, `flush`).
    pub(super) fn forget_returns(&mut self) {
        self.returns.clear();
    }

    /// Byte counts are estimates after a reopen; an empty reader holds none.
    pub(super) fn settle(&mut self, next_seq: u64) {
        if self.pending_items(next_seq) == 0 {
            self.pending_bytes = 0;
        }
    }

    /// Checks the reader's invariants (see the module docs of `queue`): the O(1) ones
    /// always, those that walk its leases in debug builds.
    pub(super) fn check(&self, next_seq: u64) {
        assert!(
            self.acked_below <= next_seq,
            "acked {} > next {}",
            self.acked_below,
            next_seq
        );
        assert!(
            self.cursor_seq <= next_seq,
            "cursor {} > next {}",
            self.cursor_seq,
            next_seq
        );
        assert!(
            self.expire_moves <= self.leases.len() as u64,
            "{} moves but {} leases",
            self.expire_moves,
            self.leases.len()
        );
        #[cfg(debug_assertions)]
        for seq in self
            .leases
            .values()
            .map(|l| l.seq)
            .chain(self.released.keys().copied())
        {
            assert!(
                seq >= self.acked_below && seq < self.cursor_seq,
                "held seq {seq} outside [acked, cursor)"
            );
            assert!(!self.confirmed.contains(seq), "held seq {seq} is confirmed");
        }
    }
}

pub(super) fn new_reader(id: u32, start: u64, cursor: Loc, pending_bytes: u64) -> ReaderState {
    ReaderState {
        id,
        acked_below: start,
        confirmed: IntervalSet::default(),
        cursor_seq: start,
        cursor,
        leases: BTreeMap::new(),
        released: BTreeMap::new(),
        returns: BTreeMap::new(),
        pending_bytes,
        read_buf: ReadBuf::default(),
        notify: Arc::new(Notify::new()),
        waiters: Arc::new(AtomicU64::new(0)),
        taken: 0,
        confirmed_total: 0,
        expired: 0,
        discarded: 0,
        dead_lettered: 0,
        expire_moves: 0,
        expire_moves_bytes: 0,
        oldest_enqueued: None,
        head_expiry: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(start: u64) -> ReaderState {
        let cursor = Loc {
            segment_first_seq: 1,
            off: 0,
        };
        new_reader(1, start, cursor, 0)
    }

    fn lease(seq: u64) -> LeaseInfo {
        LeaseInfo {
            seq,
            loc: Loc {
                segment_first_seq: 1,
                off: seq * 100,
            },
            len: 10,
            deadline: None,
            taken_at: Instant::now(),
            holder: None,
            for_expire_to: false,
        }
    }

    #[test]
    fn confirmations_in_order_move_acked_below_and_out_of_order_wait_for_the_gap() {
        let mut r = reader(1);
        r.pending_bytes = 40;
        r.confirm_mem(1, 2, 10);
        assert_eq!((r.acked_below, r.pending_bytes), (2, 30));
        r.confirm_mem(3, 5, 20);
        assert_eq!(r.acked_below, 2, "3 and 4 wait for 2");
        assert_eq!(r.pending_items(6), 2, "2 and 5 pending");
        r.confirm_mem(2, 3, 10);
        assert_eq!(r.acked_below, 5, "the gap closed: 2..5 all confirmed");
        assert!(r.confirmed.is_empty());
        assert_eq!(r.pending_bytes, 0);
        // Below acked_below: nothing changes, bytes included.
        r.pending_bytes = 7;
        r.confirm_mem(1, 4, 5);
        assert_eq!((r.acked_below, r.pending_bytes), (5, 7));
    }

    #[test]
    fn the_oldest_held_item_is_a_lease_a_released_item_or_the_cursor() {
        let mut r = reader(1);
        assert_eq!(r.oldest_loc(1), None, "an empty queue");
        r.cursor_seq = 5;
        r.cursor = Loc {
            segment_first_seq: 1,
            off: 500,
        };
        assert_eq!(
            r.oldest_loc(9),
            Some(Loc {
                segment_first_seq: 1,
                off: 500
            })
        );
        r.leases.insert(7, lease(3));
        assert_eq!(
            r.oldest_loc(9),
            Some(Loc {
                segment_first_seq: 1,
                off: 300
            })
        );
        r.released.insert(
            2,
            (
                Loc {
                    segment_first_seq: 1,
                    off: 200,
                },
                10,
            ),
        );
        assert_eq!(
            r.oldest_loc(9),
            Some(Loc {
                segment_first_seq: 1,
                off: 200
            })
        );
    }

    #[test]
    fn items_on_their_way_to_expire_to_do_not_count_against_room() {
        let mut r = reader(1);
        r.cursor_seq = 3;
        r.pending_bytes = 30;
        let mut moved = lease(1);
        moved.for_expire_to = true;
        r.leases.insert(1, moved);
        r.expire_moves = 1;
        r.expire_moves_bytes = 10;
        assert_eq!(r.room_used(4), (2, 20));
        assert_eq!(r.pending_items(4), 3);
    }

    #[test]
    fn settle_forgets_estimated_bytes_of_an_empty_reader() {
        let mut r = reader(4);
        r.pending_bytes = 123;
        r.settle(5);
        assert_eq!(r.pending_bytes, 123, "one item pending");
        r.settle(4);
        assert_eq!(r.pending_bytes, 0);
    }

    #[test]
    fn check_accepts_a_consistent_reader() {
        let mut r = reader(1);
        r.cursor_seq = 4;
        r.leases.insert(9, lease(2));
        r.released.insert(
            3,
            (
                Loc {
                    segment_first_seq: 1,
                    off: 300,
                },
                10,
            ),
        );
        r.confirm_mem(1, 2, 0);
        r.check(4);
    }

    #[test]
    #[should_panic(expected = "cursor")]
    fn check_refuses_a_cursor_past_the_tail() {
        let mut r = reader(1);
        r.cursor_seq = 6;
        r.check(5);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "outside [acked, cursor)")]
    fn check_refuses_a_lease_beyond_the_cursor() {
        let mut r = reader(1);
        r.cursor_seq = 2;
        r.leases.insert(1, lease(5));
        r.check(9);
    }
}
