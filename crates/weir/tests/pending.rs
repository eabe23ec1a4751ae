//! Listing a reader's open leases (`Reader::pending`, Redis's `XPENDING`): in seq
//! order, each with the holder its handle was named with, its age and time left on
//! the queue's clock, its delivery count and payload length; leases that ended
//! (confirmed, released, timed out) are gone, the limit and its hard cap hold, and
//! the engine's own leases (items on their way to `expire_to`) are not listed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure is a panic

mod common;

use std::sync::Arc;
use std::time::Duration;

use weir::{AppendOptions, PendingLease, QueueConfig, Store, StoreOptions, PENDING_LIST_MAX};

fn opts() -> AppendOptions {
    AppendOptions::default()
}

fn seqs(listed: &[PendingLease]) -> Vec<u64> {
    listed.iter().map(|p| p.seq).collect()
}

#[test]
fn leases_are_listed_in_seq_order_with_their_holders() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    let alice = r.with_holder(Arc::from("alice"));
    let bob = r.with_holder(Arc::from("bob"));
    assert_eq!((r.holder(), alice.holder()), (None, Some("alice")));
    q.append(b"one", opts()).unwrap();
    q.append(b"second", opts()).unwrap();
    q.append(b"3", opts()).unwrap();
    let a1 = alice.take_leased().unwrap().unwrap();
    let b2 = bob.take_leased().unwrap().unwrap();
    assert_eq!((a1.item.seq, b2.item.seq), (1, 2));
    // Item 1 comes back and is leased again by an unnamed handle: a newer lease id
    // on a lower seq, listed first all the same.
    assert!(alice.release(a1.id).unwrap());
    let again = r.take_leased().unwrap().unwrap();
    assert_eq!(again.item.seq, 1);
    let a3 = alice.take_leased().unwrap().unwrap();
    assert_eq!(a3.item.seq, 3);

    let listed = bob.pending(100);
    assert_eq!(
        seqs(&listed),
        vec![1, 2, 3],
        "every handle's leases, by seq"
    );
    let summary: Vec<_> = listed
        .iter()
        .map(|p| (p.lease, p.holder.as_deref(), p.deliveries, p.len))
        .collect();
    assert_eq!(
        summary,
        vec![
            (again.id, None, 2, 3),
            (b2.id, Some("bob"), 1, 6),
            (a3.id, Some("alice"), 1, 1),
        ]
    );
    assert!(
        listed.iter().all(|p| p.time_left.is_none()),
        "no open_timeout"
    );
}

#[test]
fn age_and_time_left_follow_the_queue_clock() {
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = common::open_on_manual_clock(
        dir.path(),
        QueueConfig {
            open_timeout: Some(Duration::from_secs(60)),
            ..QueueConfig::default()
        },
    );
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    q.append(b"a", opts()).unwrap();
    q.append(b"b", opts()).unwrap();
    let first = r.take_leased().unwrap().unwrap();
    clock.advance(Duration::from_secs(10));
    let second = r.take_leased().unwrap().unwrap();
    let listed = r.pending(10);
    let times: Vec<_> = listed.iter().map(|p| (p.age, p.time_left)).collect();
    assert_eq!(
        times,
        vec![
            (Duration::from_secs(10), Some(Duration::from_secs(50))),
            (Duration::ZERO, Some(Duration::from_secs(60))),
        ]
    );
    clock.advance(Duration::from_secs(5));
    assert!(r.touch(second.id, Some(Duration::from_secs(5))).unwrap());
    let listed = r.pending(10);
    assert_eq!(listed[0].age, Duration::from_secs(15));
    assert_eq!(listed[0].time_left, Some(Duration::from_secs(45)));
    assert_eq!(
        listed[1].age,
        Duration::from_secs(5),
        "a touch keeps the age"
    );
    assert_eq!(listed[1].time_left, Some(Duration::from_secs(5)));
    // Past its deadline the first lease times out (on the queue's tick): gone, and
    // its item's next delivery is listed with count 2.
    clock.advance(Duration::from_secs(46));
    assert!(
        common::wait_until(Duration::from_secs(3), || r.pending(10).is_empty()),
        "the leases did not time out"
    );
    let relet = r.take_leased().unwrap().unwrap();
    assert_eq!(relet.item.seq, first.item.seq);
    let listed = r.pending(10);
    assert_eq!(
        (listed[0].seq, listed[0].deliveries, listed[0].age),
        (1, 2, Duration::ZERO)
    );
}

#[test]
fn confirmed_and_released_leases_are_gone_and_counts_follow_releases() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    for data in [&b"a"[..], b"b", b"c"] {
        q.append(data, opts()).unwrap();
    }
    let a = r.take_leased().unwrap().unwrap();
    let b = r.take_leased().unwrap().unwrap();
    let c = r.take_leased().unwrap().unwrap();
    assert!(r.confirm(a.id).unwrap());
    assert!(r.release(b.id).unwrap());
    assert_eq!(seqs(&r.pending(10)), vec![3], "only c's lease is open");
    for expected in 2..=4 {
        let b = r.take_leased().unwrap().unwrap();
        assert_eq!(b.item.seq, 2);
        let listed = r.pending(10);
        assert_eq!(seqs(&listed), vec![2, 3]);
        assert_eq!(listed[0].deliveries, expected, "one more per release");
        assert_eq!(listed[1].deliveries, 1);
        assert!(r.release(b.id).unwrap());
    }
    assert!(r.confirm(c.id).unwrap());
    assert!(r.pending(10).is_empty());
}

#[test]
fn the_limit_keeps_the_lowest_seqs_and_is_capped() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    let total = PENDING_LIST_MAX + 5;
    let payloads: Vec<Vec<u8>> = (0..total).map(|i| i.to_le_bytes().to_vec()).collect();
    let items: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    q.append_batch(&items, opts()).unwrap();
    let mut leases = Vec::new();
    while let Some(l) = r.take_leased().unwrap() {
        leases.push(l);
    }
    assert_eq!(leases.len(), total);
    // Release the first three and lease them again: their lease ids are now the
    // highest, their seqs still the lowest.
    for l in leases.drain(..3) {
        assert!(r.release(l.id).unwrap());
    }
    for _ in 0..3 {
        r.take_leased().unwrap().unwrap();
    }
    assert_eq!(seqs(&r.pending(5)), vec![1, 2, 3, 4, 5]);
    assert!(r.pending(0).is_empty());
    let all = r.pending(usize::MAX);
    assert_eq!(all.len(), PENDING_LIST_MAX, "cut to the hard cap");
    let expected: Vec<u64> = (1..=PENDING_LIST_MAX as u64).collect();
    assert_eq!(seqs(&all), expected);
}

#[test]
fn items_moved_to_expire_to_are_not_listed() {
    let dir = tempfile::tempdir().unwrap();
    let config_for: weir::ConfigFn = Arc::new(|name: &str| QueueConfig {
        expire_to: (name == "src").then(|| "dead".to_string()),
        ..QueueConfig::default()
    });
    let options = StoreOptions {
        config_for: Some(config_for),
        ..StoreOptions::default()
    };
    let store = Store::open_with(dir.path(), options).unwrap();
    let src = store.queue("src").unwrap();
    let r = src.reader("").unwrap();
    let expired = AppendOptions {
        expires_at_ms: common::now_ms() - 10,
        ..AppendOptions::default()
    };
    src.append(b"old", expired).unwrap();
    src.append(b"live", opts()).unwrap();
    let live = r.take_leased().unwrap().unwrap();
    assert_eq!(&live.item.data[..], b"live");
    assert_eq!(src.stats().expired, 1, "the expired item was moved");
    assert_eq!(seqs(&r.pending(10)), vec![live.item.seq]);
    let dead = store.queue("dead").unwrap().reader("").unwrap();
    assert!(dead.pending(10).is_empty(), "the move left no lease");
}

#[test]
fn a_reader_without_leases_lists_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let r = q.reader("idle").unwrap();
    assert!(r.pending(10).is_empty(), "an empty queue");
    q.append(b"x", opts()).unwrap();
    assert!(r.pending(10).is_empty(), "items, but none leased");
    let peeked = r.peek().unwrap().unwrap();
    assert_eq!(peeked.seq, 1);
    assert!(r.pending(10).is_empty(), "a peek holds nothing");
    r.take_leased().unwrap().unwrap();
    assert_eq!(r.pending(10).len(), 1);
    assert!(q.delete_reader("idle").unwrap());
    assert!(r.pending(10).is_empty(), "a deleted reader");
}
