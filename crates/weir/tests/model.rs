//! Model-based property test: random sequences of queue operations against the
//! engine and against a simple in-memory model, compared after every step.
//!
//! The model keeps, per reader, the items it still has to deliver (`required`), the
//! items under lease, and `optional` items. Optional items arise where the engine's contract
//! (docs/storage.md) leaves it a choice: a reader created while some items in the kept range were
//! already confirmed (out of order) by every other reader may or may not see them. The
//! model accepts either, but once the engine skips an optional item it must never
//! deliver it later, and once it delivers (or peeks) one it must stand by it. A full
//! queue that discards its oldest items makes the items it may have discarded optional
//! too; where the model knows the queue's count only within a range, an append near
//! the limit may go either way, but never through a queue surely full, nor refused
//! with surely room.
//!
//! The queue expires into a second one (`DEAD`): every item there must be an expired
//! item of the model's queue, intact, held no more times than readers had it to
//! deliver when it expired, and at least as many times as takes surely moved it.
//!
//! Delivery counts: the model knows, per reader and item, how many times the item came
//! back unconfirmed (released, or its lease timed out; a lease open when the store
//! closes, is killed or loses power is not counted), and checks `deliveries` on every
//! take, lease and peek that shows it. A reopen keeps every count; a power cut of a
//! `synced` queue keeps every count a later fsync covered (a release or a confirm
//! waits for one; `release_nowait` does not) and may lose the later ones, so the model
//! then knows a count only within a range, until the next delivery shows it. The
//! queue has `max_deliveries` (2 or 3, by case) and `dead_letter_to` (`POISON`): an
//! item that came back that many times to a reader is never handed out to it again,
//! and `POISON` holds it, intact, no more times than readers reached that count and at
//! least as many times as takes surely moved it; each reader's `dead_lettered`
//! (counted since the store opened) lies between the moves surely made since then and
//! those that may have been.
//!
//! Time is the store's `ManualClock`, which moves only at an `Advance` step: the model
//! knows to the millisecond when each lease times out (`open_timeout`, or the deadline
//! a `touch` gave it; a case may run without `open_timeout`, where only touched leases
//! time out) and when each item expires (its own expiry time, or the queue's
//! `max_age`), with no sleeping and no race with a loaded machine. After an `Advance`,
//! the model waits until the engine shows the leases it times out as gone (its
//! background thread does that within a tick), so the next step starts from a state
//! both agree on.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use proptest::prelude::*;
use weir::{
    AppendOptions, Durability, ErrorKind, Item, LeaseId, ManualClock, Queue, QueueConfig, Reader,
    Store, StoreOptions, TakeMode,
};

use common::{is_payload, payload};

const QUEUE: &str = "model";
/// The model queue's `expire_to`.
const DEAD: &str = "dead";
/// The model queue's `dead_letter_to`.
const POISON: &str = "poison";
const READER_NAMES: [&str; 3] = ["", "a", "b"];
/// Whether a move (to `DEAD` or `POISON`) that a call reported survives a power cut when
/// both queues are `synced`, as docs/storage.md says: the engine meets the target's
/// durability before it confirms in the source (`QueueCore::move_expired`). Before it
/// did, the model found the loss at once: `Synced`, `TakeWait { reader: 0, append:
/// false }`, an `Append` already expired, `Take(0)`, `PowerCut { seed: 0, keep: 0 }`
/// left `DEAD` without the move (and `deliveries.rs`,
/// `a_dead_letter_survives_a_power_cut_when_both_queues_are_synced`).
const MOVES_SURVIVE_SYNCED_CUTS: bool = true;
/// The queue's `open_timeout` (on the manual clock), in the cases that set one.
const OPEN_TIMEOUT_MS: u64 = 300;

#[derive(Clone, Debug)]
enum Op {
    /// `sync`: the per-append flag that makes it wait for an fsync in any mode.
    /// `ttl_ms`: the item's own expiry, that long after now (negative: already past).
    Append {
        len: usize,
        flags: u32,
        sync: bool,
        ttl_ms: Option<i64>,
    },
    AppendBatch {
        lens: Vec<usize>,
        flags: u32,
    },
    Take(usize),
    TakeLeased(usize),
    Peek(usize),
    TakeBatch(usize, usize),
    Confirm(usize, usize),
    Release(usize, usize),
    /// `Reader::touch` on a lease (picked as `Confirm` picks one): its deadline moves to
    /// that many milliseconds from now, or, with `None`, `open_timeout` from now.
    Touch(usize, usize, Option<u64>),
    /// A consumer that fails on an item: a lease of the reader's next item, released at
    /// once (its count one up; what drives items to `max_deliveries`).
    Bounce(usize),
    /// Moves the store's clock forward: leases time out, items expire.
    Advance(u64),
    /// Sets the queue's `max_age`, when it is shorter than the one in force (a longer
    /// one would make items the engine may already have dropped deliverable again).
    SetMaxAge(u64),
    /// `Queue::expire`: drops expired items at the head.
    Expire,
    /// A blocking take (`take_timeout`). `append`: with nothing to deliver, the test
    /// waits until the engine shows the take waiting, appends, and the take must wake
    /// with that item; without, a short timeout must return nothing.
    TakeWait {
        reader: usize,
        append: bool,
    },
    /// Deletes the queue and uses it again under the same name: it starts empty.
    DeleteQueue,
    /// Sets the queue's `max_items` (none: no limit) and what a full queue does:
    /// discard its oldest items (`discard`) or refuse the append.
    SetLimit {
        max: Option<u64>,
        discard: bool,
    },
    FlushReader(usize),
    FlushQueue,
    DeleteReader(usize),
    /// A simulated power cut (`common::power_cut`): the store reopens from a crash
    /// image. Under `synced`, everything acknowledged survives, so the model's state
    /// is that of a crash; in the other modes it reopens after a plain crash instead
    /// (what a power cut loses there is bounded by time, not by the model's steps).
    PowerCut {
        seed: u64,
        keep: u8,
    },
    Reopen {
        close: bool,
    },
}

fn item_len() -> impl Strategy<Value = usize> {
    prop_oneof![
        2 => Just(0usize),
        5 => 1usize..100,
        2 => 100usize..1000,
        1 => 1000usize..5000,
    ]
}

fn ttl() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![
        6 => Just(None),
        1 => Just(Some(-1i64)),
        // Some on the steps `Advance` takes, so an expiry falls exactly on "now".
        2 => prop_oneof![Just(100i64), Just(300), Just(1000)].prop_map(Some),
        2 => (1i64..1500).prop_map(Some),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let r = 0usize..3;
    prop_oneof![
        12 => (item_len(), any::<u32>(), proptest::bool::weighted(0.2), ttl())
            .prop_map(|(len, flags, sync, ttl_ms)| Op::Append { len, flags, sync, ttl_ms }),
        2 => (proptest::collection::vec(item_len(), 1..4), any::<u32>())
            .prop_map(|(lens, flags)| Op::AppendBatch { lens, flags }),
        6 => r.clone().prop_map(Op::Take),
        6 => r.clone().prop_map(Op::TakeLeased),
        3 => r.clone().prop_map(Op::Peek),
        2 => (r.clone(), 1usize..5).prop_map(|(r, n)| Op::TakeBatch(r, n)),
        5 => (r.clone(), 0usize..4).prop_map(|(r, i)| Op::Confirm(r, i)),
        3 => (r.clone(), 0usize..4).prop_map(|(r, i)| Op::Release(r, i)),
        2 => (r.clone(), 0usize..4, prop_oneof![Just(None), Just(Some(50u64)), Just(Some(300)), Just(Some(1000))])
            .prop_map(|(r, i, ms)| Op::Touch(r, i, ms)),
        3 => r.clone().prop_map(Op::Bounce),
        3 => prop_oneof![Just(100u64), Just(299), Just(300), Just(301), Just(1000)]
            .prop_map(Op::Advance),
        1 => prop_oneof![Just(200u64), Just(500), Just(1500)].prop_map(Op::SetMaxAge),
        1 => Just(Op::Expire),
        2 => (r.clone(), any::<bool>()).prop_map(|(reader, append)| Op::TakeWait { reader, append }),
        1 => Just(Op::DeleteQueue),
        1 => (prop_oneof![Just(None), Just(Some(2u64)), Just(Some(5)), Just(Some(12))], any::<bool>())
            .prop_map(|(max, discard)| Op::SetLimit { max, discard }),
        1 => r.clone().prop_map(Op::FlushReader),
        1 => Just(Op::FlushQueue),
        1 => r.prop_map(Op::DeleteReader),
        2 => any::<bool>().prop_map(|close| Op::Reopen { close }),
        1 => (any::<u64>(), 0u8..=4).prop_map(|(seed, keep)| Op::PowerCut { seed, keep }),
    ]
}

#[derive(Clone, Debug)]
struct ModelItem {
    id: u64,
    len: usize,
    flags: u32,
    /// Meaningful only while the queue has no reader: every reader that existed had
    /// confirmed this item, so a new reader may or may not see it.
    hole: bool,
    /// On the manual clock, in Unix milliseconds; `expires_ms` 0 is never.
    enqueued_ms: u64,
    expires_ms: u64,
}

#[derive(Clone, Debug)]
struct ModelLease {
    seq: u64,
    /// When it times out, on the manual clock (none: never).
    deadline_ms: Option<u64>,
}

/// How many times an item came back unconfirmed to a reader: the engine's count lies
/// in `lo..=hi` (one value but after a power cut), and at least `durable` of it
/// survives a power cut (under `synced`).
#[derive(Clone, Copy, Debug, Default)]
struct Count {
    lo: u32,
    hi: u32,
    durable: u32,
}

/// An item that came back `max_deliveries` times to a reader: it is moved to `POISON`
/// when the reader's next take reaches it. A full queue's discard can move it before
/// (`moved_now`: maybe since the store opened; `moved_before`: maybe before).
#[derive(Clone, Copy, Debug, Default)]
struct Doomed {
    moved_now: bool,
    moved_before: bool,
}

#[derive(Clone, Debug, Default)]
struct ModelReader {
    required: BTreeSet<u64>,
    optional: BTreeSet<u64>,
    leases: BTreeMap<LeaseId, ModelLease>,
    /// Items that expired while this reader still had them to deliver, and that its
    /// cursor may not have passed yet: never delivered, but the engine may still count
    /// them (and keep them) until it does.
    expired: BTreeSet<u64>,
    /// The part of `expired` the engine surely had to deliver (not optional ones): when
    /// the cursor passes one, it has moved it to `DEAD`.
    expired_sure: BTreeSet<u64>,
    /// Return counts of the items that came back unconfirmed, by seq.
    returns: BTreeMap<u64, Count>,
    /// Items that came back `max_deliveries` times, not yet passed by the cursor.
    doomed: BTreeMap<u64, Doomed>,
    /// The moves to `POISON` since the store opened: at least `dl_lo` (surely made),
    /// at most `dl_hi` (what may have been); what `stats().dead_lettered` counts.
    dl_lo: u64,
    dl_hi: u64,
}

impl ModelReader {
    fn unconfirmed(&self) -> u64 {
        (self.required.len() + self.leases.len()) as u64
    }

    /// The most items the engine may count for this reader.
    fn counted_max(&self) -> u64 {
        self.unconfirmed() + (self.optional.len() + self.expired.len() + self.doomed.len()) as u64
    }

    fn count(&self, seq: u64) -> Count {
        self.returns.get(&seq).copied().unwrap_or_default()
    }

    /// The engine handed out item `seq` (or peeked at it) showing `returns` returns
    /// (`deliveries` less one; a peek's `deliveries`): checks it, and knows it now.
    /// `most`: the queue's `max_deliveries`.
    fn observe(&mut self, seq: u64, returns: u32, most: u32, what: &str) {
        let c = self.count(seq);
        assert!(
            (c.lo..=c.hi).contains(&returns),
            "{what}: seq {seq} came back {returns} times, expected {}..={}",
            c.lo,
            c.hi
        );
        assert!(
            returns < most,
            "{what}: seq {seq} handed out after it came back {returns} times \
             (max_deliveries {most})"
        );
        if returns > 0 || c.hi > 0 {
            self.returns.insert(
                seq,
                Count {
                    lo: returns,
                    hi: returns,
                    durable: c.durable.min(returns),
                },
            );
        }
    }

    /// The item `seq` came back unconfirmed once more.
    fn returned(&mut self, seq: u64) {
        let c = self.count(seq);
        self.returns.insert(
            seq,
            Count {
                lo: c.lo + 1,
                hi: c.hi + 1,
                durable: c.durable,
            },
        );
    }

    /// Every count is on disk (a `synced` fsync of the queue's journal).
    fn counts_durable(&mut self) {
        for c in self.returns.values_mut() {
            c.durable = c.lo;
        }
    }

    /// The store opens again (`cut`: after a `synced` power cut, which can lose the
    /// counts no fsync covered): doomed items whose count may be lost may come again.
    fn reopened(&mut self, cut: bool, most: u32) {
        if cut {
            for c in self.returns.values_mut() {
                c.lo = c.durable;
            }
            let doomed = std::mem::take(&mut self.doomed);
            for (seq, d) in doomed {
                if self.count(seq).lo >= most {
                    self.doomed.insert(seq, d);
                } else {
                    self.optional.insert(seq);
                }
            }
        }
        for d in self.doomed.values_mut() {
            d.moved_before |= d.moved_now;
            d.moved_now = false;
        }
        self.dl_lo = 0;
        // Each move from now on is of an item doomed now or doomed later.
        self.dl_hi = (self.doomed.len() + self.optional.len()) as u64;
    }

    /// A reader flush: every item goes; the counters of moves stay.
    fn flushed(&mut self) {
        *self = ModelReader {
            dl_lo: self.dl_lo,
            dl_hi: self.dl_hi,
            ..ModelReader::default()
        };
    }

    /// The reader's cursor has passed every seq below `seq` (all, for `None`); returns
    /// the expired items it surely moved to `DEAD` on the way.
    fn passed(&mut self, seq: Option<u64>) -> BTreeSet<u64> {
        let seq = seq.unwrap_or(u64::MAX);
        self.expired = self.expired.split_off(&seq);
        let kept = self.expired_sure.split_off(&seq);
        std::mem::replace(&mut self.expired_sure, kept)
    }

    /// The reader's cursor has passed every doomed item below `seq` (all, for `None`):
    /// each was moved to `POISON` then, if not before. Returns them.
    fn passed_doomed(&mut self, seq: Option<u64>) -> BTreeMap<u64, Doomed> {
        let seq = seq.unwrap_or(u64::MAX);
        let kept = self.doomed.split_off(&seq);
        let gone = std::mem::replace(&mut self.doomed, kept);
        for (s, d) in &gone {
            self.returns.remove(s);
            if !d.moved_before {
                self.dl_lo += 1;
            }
        }
        gone
    }

    /// Item `seq` expired while this reader had it to deliver (`sure`: not optional).
    fn expire(&mut self, seq: u64, sure: bool) {
        self.expired.insert(seq);
        if sure {
            self.expired_sure.insert(seq);
        }
    }

    fn holds(&self, seq: u64) -> bool {
        self.required.contains(&seq) || self.leases.values().any(|l| l.seq == seq)
    }

    fn lowest(&self) -> Option<u64> {
        let leased = self.leases.values().map(|l| l.seq).min();
        [
            self.required.first().copied(),
            self.optional.first().copied(),
            self.expired.first().copied(),
            self.doomed.keys().next().copied(),
            leased,
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

/// How many times an expired item was moved to `DEAD`, or a doomed one to `POISON`: at
/// least `min` (the moves a reader's take surely made), at most `max` (once per reader
/// that had it to deliver when it expired, or that it came back to `max_deliveries`
/// times; a queue with no reader drops expired items, moving none).
#[derive(Debug, Default)]
struct Moves {
    len: usize,
    flags: u32,
    min: u64,
    max: u64,
}

/// The moves of `item` in `moves`.
fn moves_of<'a>(moves: &'a mut BTreeMap<u64, Moves>, item: &ModelItem) -> &'a mut Moves {
    moves.entry(item.id).or_insert_with(|| Moves {
        len: item.len,
        flags: item.flags,
        ..Moves::default()
    })
}

/// Whether an append fits under the queue's limit (see [`Model::room_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Room {
    Sure,
    Maybe,
    None,
}

#[derive(Debug)]
struct Model {
    /// Items at or after `head`, by seq.
    items: BTreeMap<u64, ModelItem>,
    /// Every item before this is gone for good.
    head: u64,
    last_seq: u64,
    next_id: u64,
    readers: BTreeMap<String, ModelReader>,
    appended_since_open: u64,
    /// The queue's `max_items` and `discard_old_when_full`.
    limit: Option<(u64, bool)>,
    /// Moves to `DEAD`, by item id.
    moves: BTreeMap<u64, Moves>,
    /// Moves to `POISON`, by item id.
    dead_letters: BTreeMap<u64, Moves>,
    /// The known moves (`Moves::min`) still hold: false after a power cut, which can
    /// lose a move (but see [`MOVES_SURVIVE_SYNCED_CUTS`]).
    moves_exact: bool,
    /// The manual clock, in Unix milliseconds.
    now_ms: u64,
    max_age_ms: Option<u64>,
    /// The queue's `open_timeout`.
    open_timeout_ms: Option<u64>,
    /// The queue's `max_deliveries`.
    max_deliveries: u32,
    /// The queue is `synced`: a power cut keeps what the fsyncs covered (else the
    /// model's power cut is a kill, which keeps everything journaled).
    synced: bool,
}

impl Model {
    fn new(now_ms: u64) -> Model {
        Model {
            items: BTreeMap::new(),
            head: 1,
            last_seq: 0,
            next_id: 1,
            readers: BTreeMap::new(),
            appended_since_open: 0,
            limit: None,
            moves: BTreeMap::new(),
            dead_letters: BTreeMap::new(),
            moves_exact: true,
            now_ms,
            max_age_ms: None,
            open_timeout_ms: Some(OPEN_TIMEOUT_MS),
            max_deliveries: 2,
            synced: false,
        }
    }

    /// A fresh model for the same queue settings (a deleted queue used again): the
    /// moves out of the old queue stay where they went.
    fn renewed(&mut self) -> Model {
        let mut fresh = Model::new(self.now_ms);
        fresh.next_id = self.next_id;
        fresh.max_age_ms = self.max_age_ms;
        fresh.limit = self.limit;
        fresh.moves = std::mem::take(&mut self.moves);
        fresh.dead_letters = std::mem::take(&mut self.dead_letters);
        fresh.moves_exact = self.moves_exact;
        fresh.open_timeout_ms = self.open_timeout_ms;
        fresh.max_deliveries = self.max_deliveries;
        fresh.synced = self.synced;
        fresh
    }

    /// Whether item `seq` has expired: the engine's rule, an item's expiry is the
    /// earlier of its own time and `max_age` after it was enqueued, and it has expired
    /// once that time is not in the future.
    fn is_expired(&self, seq: u64) -> bool {
        let Some(item) = self.items.get(&seq) else {
            return false;
        };
        let own = (item.expires_ms != 0).then_some(item.expires_ms);
        let by_age = self.max_age_ms.map(|a| item.enqueued_ms + a);
        own.into_iter()
            .chain(by_age)
            .min()
            .is_some_and(|e| e <= self.now_ms)
    }

    /// The least and most items the engine may count against `max_items` now: for the
    /// most-behind reader (each reader's [`ModelReader::unconfirmed`] and
    /// [`ModelReader::counted_max`]), or the kept items when there is none.
    fn counted(&self) -> (u64, u64) {
        if self.readers.is_empty() {
            return (self.unread_live(), self.items.len() as u64);
        }
        let lo = self.readers.values().map(|r| r.unconfirmed()).max();
        let hi = self.readers.values().map(|r| r.counted_max()).max();
        (lo.unwrap_or(0), hi.unwrap_or(0))
    }

    /// Whether an append of `n` items fits under the limit: surely, maybe (the model
    /// knows the count only within a range), or not at all. With `discard`, it fits
    /// when discarding can make room: not when leases alone fill the queue, or when
    /// the batch is larger than the limit.
    fn room_for(&self, n: u64) -> Room {
        let Some((max, discard)) = self.limit else {
            return Room::Sure;
        };
        if n > max {
            return Room::None;
        }
        let (lo, hi) = self.counted();
        if hi + n <= max {
            Room::Sure
        } else if !discard && lo + n > max {
            Room::None
        } else {
            Room::Maybe
        }
    }

    /// After an append of `n` items (made or refused) with `discard`: the engine may
    /// have dropped, for each reader over the limit, up to as many of its next items as
    /// it was over (its next ones in order: released ones first, then the oldest).
    /// Those may or may not come now (optional).
    fn may_discard(&mut self, n: u64) {
        let Some((max, true)) = self.limit else {
            return;
        };
        if self.readers.is_empty() {
            let over = (self.items.len() as u64 + n).saturating_sub(max);
            for item in self.items.values_mut().take(over as usize) {
                item.hole = true;
            }
            return;
        }
        for r in self.readers.values_mut() {
            let over = (r.counted_max() + n).saturating_sub(max) as usize;
            if over > 0 {
                // A discard that meets a doomed item moves it on its way.
                for d in r.doomed.values_mut() {
                    d.moved_now = true;
                }
            }
            let next: Vec<u64> = r
                .required
                .iter()
                .chain(r.optional.iter())
                .copied()
                .collect::<BTreeSet<u64>>()
                .into_iter()
                .take(over)
                .collect();
            for seq in next {
                if r.required.remove(&seq) {
                    r.optional.insert(seq);
                }
            }
        }
    }

    /// With no reader: the kept items a new reader must see (not holes, not expired).
    fn unread_live(&self) -> u64 {
        self.items
            .iter()
            .filter(|(&seq, i)| !i.hole && !self.is_expired(seq))
            .count() as u64
    }

    /// Moves the items that have expired out of what the readers must deliver.
    fn drop_expired(&mut self) {
        let expired: BTreeSet<u64> = self
            .items
            .keys()
            .copied()
            .filter(|&seq| self.is_expired(seq))
            .collect();
        for &seq in &expired {
            // Moves follow readers: a queue with none drops expired items.
            let mut readers = 0;
            for r in self.readers.values_mut() {
                let sure = r.required.remove(&seq);
                // A doomed item expired is moved to `DEAD` when met, unless a discard
                // moved it to `POISON` before: not sure.
                let doomed = r.doomed.remove(&seq).is_some();
                if sure | r.optional.remove(&seq) | doomed {
                    r.expire(seq, sure);
                    readers += 1;
                }
            }
            self.may_move(seq, readers);
        }
    }

    /// Counts `n` moves that may happen for the expired item `seq` (one per reader that
    /// will meet it expired).
    fn may_move(&mut self, seq: u64, n: u64) {
        moves_of(&mut self.moves, &self.items[&seq]).max += n;
    }

    /// Lease `lease` of reader `name` ended unconfirmed: its item is due again, unless
    /// it has expired meanwhile, or (`counted`: it came back, its count one up) came
    /// back `max_deliveries` times. A lease open when the store closes is not counted.
    fn lease_ended(&mut self, name: &str, lease: ModelLease, counted: bool) {
        let seq = lease.seq;
        let expired = self.is_expired(seq);
        if expired {
            self.may_move(seq, 1);
        }
        let r = self.readers.get_mut(name).expect("reader in model");
        if counted {
            r.returned(seq);
        }
        let count = r.count(seq);
        if expired {
            r.expire(seq, true);
        } else if count.hi >= self.max_deliveries {
            r.dl_hi += 1;
            if count.lo >= self.max_deliveries {
                r.doomed.insert(seq, Doomed::default());
            } else {
                r.optional.insert(seq);
            }
            moves_of(&mut self.dead_letters, &self.items[&seq]).max += 1;
        } else {
            r.required.insert(seq);
        }
    }

    fn appended(&mut self, seq: u64, id: u64, len: usize, flags: u32, expires_ms: u64) {
        assert!(
            seq > self.last_seq,
            "seq {seq} is not above the previous {}",
            self.last_seq
        );
        self.last_seq = seq;
        self.appended_since_open += 1;
        self.items.insert(
            seq,
            ModelItem {
                id,
                len,
                flags,
                hole: false,
                enqueued_ms: self.now_ms,
                expires_ms,
            },
        );
        for r in self.readers.values_mut() {
            r.required.insert(seq);
        }
        self.drop_expired();
    }

    /// Creates `name` if it is new, positioned at the oldest kept item.
    fn ensure_reader(&mut self, name: &str) {
        if self.readers.contains_key(name) {
            return;
        }
        let mut reader = ModelReader::default();
        let mut expired = Vec::new();
        for (&seq, item) in self.items.range(self.head..) {
            let hole = if self.readers.is_empty() {
                item.hole
            } else {
                !self.readers.values().any(|r| r.holds(seq))
            };
            if self.is_expired(seq) {
                // Expired before the reader existed: an `expire` may have dropped it
                // already, so the reader may never meet (and move) it.
                expired.push(seq);
            } else if hole {
                reader.optional.insert(seq);
            } else {
                reader.required.insert(seq);
            }
        }
        for seq in expired {
            reader.expire(seq, false);
            self.may_move(seq, 1);
        }
        self.readers.insert(name.to_string(), reader);
        self.drop_expired();
    }

    /// Moves the head past items no reader can deliver any more and forgets them.
    fn advance_head(&mut self) {
        if self.readers.is_empty() {
            return;
        }
        let new_head = self
            .readers
            .values()
            .filter_map(|r| r.lowest())
            .min()
            .unwrap_or(self.last_seq + 1);
        if new_head > self.head {
            self.head = new_head;
            self.items = self.items.split_off(&new_head);
        }
    }

    /// Checks that `got` is an item the reader may hand out next, and updates the
    /// reader's optional set accordingly. Returns the seq.
    fn check_next(&mut self, name: &str, got: Option<&Item>, what: &str) -> Option<u64> {
        let reader = self.readers.get_mut(name).expect("reader in model");
        let lowest_required = reader.required.first().copied();
        match got {
            None => {
                assert!(
                    lowest_required.is_none(),
                    "{what} on reader {name:?} returned nothing, but item {lowest_required:?} \
                     is due (model reader: {reader:?})"
                );
                reader.optional.clear();
                None
            }
            Some(item) => {
                let seq = item.seq;
                let ok = match lowest_required {
                    Some(low) => seq == low || (seq < low && reader.optional.contains(&seq)),
                    None => reader.optional.contains(&seq),
                };
                assert!(
                    ok,
                    "{what} on reader {name:?} returned seq {seq}, expected {lowest_required:?} \
                     (or one of the optional {:?})",
                    reader.optional
                );
                reader.optional = reader.optional.split_off(&seq);
                let model_item = &self.items[&seq];
                assert!(
                    is_payload(&item.data, model_item.id, model_item.len),
                    "{what}: seq {seq} has wrong content: {} bytes, expected payload of item \
                     id {} with {} bytes",
                    item.data.len(),
                    model_item.id,
                    model_item.len
                );
                assert_eq!(item.flags, model_item.flags, "{what}: flags of seq {seq}");
                Some(seq)
            }
        }
    }

    /// The store opened again after a close or a kill, or (`cut`) a power cut: the
    /// leases ended without counting, and a `synced` power cut may lose counts.
    fn reopened(&mut self, cut: bool) {
        let names: Vec<String> = self.readers.keys().cloned().collect();
        for name in names {
            let leases = std::mem::take(&mut self.readers.get_mut(&name).unwrap().leases);
            for (_, lease) in leases {
                self.lease_ended(&name, lease, false);
            }
        }
        let lost = cut && self.synced;
        for r in self.readers.values_mut() {
            r.reopened(lost, self.max_deliveries);
        }
        self.appended_since_open = 0;
    }

    /// A release or a confirm waited for an fsync of the journal: under `synced`, every
    /// count so far survives a power cut.
    fn journal_synced(&mut self) {
        if self.synced {
            for r in self.readers.values_mut() {
                r.counts_durable();
            }
        }
    }

    /// A plain take on `name` returned `got`: delivered and done.
    fn taken(&mut self, name: &str, got: Option<u64>) {
        if let Some(seq) = got {
            let m = self.readers.get_mut(name).unwrap();
            m.required.remove(&seq);
            m.optional.remove(&seq);
            m.returns.remove(&seq);
        }
        self.take_passed(name, got);
    }

    /// Checks the `deliveries` a take or a lease of `seq` by `name` showed (or, `peek`,
    /// a peek), and knows the item's count from then on.
    fn delivered(&mut self, name: &str, seq: Option<u64>, deliveries: u32, peek: bool, what: &str) {
        let Some(seq) = seq else {
            return;
        };
        let returns = if peek {
            deliveries
        } else {
            assert!(
                deliveries >= 1,
                "{what}: seq {seq} handed out with deliveries 0"
            );
            deliveries - 1
        };
        let r = self.readers.get_mut(name).expect("reader in model");
        r.observe(seq, returns, self.max_deliveries, what);
    }

    /// The doomed items `name`'s take (or peek) passed on the way to `got`: moved.
    fn doomed_passed(&mut self, name: &str, got: Option<u64>) {
        let r = self.readers.get_mut(name).expect("reader in model");
        for seq in r.passed_doomed(got).into_keys() {
            moves_of(&mut self.dead_letters, &self.items[&seq]).min += 1;
        }
    }

    /// A take on `name` returned `got` (a seq, or nothing): its cursor has passed
    /// every item below it (every item, for nothing), dropping the expired ones.
    fn take_passed(&mut self, name: &str, got: Option<u64>) {
        self.doomed_passed(name, got);
        let r = self.readers.get_mut(name).expect("reader in model");
        for seq in r.passed(got) {
            let id = self.items[&seq].id;
            self.moves
                .get_mut(&id)
                .expect("an expired item's moves")
                .min += 1;
        }
    }

    /// Moves the clock: leases past their timeout end, items expire.
    fn advance(&mut self, ms: u64) {
        self.now_ms += ms;
        let now = self.now_ms;
        let names: Vec<String> = self.readers.keys().cloned().collect();
        for name in names {
            let r = self.readers.get_mut(&name).unwrap();
            let (due, open) = std::mem::take(&mut r.leases)
                .into_iter()
                .partition(|(_, l)| l.deadline_ms.is_some_and(|d| d <= now));
            r.leases = open;
            let due: BTreeMap<LeaseId, ModelLease> = due;
            for lease in due.into_values() {
                self.lease_ended(&name, lease, true);
            }
        }
        self.drop_expired();
    }
}

/// The engine side: the store, the queue and the settings to reopen with.
struct Engine {
    /// Holds the directory `root` is in (a crash image's, after a power cut).
    dir: tempfile::TempDir,
    root: std::path::PathBuf,
    /// The settings of the model's queue that steps change; `expire_to` is always
    /// `DEAD`, `dead_letter_to` always `POISON`, and every other queue (`DEAD`,
    /// `POISON`) has the base settings.
    base: QueueConfig,
    max_age: Option<Duration>,
    /// `max_items` and `discard_old_when_full`.
    limit: Option<(u64, bool)>,
    max_deliveries: u32,
    store: Option<Store>,
    queue: Option<Queue>,
    /// Records what the fsyncs make durable, for `Op::PowerCut` (synced only).
    power: Option<std::sync::Arc<common::power_cut::PowerCut>>,
    /// The store's clock, kept across reopens.
    clock: ManualClock,
}

impl Engine {
    fn open(
        segment_size_bytes: u64,
        durability: Durability,
        open_timeout: Option<u64>,
        max_deliveries: u32,
    ) -> Engine {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        std::fs::create_dir(&root).unwrap();
        let power =
            (durability == Durability::Synced).then(|| common::power_cut::PowerCut::install(&root));
        let clock = ManualClock::new();
        let base = QueueConfig {
            segment_size_bytes,
            durability,
            open_timeout: open_timeout.map(Duration::from_millis),
            ..QueueConfig::default()
        };
        let mut engine = Engine {
            dir,
            root,
            base,
            max_age: None,
            limit: None,
            max_deliveries,
            store: None,
            queue: None,
            power,
            clock,
        };
        engine.reopen(true);
        engine
    }

    fn options(&self) -> StoreOptions {
        let base = self.base.clone();
        let (max_items, discard_old_when_full) = self.limit.unwrap_or((u64::MAX, false));
        let model = QueueConfig {
            max_age: self.max_age,
            max_items,
            discard_old_when_full,
            expire_to: Some(DEAD.to_string()),
            max_deliveries: Some(self.max_deliveries),
            dead_letter_to: Some(POISON.to_string()),
            ..base.clone()
        };
        StoreOptions {
            defaults: base.clone(),
            config_for: Some(std::sync::Arc::new(move |name: &str| {
                if name == QUEUE {
                    model.clone()
                } else {
                    base.clone()
                }
            })),
            clock: self.clock.clock(),
            ..StoreOptions::default()
        }
    }

    /// Applies changed settings to the open store.
    fn apply_settings(&self) {
        self.store.as_ref().unwrap().set_options(self.options());
    }

    fn reopen(&mut self, close: bool) {
        self.queue = None;
        if let Some(store) = self.store.take() {
            if close {
                store.close().expect("close");
            } else {
                drop(store);
            }
        }
        // Dropping the last handle releases the directory at once: no retry.
        let store = Store::open_with(&self.root, self.options()).expect("reopen");
        self.queue = Some(store.queue(QUEUE).expect("queue"));
        self.store = Some(store);
    }

    /// A power cut (synced: the store reopens from a crash image; else a crash).
    fn power_cut(&mut self, seed: u64, keep: u8) {
        let Some(power) = self.power.take() else {
            self.reopen(false);
            return;
        };
        let image_dir = tempfile::tempdir().unwrap();
        let image = image_dir.path().join("store");
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
        power
            .cut(&mut rng, f64::from(keep) / 4.0, &image, || ())
            .expect("crash image");
        // The power is gone: the old store is dropped without a close, its files left.
        self.queue = None;
        drop(self.store.take());
        drop(power);
        self.dir = image_dir;
        self.root = image;
        self.power = Some(common::power_cut::PowerCut::install(&self.root));
        self.reopen(false);
    }

    fn q(&self) -> &Queue {
        self.queue.as_ref().unwrap()
    }

    fn reader(&self, name: &str) -> Reader {
        self.q().reader(name).expect("reader")
    }

    fn dir(&self) -> &Path {
        &self.root
    }
}

struct Runner {
    engine: Engine,
    model: Model,
    n_readers: usize,
    step: usize,
}

impl Runner {
    fn name(&self, r: usize) -> &'static str {
        READER_NAMES[r % self.n_readers]
    }

    /// Waits until the engine has timed out the leases the model has: its background
    /// thread does that within a tick of the clock's move.
    fn wait_for_lease_timeouts(&self) {
        let expected: u64 = self
            .model
            .readers
            .values()
            .map(|r| r.leases.len() as u64)
            .sum();
        let q = self.engine.q().clone();
        let ok = common::wait_until(Duration::from_secs(5), || q.stats().open_leases == expected);
        assert!(
            ok,
            "step {}: lease timeouts: expected {expected} open leases, the engine has {}",
            self.step,
            q.stats().open_leases
        );
    }

    /// Appends items of `lens` (one: `append`; more: `append_batch`) and checks the
    /// outcome against the queue's limit (see [`Model::room_for`]). Returns the first
    /// seq, or `None` when the queue was full.
    fn append_items(&mut self, lens: &[usize], options: AppendOptions) -> Option<u64> {
        let step = self.step;
        let ids: Vec<u64> = lens
            .iter()
            .map(|_| {
                self.model.next_id += 1;
                self.model.next_id - 1
            })
            .collect();
        let data: Vec<Vec<u8>> = ids
            .iter()
            .zip(lens)
            .map(|(&id, &len)| payload(id, len))
            .collect();
        let room = self.model.room_for(lens.len() as u64);
        let q = self.engine.q();
        let result = if let [one] = &data[..] {
            q.append(one, options)
        } else {
            let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
            q.append_batch(&refs, options)
        };
        self.model.may_discard(lens.len() as u64);
        match result {
            Ok(first) => {
                assert!(
                    room != Room::None,
                    "step {step}: an append of {} went through a full queue (limit {:?})",
                    lens.len(),
                    self.model.limit
                );
                for (i, (&id, &len)) in ids.iter().zip(lens).enumerate() {
                    let expires_ms = options.expires_at_ms;
                    self.model
                        .appended(first + i as u64, id, len, options.flags, expires_ms);
                }
                Some(first)
            }
            Err(e) if e.kind() == ErrorKind::Full => {
                assert!(
                    room != Room::Sure,
                    "step {step}: an append of {} was refused as full with room (limit {:?})",
                    lens.len(),
                    self.model.limit
                );
                None
            }
            Err(e) => panic!("step {step}: append: {e}"),
        }
    }

    /// `Op::TakeWait`: a blocking take, woken by an append when it has to wait.
    fn take_wait(&mut self, r: usize, append: bool) {
        let step = self.step;
        let name = self.name(r);
        let reader = self.engine.reader(name);
        self.model.ensure_reader(name);
        let m = &self.model.readers[name];
        let idle = m.required.is_empty() && m.optional.is_empty();
        let got = if append && idle && self.model.room_for(1) == Room::Sure {
            let waiting = reader.clone();
            let taker = std::thread::spawn(move || {
                waiting.take_timeout(TakeMode::Take, Duration::from_secs(30))
            });
            let q = self.engine.q().clone();
            let waits = common::wait_until(Duration::from_secs(10), || q.stats().waiters >= 1);
            assert!(waits, "step {step}: the blocking take never waited");
            let seq = self.append_items(&[16], AppendOptions::default());
            assert!(seq.is_some(), "step {step}: refused with room");
            let got = taker.join().expect("taker thread");
            let got = got.unwrap_or_else(|e| panic!("step {step}: take_timeout: {e}"));
            assert!(
                got.is_some(),
                "step {step}: the append did not wake the take"
            );
            got
        } else {
            // With nothing to deliver, nothing comes within a short wait (nothing else
            // appends); with something, it comes at once.
            let wait = Duration::from_millis(if idle { 20 } else { 10_000 });
            reader
                .take_timeout(TakeMode::Take, wait)
                .unwrap_or_else(|e| panic!("step {step}: take_timeout: {e}"))
        };
        let deliveries = got.as_ref().map_or(0, |t| t.deliveries);
        let item = got.map(|t| t.item);
        let seq = self.model.check_next(name, item.as_ref(), "take_timeout");
        let what = format!("step {step}: take_timeout");
        self.model.delivered(name, seq, deliveries, false, &what);
        self.model.taken(name, seq);
    }

    /// Confirms or releases lease `i` of reader `r` (counted round its open leases; the
    /// newest, for `None`); on a reader with none open, asks about an id never handed
    /// out. Every other step releases with `release_nowait`, which does not wait for
    /// the count's fsync.
    fn end_lease(&mut self, r: usize, i: Option<usize>, confirm: bool) {
        let step = self.step;
        let name = self.name(r);
        let reader = self.engine.reader(name);
        self.model.ensure_reader(name);
        let m = self.model.readers.get_mut(name).unwrap();
        let pick = match i {
            _ if m.leases.is_empty() => None,
            Some(i) => m.leases.keys().nth(i % m.leases.len()).copied(),
            None => m.leases.keys().next_back().copied(),
        };
        let id = pick.unwrap_or(LeaseId(u64::MAX - i.unwrap_or(0) as u64));
        let wait = confirm || step.is_multiple_of(2);
        let found = if confirm {
            reader.confirm(id)
        } else if wait {
            reader.release(id)
        } else {
            reader.release_nowait(id)
        }
        .unwrap_or_else(|e| panic!("step {step}: confirm/release: {e}"));
        assert_eq!(
            found,
            pick.is_some(),
            "step {step}: {} of lease {id:?} on reader {name:?}",
            if confirm { "confirm" } else { "release" }
        );
        if let Some(id) = pick {
            let lease = m.leases.remove(&id).unwrap();
            if confirm {
                m.returns.remove(&lease.seq);
            } else {
                self.model.lease_ended(name, lease, true);
            }
            if wait {
                // Under `synced`, the confirm or release waited for the journal's fsync.
                self.model.journal_synced();
            }
        }
    }

    /// `Op::Touch`: moves a lease's deadline (on a reader with none open, asks about an
    /// id never handed out).
    fn touch(&mut self, r: usize, i: usize, extend_ms: Option<u64>) {
        let step = self.step;
        let name = self.name(r);
        let reader = self.engine.reader(name);
        self.model.ensure_reader(name);
        let deadline_ms = extend_ms
            .or(self.model.open_timeout_ms)
            .map(|t| self.model.now_ms + t);
        let m = self.model.readers.get_mut(name).unwrap();
        let pick = if m.leases.is_empty() {
            None
        } else {
            m.leases.keys().nth(i % m.leases.len()).copied()
        };
        let id = pick.unwrap_or(LeaseId(u64::MAX - i as u64));
        let found = reader
            .touch(id, extend_ms.map(Duration::from_millis))
            .unwrap_or_else(|e| panic!("step {step}: touch: {e}"));
        assert_eq!(
            found,
            pick.is_some(),
            "step {step}: touch of lease {id:?} on reader {name:?}"
        );
        if let Some(id) = pick {
            m.leases.get_mut(&id).unwrap().deadline_ms = deadline_ms;
        }
    }

    fn apply(&mut self, op: &Op) {
        let step = self.step;
        match op {
            Op::Append {
                len,
                flags,
                sync,
                ttl_ms,
            } => {
                // An own expiry already past is 1 ms after the epoch (0 means never).
                let expires_ms = ttl_ms.map_or(0, |t| {
                    u64::try_from(self.model.now_ms as i64 + t).map_or(1, |e| e.max(1))
                });
                let options = AppendOptions {
                    flags: *flags,
                    sync: *sync,
                    expires_at_ms: expires_ms,
                    job: None,
                };
                self.append_items(&[*len], options);
            }
            Op::AppendBatch { lens, flags } => {
                let options = AppendOptions {
                    flags: *flags,
                    ..AppendOptions::default()
                };
                self.append_items(lens, options);
            }
            Op::SetLimit { max, discard } => {
                let limit = max.map(|m| (m, *discard));
                self.engine.limit = limit;
                self.engine.apply_settings();
                self.model.limit = limit;
            }
            Op::Take(r) => {
                let name = self.name(*r);
                let reader = self.engine.reader(name);
                self.model.ensure_reader(name);
                // Every other step through `take_mode`, which shows `deliveries`.
                let got = if step.is_multiple_of(2) {
                    reader.take().map(|i| i.map(|item| (item, None)))
                } else {
                    reader
                        .take_mode(TakeMode::Take)
                        .map(|t| t.map(|t| (t.item, Some(t.deliveries))))
                }
                .unwrap_or_else(|e| panic!("step {step}: take: {e}"));
                let seq = self
                    .model
                    .check_next(name, got.as_ref().map(|g| &g.0), "take");
                if let Some((_, Some(deliveries))) = got {
                    let what = format!("step {step}: take");
                    self.model.delivered(name, seq, deliveries, false, &what);
                }
                self.model.taken(name, seq);
            }
            Op::TakeBatch(r, n) => {
                let name = self.name(*r);
                let reader = self.engine.reader(name);
                self.model.ensure_reader(name);
                let got = reader
                    .take_batch(*n)
                    .unwrap_or_else(|e| panic!("step {step}: take_batch: {e}"));
                assert!(got.len() <= *n, "take_batch({n}) returned {}", got.len());
                for item in &got {
                    let seq = self.model.check_next(name, Some(item), "take_batch");
                    self.model.taken(name, seq);
                }
                if got.len() < *n {
                    self.model
                        .check_next(name, None, "take_batch (short batch)");
                    self.model.taken(name, None);
                }
            }
            Op::TakeLeased(r) => {
                let name = self.name(*r);
                let reader = self.engine.reader(name);
                self.model.ensure_reader(name);
                let got = reader
                    .take_leased()
                    .unwrap_or_else(|e| panic!("step {step}: take_leased: {e}"));
                let seq = self
                    .model
                    .check_next(name, got.as_ref().map(|l| &l.item), "take_leased");
                self.model.take_passed(name, seq);
                if let Some(seq) = seq {
                    let lease = got.unwrap();
                    let what = format!("step {step}: take_leased");
                    self.model
                        .delivered(name, Some(seq), lease.deliveries, false, &what);
                    let deadline_ms = self.model.open_timeout_ms.map(|t| self.model.now_ms + t);
                    let m = self.model.readers.get_mut(name).unwrap();
                    m.required.remove(&seq);
                    m.optional.remove(&seq);
                    let fresh = m
                        .leases
                        .insert(lease.id, ModelLease { seq, deadline_ms })
                        .is_none();
                    assert!(
                        fresh,
                        "step {step}: lease id {:?} handed out twice",
                        lease.id
                    );
                }
            }
            Op::Peek(r) => {
                let name = self.name(*r);
                let reader = self.engine.reader(name);
                self.model.ensure_reader(name);
                // Every other step through `take_mode`, which shows `deliveries`.
                let got = if step.is_multiple_of(2) {
                    reader.peek().map(|i| i.map(|item| (item, None)))
                } else {
                    reader
                        .take_mode(TakeMode::Peek)
                        .map(|t| t.map(|t| (t.item, Some(t.deliveries))))
                }
                .unwrap_or_else(|e| panic!("step {step}: peek: {e}"));
                let seq = self
                    .model
                    .check_next(name, got.as_ref().map(|g| &g.0), "peek");
                if let Some((_, Some(deliveries))) = got {
                    let what = format!("step {step}: peek");
                    self.model.delivered(name, seq, deliveries, true, &what);
                }
                // A peek moves the doomed items it meets as a take does.
                self.model.doomed_passed(name, seq);
                if let Some(seq) = seq {
                    // Peeked: the engine has committed to delivering it next.
                    let m = self.model.readers.get_mut(name).unwrap();
                    if m.optional.remove(&seq) {
                        m.required.insert(seq);
                    }
                }
            }
            Op::Confirm(r, i) => self.end_lease(*r, Some(*i), true),
            Op::Release(r, i) => self.end_lease(*r, Some(*i), false),
            Op::Bounce(r) => {
                self.apply(&Op::TakeLeased(*r));
                self.end_lease(*r, None, false);
            }
            Op::Touch(r, i, extend_ms) => self.touch(*r, *i, *extend_ms),
            Op::Advance(ms) => {
                self.engine.clock.advance(Duration::from_millis(*ms));
                self.model.advance(*ms);
                self.wait_for_lease_timeouts();
            }
            Op::SetMaxAge(ms) => {
                if self.model.max_age_ms.is_none_or(|m| *ms < m) {
                    self.engine.max_age = Some(Duration::from_millis(*ms));
                    self.engine.apply_settings();
                    self.model.max_age_ms = Some(*ms);
                    self.model.drop_expired();
                }
            }
            Op::Expire => {
                let n = self
                    .engine
                    .q()
                    .expire()
                    .unwrap_or_else(|e| panic!("step {step}: expire: {e}"));
                let expired = self
                    .model
                    .items
                    .keys()
                    .filter(|&&seq| self.model.is_expired(seq))
                    .count() as u64;
                assert!(
                    n <= expired,
                    "step {step}: expire dropped {n}, but only {expired} kept items have expired"
                );
            }
            Op::TakeWait { reader, append } => self.take_wait(*reader, *append),
            Op::DeleteQueue => {
                self.engine.queue = None;
                let store = self.engine.store.as_ref().unwrap();
                let existed = store
                    .delete_queue(QUEUE)
                    .unwrap_or_else(|e| panic!("step {step}: delete_queue: {e}"));
                assert!(existed, "step {step}: delete_queue found no queue");
                self.engine.queue = Some(store.queue(QUEUE).expect("queue after delete"));
                self.model = self.model.renewed();
            }
            Op::FlushReader(r) => {
                let name = self.name(*r);
                let reader = self.engine.reader(name);
                self.model.ensure_reader(name);
                let n = reader
                    .flush()
                    .unwrap_or_else(|e| panic!("step {step}: reader flush: {e}"));
                let m = self.model.readers.get_mut(name).unwrap();
                let (low, high) = (m.unconfirmed(), m.counted_max());
                assert!(
                    (low..=high).contains(&n),
                    "step {step}: flush of reader {name:?} dropped {n}, expected {low}..={high}"
                );
                m.flushed();
            }
            Op::FlushQueue => {
                let n = self
                    .engine
                    .q()
                    .flush()
                    .unwrap_or_else(|e| panic!("step {step}: queue flush: {e}"));
                let (low, high) = if self.model.readers.is_empty() {
                    let all = self.model.items.len() as u64;
                    (self.model.unread_live(), all)
                } else {
                    let low = self
                        .model
                        .readers
                        .values()
                        .map(|r| r.unconfirmed())
                        .max()
                        .unwrap();
                    let high = self
                        .model
                        .readers
                        .values()
                        .map(|r| r.counted_max())
                        .max()
                        .unwrap();
                    (low, high)
                };
                assert!(
                    (low..=high).contains(&n),
                    "step {step}: queue flush dropped {n}, expected {low}..={high}"
                );
                for r in self.model.readers.values_mut() {
                    r.flushed();
                }
                self.model.items.clear();
                self.model.head = self.model.last_seq + 1;
            }
            Op::DeleteReader(r) => {
                let name = self.name(*r);
                let existed = self
                    .engine
                    .q()
                    .delete_reader(name)
                    .unwrap_or_else(|e| panic!("step {step}: delete_reader: {e}"));
                assert_eq!(
                    existed,
                    self.model.readers.contains_key(name),
                    "step {step}: delete_reader({name:?})"
                );
                if let Some(gone) = self.model.readers.remove(name) {
                    if self.model.readers.is_empty() {
                        for (&seq, item) in self.model.items.iter_mut() {
                            item.hole = !gone.holds(seq);
                        }
                    }
                }
            }
            Op::PowerCut { seed, keep } => {
                self.engine.power_cut(*seed, *keep);
                // A move a call reported survives a kill; a power cut keeps it only
                // between `synced` queues, once the engine waits for the target's fsync.
                self.model.moves_exact &= MOVES_SURVIVE_SYNCED_CUTS && self.model.synced;
                self.model.reopened(true);
            }
            Op::Reopen { close } => {
                self.engine.reopen(*close);
                self.model.reopened(false);
            }
        }
        self.model.advance_head();
    }

    /// `DEAD` holds only expired items of the model's queue, and `POISON` only doomed
    /// ones, intact, each as many times as it can have been moved (see [`Moves`]).
    /// Items are compared by what can be told apart: content and flags (two empty
    /// items of a batch cannot).
    fn check_dead(&self, op: &Op) {
        self.check_moved(op, DEAD, &self.model.moves);
        self.check_moved(op, POISON, &self.model.dead_letters);
    }

    fn check_moved(&self, op: &Op, target: &str, moves: &BTreeMap<u64, Moves>) {
        let step = self.step;
        let store = self.engine.store.as_ref().unwrap();
        let mut held: BTreeMap<(Vec<u8>, u32), u64> = BTreeMap::new();
        if let Some(dead) = store.existing_queue(target).expect("target queue") {
            for item in dead.iter().expect("iter dead") {
                let item = item.unwrap_or_else(|e| panic!("step {step}: dead item: {e}"));
                *held.entry((item.data.to_vec(), item.flags)).or_default() += 1;
            }
        }
        let mut bounds: BTreeMap<(Vec<u8>, u32), (u64, u64)> = BTreeMap::new();
        for (&id, m) in moves {
            let b = bounds.entry((payload(id, m.len), m.flags)).or_default();
            b.0 += if self.model.moves_exact { m.min } else { 0 };
            b.1 += m.max;
        }
        for (key, &n) in &held {
            let Some(&(_, max)) = bounds.get(key) else {
                panic!(
                    "step {step} ({op:?}): {target} holds an item ({} bytes) never moved there",
                    key.0.len()
                );
            };
            assert!(
                n <= max,
                "step {step} ({op:?}): {target} holds an item {n} times, at most {max} moves"
            );
        }
        for (key, &(min, _)) in &bounds {
            let n = held.get(key).copied().unwrap_or(0);
            assert!(
                n >= min,
                "step {step} ({op:?}): {target} holds an item {n} times, but {min} moves were made"
            );
        }
    }

    fn check(&self, op: &Op) {
        self.check_dead(op);
        let step = self.step;
        let q = self.engine.q();
        let stats = q.stats();
        let model = &self.model;

        let mut names = q.reader_names();
        names.sort();
        let model_names: Vec<String> = model.readers.keys().cloned().collect();
        assert_eq!(names, model_names, "step {step} ({op:?}): reader names");

        assert_eq!(
            stats.total_items, model.appended_since_open,
            "step {step} ({op:?}): total_items"
        );
        let leases: u64 = model.readers.values().map(|r| r.leases.len() as u64).sum();
        assert_eq!(
            stats.open_leases, leases,
            "step {step} ({op:?}): open_leases"
        );

        for r in &stats.readers {
            let m = model
                .readers
                .get(&r.name)
                .unwrap_or_else(|| panic!("step {step}: stats for unknown reader {:?}", r.name));
            let (low, high) = (m.unconfirmed(), m.counted_max());
            assert!(
                (low..=high).contains(&r.items),
                "step {step} ({op:?}): reader {:?} stats.items {}, expected {low}..={high}",
                r.name,
                r.items
            );
            assert_eq!(
                r.open_leases,
                m.leases.len() as u64,
                "step {step}: reader {:?} open_leases",
                r.name
            );
            assert!(
                (m.dl_lo..=m.dl_hi).contains(&r.dead_lettered),
                "step {step} ({op:?}): reader {:?} dead_lettered {}, expected {}..={}",
                r.name,
                r.dead_lettered,
                m.dl_lo,
                m.dl_hi
            );
        }
        assert_eq!(
            stats.dead_lettered,
            stats.readers.iter().map(|r| r.dead_lettered).sum::<u64>(),
            "step {step}: queue dead_lettered"
        );
        assert_eq!(
            stats.readers.len(),
            model.readers.len(),
            "step {step}: stats.readers"
        );

        // Queue items: at least what the most-behind reader still has to confirm, at
        // most everything from the head on.
        let low = if model.readers.is_empty() {
            model.unread_live()
        } else {
            model
                .readers
                .values()
                .map(|r| r.unconfirmed())
                .max()
                .unwrap_or(0)
        };
        let high = model.items.len() as u64;
        assert!(
            (low..=high).contains(&stats.items),
            "step {step} ({op:?}): queue stats.items {}, expected {low}..={high}",
            stats.items
        );

        // iter: increasing, every yielded item intact and not before the head, and
        // every item some reader still needs is there.
        let mut yielded = BTreeSet::new();
        let mut last = 0;
        for item in q.iter().expect("iter") {
            let item = item.unwrap_or_else(|e| panic!("step {step}: iter item: {e}"));
            assert!(
                item.seq > last,
                "step {step}: iter went from {last} to {}",
                item.seq
            );
            last = item.seq;
            let m = model.items.get(&item.seq).unwrap_or_else(|| {
                panic!(
                    "step {step} ({op:?}): iter yielded seq {}, which is not kept (head {})",
                    item.seq, model.head
                )
            });
            assert!(
                is_payload(&item.data, m.id, m.len) && item.flags == m.flags,
                "step {step}: iter: content of seq {}",
                item.seq
            );
            assert!(
                !model.is_expired(item.seq),
                "step {step} ({op:?}): iter yielded seq {}, which has expired",
                item.seq
            );
            yielded.insert(item.seq);
        }
        let needed: BTreeSet<u64> = if model.readers.is_empty() {
            model
                .items
                .iter()
                .filter(|(&s, i)| !i.hole && !model.is_expired(s))
                .map(|(s, _)| *s)
                .collect()
        } else {
            model
                .readers
                .values()
                .flat_map(|r| {
                    r.required
                        .iter()
                        .copied()
                        .chain(r.leases.values().map(|l| l.seq))
                })
                .filter(|&seq| !model.is_expired(seq))
                .collect()
        };
        let missing: Vec<u64> = needed.difference(&yielded).copied().collect();
        assert!(
            missing.is_empty(),
            "step {step} ({op:?}): iter misses kept items {missing:?}"
        );
    }
}

/// How a case sets up the model's queue besides its steps.
#[derive(Clone, Copy, Debug)]
struct Setup {
    segment_size_bytes: u64,
    durability: Durability,
    /// The queue sets `open_timeout` (else only touched leases time out).
    timeouts: bool,
    max_deliveries: u32,
}

fn run(setup: Setup, n_readers: usize, ops: &[Op]) {
    let Setup {
        segment_size_bytes,
        durability,
        timeouts,
        max_deliveries,
    } = setup;
    let open_timeout = timeouts.then_some(OPEN_TIMEOUT_MS);
    let engine = Engine::open(segment_size_bytes, durability, open_timeout, max_deliveries);
    let mut model = Model::new(engine.clock.now_ms());
    model.open_timeout_ms = open_timeout;
    model.max_deliveries = max_deliveries;
    model.synced = durability == Durability::Synced;
    let mut runner = Runner {
        model,
        engine,
        n_readers,
        step: 0,
    };
    for (step, op) in ops.iter().enumerate() {
        runner.step = step;
        runner.apply(op);
        runner.check(op);
    }
    // Everything flushed: the segments are gone but for the one being written.
    runner.engine.q().flush().expect("final flush");
    let segs = common::segment_files(runner.engine.dir(), QUEUE);
    assert!(
        segs.len() <= 2,
        "{} segment files left after a final flush: {segs:?}",
        segs.len()
    );
    runner.engine.queue = None;
    if let Some(store) = runner.engine.store.take() {
        store.close().expect("final close");
    }
}

/// Fresh cases per run: 192, or `WEIR_MODEL_CASES` (`scripts/soak` runs more).
fn model_cases() -> u32 {
    std::env::var("WEIR_MODEL_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(192)
}

proptest! {
    // Fresh cases every run; a failing case is saved under
    // `tests/model.proptest-regressions` and replayed first from then on (commit
    // the file with the fix, so the case stays a regression test).
    #![proptest_config(ProptestConfig {
        cases: model_cases(),
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        max_shrink_time: 60_000,
        max_shrink_iters: 2_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn engine_matches_model(
        segment_size_bytes in prop_oneof![Just(4096u64), Just(8192), Just(16384), Just(65536)],
        // Buffered stages appends in memory (mapfile.rs): a second write path; synced
        // runs group commit on every append.
        durability in prop_oneof![
            Just(Durability::default()),
            Just(Durability::Buffered),
            Just(Durability::Synced),
        ],
        timeouts in proptest::bool::weighted(0.75),
        max_deliveries in 2u32..=3,
        n_readers in 1usize..=3,
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let setup = Setup { segment_size_bytes, durability, timeouts, max_deliveries };
        run(setup, n_readers, &ops);
    }
}

proptest! {
    // The same property on fixed seeds: the same cases every run, on every machine.
    #![proptest_config(ProptestConfig {
        cases: 64,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x7765_6972),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn engine_matches_model_fixed_seeds(
        segment_size_bytes in prop_oneof![Just(4096u64), Just(65536)],
        durability in prop_oneof![
            Just(Durability::default()),
            Just(Durability::Buffered),
            Just(Durability::Synced),
        ],
        timeouts in proptest::bool::weighted(0.75),
        max_deliveries in 2u32..=3,
        n_readers in 1usize..=3,
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let setup = Setup { segment_size_bytes, durability, timeouts, max_deliveries };
        run(setup, n_readers, &ops);
    }
}

/// A fixed sequence that exercises rollover, reopen and leases deterministically, so
/// a regression shows up even when the random cases happen to miss it.
#[test]
fn fixed_sequence_with_rollover_and_reopen() {
    let mut ops = Vec::new();
    for i in 0..40 {
        ops.push(Op::Append {
            sync: false,
            ttl_ms: None,
            len: 300 + i * 37,
            flags: i as u32,
        });
    }
    for i in 0..10 {
        ops.push(Op::TakeLeased(i % 2));
        ops.push(Op::Take(i % 2));
    }
    ops.push(Op::Confirm(0, 1));
    ops.push(Op::Release(1, 0));
    ops.push(Op::Reopen { close: false });
    for i in 0..30 {
        ops.push(Op::Take(i % 2));
        ops.push(Op::Append {
            sync: false,
            ttl_ms: None,
            len: i,
            flags: 0,
        });
    }
    ops.push(Op::DeleteReader(1));
    ops.push(Op::Reopen { close: true });
    ops.push(Op::TakeBatch(0, 4));
    ops.push(Op::FlushReader(0));
    ops.push(Op::Peek(1));
    let setup = Setup {
        segment_size_bytes: 4096,
        durability: Durability::default(),
        timeouts: true,
        max_deliveries: 3,
    };
    run(setup, 2, &ops.clone());
    let buffered = Setup {
        durability: Durability::Buffered,
        ..setup
    };
    run(buffered, 2, &ops);
}
