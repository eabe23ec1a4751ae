//! Listing a reader's open leases (Redis's `XPENDING`): for an operator looking for
//! a stuck consumer, which items are held, by whom, since when and how many times
//! they were handed out.
//!
//! A listing is built under the queue's lock from what each lease keeps in memory
//! (`LeaseInfo`: its item's seq and length, deadline, when it was taken and by whom)
//! and the reader's return counts; nothing is read from disk. Leases are keyed by
//! lease id, not seq, so the listing picks the `limit` lowest seqs with a bounded
//! heap: it costs the lock O(leases × log limit) and allocates for `limit` entries,
//! never for every lease. `limit` is cut to [`PENDING_LIST_MAX`]. Leases the engine
//! holds for items on their way to `expire_to` or `dead_letter_to` are nobody's
//! work and are left out.

use std::collections::BinaryHeap;
use std::time::Instant;

use weir_types::{LeaseId, PendingLease, PENDING_LIST_MAX};

use super::queue_core::QueueCore;
use super::reader_state::ReaderState;

impl QueueCore {
    /// The open leases of `reader`, lowest seq first, at most `limit` (cut to
    /// [`PENDING_LIST_MAX`]); empty for a reader that does not exist.
    pub(crate) fn pending(&self, reader: &str, limit: usize) -> Vec<PendingLease> {
        let state = self.state.lock();
        let now = state.clock.instant();
        state
            .readers
            .get(reader)
            .map_or_else(Vec::new, |r| r.pending(limit, now))
    }
}

impl ReaderState {
    /// The reader's open leases as at `now`, lowest seq first, at most `limit` (cut
    /// to [`PENDING_LIST_MAX`]); the engine's own leases left out.
    pub(super) fn pending(&self, limit: usize, now: Instant) -> Vec<PendingLease> {
        let limit = limit.min(PENDING_LIST_MAX);
        if limit == 0 {
            return Vec::new();
        }
        // The `limit` lowest (seq, lease id) pairs: a max-heap whose top is dropped
        // whenever a lower one comes.
        let mut lowest: BinaryHeap<(u64, u64)> = BinaryHeap::with_capacity(limit);
        for (&id, l) in self.leases.iter().filter(|(_, l)| !l.for_expire_to) {
            if lowest.len() < limit {
                lowest.push((l.seq, id));
            } else if lowest.peek().is_some_and(|&top| (l.seq, id) < top) {
                lowest.pop();
                lowest.push((l.seq, id));
            }
        }
        let mut listed = Vec::with_capacity(lowest.len());
        for (_, id) in lowest.into_sorted_vec() {
            let Some(l) = self.leases.get(&id) else {
                continue;
            };
            listed.push(PendingLease {
                lease: LeaseId(id),
                seq: l.seq,
                holder: l.holder.clone(),
                age: now.saturating_duration_since(l.taken_at),
                time_left: l.deadline.map(|d| d.saturating_duration_since(now)),
                deliveries: self.returns_of(l.seq).saturating_add(1),
                len: l.len,
            });
        }
        listed
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::queue::reader_state::{new_reader, LeaseInfo};
    use crate::segment::Loc;

    fn lease(seq: u64, taken_at: Instant, for_expire_to: bool) -> LeaseInfo {
        LeaseInfo {
            seq,
            loc: Loc {
                segment_first_seq: 1,
                off: seq * 100,
            },
            len: 10 + seq as u32,
            deadline: None,
            taken_at,
            holder: (!for_expire_to).then(|| Arc::from(format!("client {seq}"))),
            for_expire_to,
        }
    }

    fn reader() -> ReaderState {
        let cursor = Loc {
            segment_first_seq: 1,
            off: 0,
        };
        let mut r = new_reader(1, 1, cursor, 0);
        r.cursor_seq = 20;
        r
    }

    #[test]
    fn the_lowest_seqs_come_first_and_the_limit_keeps_the_lowest() {
        let t0 = Instant::now();
        let mut r = reader();
        // Lease ids do not follow seqs: a released item is leased again later.
        for (id, seq) in [(1, 5), (2, 3), (3, 9), (4, 1), (5, 7)] {
            r.leases.insert(id, lease(seq, t0, false));
        }
        let seqs = |v: Vec<PendingLease>| v.iter().map(|p| p.seq).collect::<Vec<_>>();
        assert_eq!(seqs(r.pending(100, t0)), vec![1, 3, 5, 7, 9]);
        assert_eq!(seqs(r.pending(3, t0)), vec![1, 3, 5]);
        assert_eq!(seqs(r.pending(1, t0)), vec![1]);
        assert!(r.pending(0, t0).is_empty());
        let first = &r.pending(1, t0)[0];
        assert_eq!(first.lease, LeaseId(4));
        assert_eq!((first.len, first.holder.as_deref()), (11, Some("client 1")));
    }

    #[test]
    fn engine_leases_for_expire_to_are_not_listed() {
        let t0 = Instant::now();
        let mut r = reader();
        r.leases.insert(1, lease(2, t0, true));
        r.leases.insert(2, lease(4, t0, false));
        r.expire_moves = 1;
        let listed = r.pending(10, t0);
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].seq, 4);
        // Nor do they take a place under the limit.
        assert_eq!(r.pending(1, t0)[0].seq, 4);
    }

    #[test]
    fn age_time_left_and_deliveries_are_as_at_now() {
        let t0 = Instant::now();
        let mut r = reader();
        let mut l = lease(3, t0, false);
        l.deadline = Some(t0 + Duration::from_secs(30));
        r.leases.insert(1, l);
        r.returns.insert(3, 2);
        let later = t0 + Duration::from_secs(10);
        let p = &r.pending(10, later)[0];
        assert_eq!(p.age, Duration::from_secs(10));
        assert_eq!(p.time_left, Some(Duration::from_secs(20)));
        assert_eq!(p.deliveries, 3, "two returns: the third delivery");
        let past = t0 + Duration::from_secs(40);
        assert_eq!(r.pending(10, past)[0].time_left, Some(Duration::ZERO));
    }
}
