//! Delivery counts, `max_deliveries` with `dead_letter_to`, and lease extension
//! (`touch`): the count goes up each time an item comes back unconfirmed (released,
//! or timed out), survives a reopen and a journal rotation, goes with the item's
//! confirmation, and an item that came back `max_deliveries` times is moved to
//! `dead_letter_to` (or dropped) by the next take that reaches it, never handed out
//! again.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure is a panic

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use weir::{AppendOptions, QueueConfig, Store, StoreOptions, TakeMode};

fn opts() -> AppendOptions {
    AppendOptions::default()
}

/// "jobs" dead-letters into "dead" after `most` deliveries; other queues are default.
fn limited(most: u32, to: Option<&str>) -> StoreOptions {
    let to = to.map(str::to_string);
    let config_for: weir::ConfigFn = Arc::new(move |name: &str| {
        if name == "jobs" {
            QueueConfig {
                max_deliveries: Some(most),
                dead_letter_to: to.clone(),
                ..QueueConfig::default()
            }
        } else {
            QueueConfig::default()
        }
    });
    StoreOptions {
        config_for: Some(config_for),
        ..StoreOptions::default()
    }
}

fn open(dir: &Path, options: StoreOptions) -> Store {
    Store::open_with(dir, options).unwrap()
}

#[test]
fn the_count_rises_with_each_return_and_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let q = store.queue("q").unwrap();
        let r = q.reader("").unwrap();
        q.append(b"a", opts()).unwrap();
        q.append(b"b", opts()).unwrap();
        for expected in 1..=3 {
            let l = r.take_leased().unwrap().unwrap();
            assert_eq!((l.item.seq, l.deliveries), (1, expected));
            assert!(r.release(l.id).unwrap());
        }
        let peeked = r.take_mode(TakeMode::Peek).unwrap().unwrap();
        assert_eq!(peeked.deliveries, 3, "a peek shows the deliveries so far");
        let second = r.take_leased().unwrap().unwrap();
        let b = r.take_leased().unwrap().unwrap();
        assert_eq!(
            (b.item.seq, b.deliveries),
            (2, 1),
            "another item has its own count"
        );
        assert!(r.release_nowait(b.id).unwrap());
        assert_eq!(second.deliveries, 4);
        // Open at the close: not counted (a delivery under way when the process ends).
        drop((q, r));
        store.close().unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    let one = r.take_leased().unwrap().unwrap();
    assert_eq!(
        (one.item.seq, one.deliveries),
        (1, 4),
        "three returns before"
    );
    let two = r.take_leased().unwrap().unwrap();
    assert_eq!((two.item.seq, two.deliveries), (2, 2));
    assert!(r.confirm(one.id).unwrap());
    assert!(r.confirm(two.id).unwrap());
    // A confirmed item's count is gone: a new item at a later seq starts at 1.
    q.append(b"c", opts()).unwrap();
    assert_eq!(r.take_leased().unwrap().unwrap().deliveries, 1);
}

#[test]
fn a_lease_timeout_counts_as_a_return() {
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = common::open_on_manual_clock(
        dir.path(),
        QueueConfig {
            open_timeout: Some(Duration::from_millis(100)),
            max_deliveries: Some(2),
            ..QueueConfig::default()
        },
    );
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    q.append(b"poison", opts()).unwrap();
    q.append(b"next", opts()).unwrap();
    for expected in 1..=2 {
        let l = r.take_leased().unwrap().unwrap();
        assert_eq!((l.item.seq, l.deliveries), (1, expected));
        clock.advance(Duration::from_millis(100));
        assert!(
            common::wait_until(Duration::from_secs(3), || q.stats().open_leases == 0),
            "the lease did not time out"
        );
    }
    // Two returns with max_deliveries 2 and no dead_letter_to: dropped.
    let next = r.take_leased().unwrap().unwrap();
    assert_eq!((next.item.seq, &next.item.data[..]), (2, &b"next"[..]));
    let stats = q.stats();
    assert_eq!(stats.dead_lettered, 1);
    assert_eq!(stats.readers[0].dead_lettered, 1);
}

#[test]
fn past_max_deliveries_an_item_moves_to_dead_letter_to_once() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path(), limited(3, Some("dead")));
        let q = store.queue("jobs").unwrap();
        let r = q.reader("").unwrap();
        let flags = AppendOptions { flags: 7, ..opts() };
        q.append(b"poison", flags).unwrap();
        q.append(b"fine", opts()).unwrap();
        for _ in 0..3 {
            let l = r.take_leased().unwrap().unwrap();
            assert_eq!(&l.item.data[..], b"poison");
            assert!(r.release(l.id).unwrap());
        }
        // The next take moves it and hands out the next item.
        let fine = r.take().unwrap().unwrap();
        assert_eq!(&fine.data[..], b"fine");
        assert!(r.take().unwrap().is_none(), "never handed out again");
        let dead = store.queue("dead").unwrap().reader("").unwrap();
        let moved = dead.take().unwrap().unwrap();
        assert_eq!((&moved.data[..], moved.flags), (&b"poison"[..], 7));
        assert!(dead.take().unwrap().is_none(), "moved once");
        assert_eq!(q.stats().dead_lettered, 1);
        drop((q, r, dead));
        store.close().unwrap();
    }
    // After a reopen neither queue has it again.
    let store = open(dir.path(), limited(3, Some("dead")));
    assert!(store
        .queue("jobs")
        .unwrap()
        .reader("")
        .unwrap()
        .take()
        .unwrap()
        .is_none());
    assert!(store
        .queue("dead")
        .unwrap()
        .reader("")
        .unwrap()
        .take()
        .unwrap()
        .is_none());
}

#[test]
fn the_count_that_reaches_the_limit_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path(), limited(2, Some("dead")));
        let q = store.queue("jobs").unwrap();
        let r = q.reader("").unwrap();
        q.append(b"poison", opts()).unwrap();
        for _ in 0..2 {
            let l = r.take_leased().unwrap().unwrap();
            assert!(r.release(l.id).unwrap());
        }
        drop((q, r));
        store.close().unwrap();
    }
    let store = open(dir.path(), limited(2, Some("dead")));
    let r = store.queue("jobs").unwrap().reader("").unwrap();
    assert!(
        r.take_leased().unwrap().is_none(),
        "dead-lettered, not delivered"
    );
    let dead = store.queue("dead").unwrap().reader("").unwrap();
    assert_eq!(&dead.take().unwrap().unwrap().data[..], b"poison");
}

#[test]
fn each_reader_counts_its_own_deliveries() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), limited(1, Some("dead")));
    let q = store.queue("jobs").unwrap();
    let a = q.reader("a").unwrap();
    let b = q.reader("b").unwrap();
    q.append(b"x", opts()).unwrap();
    let l = a.take_leased().unwrap().unwrap();
    assert!(a.release(l.id).unwrap());
    // a dead-letters it; b still gets it, on its first delivery.
    assert!(a.take_leased().unwrap().is_none());
    let lb = b.take_leased().unwrap().unwrap();
    assert_eq!((&lb.item.data[..], lb.deliveries), (&b"x"[..], 1));
    assert!(b.confirm(lb.id).unwrap());
    let dead = store.queue("dead").unwrap().reader("").unwrap();
    assert_eq!(&dead.take().unwrap().unwrap().data[..], b"x");
}

#[test]
fn counts_survive_journal_rotations() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let q = store.queue("q").unwrap();
        let r = q.reader("").unwrap();
        q.append(b"held", opts()).unwrap();
        let l = r.take_leased().unwrap().unwrap();
        assert!(r.release(l.id).unwrap());
        let held = r.take_leased().unwrap().unwrap();
        assert_eq!(held.deliveries, 2);
        // Enough confirmations of other items to rotate the 4 MiB journal a few
        // times (29 bytes each) while item 1 stays leased.
        let batch: Vec<Vec<u8>> = (0..1000).map(|i| vec![i as u8; 8]).collect();
        let refs: Vec<&[u8]> = batch.iter().map(|v| &v[..]).collect();
        for _ in 0..500 {
            q.append_batch(&refs, opts()).unwrap();
            while r.take_batch(1000).unwrap().len() == 1000 {}
        }
        assert!(r.release(held.id).unwrap());
        drop((q, r));
        store.close().unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    let r = store.queue("q").unwrap().reader("").unwrap();
    let again = r.take_leased().unwrap().unwrap();
    assert_eq!((&again.item.data[..], again.deliveries), (&b"held"[..], 3));
}

#[test]
fn touch_moves_a_leases_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = common::open_on_manual_clock(
        dir.path(),
        QueueConfig {
            open_timeout: Some(Duration::from_millis(100)),
            ..QueueConfig::default()
        },
    );
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    q.append(b"a", opts()).unwrap();
    let l = r.take_leased().unwrap().unwrap();
    clock.advance(Duration::from_millis(90));
    assert!(r.touch(l.id, None).unwrap(), "open_timeout from now");
    clock.advance(Duration::from_millis(90));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        q.stats().open_leases,
        1,
        "still open 180 ms after the lease"
    );
    assert!(r.touch(l.id, Some(Duration::from_secs(10))).unwrap());
    clock.advance(Duration::from_millis(9_000));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(q.stats().open_leases, 1, "extended by the time given");
    clock.advance(Duration::from_millis(1_000));
    assert!(
        common::wait_until(Duration::from_secs(3), || q.stats().open_leases == 0),
        "the touched lease never timed out"
    );
    assert!(
        !r.touch(l.id, None).unwrap(),
        "a timed-out lease is unknown"
    );
}

#[test]
fn touch_gives_a_deadline_where_the_queue_has_none() {
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = common::open_on_manual_clock(dir.path(), QueueConfig::default());
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    q.append(b"a", opts()).unwrap();
    let l = r.take_leased().unwrap().unwrap();
    assert!(
        r.touch(l.id, None).unwrap(),
        "no timeout to extend: still none"
    );
    clock.advance(Duration::from_secs(3600));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(q.stats().open_leases, 1);
    assert!(r.touch(l.id, Some(Duration::from_millis(50))).unwrap());
    clock.advance(Duration::from_millis(50));
    assert!(
        common::wait_until(Duration::from_secs(3), || q.stats().open_leases == 0),
        "a deadline given by touch on a queue without open_timeout never passed"
    );
    let again = r.take_leased().unwrap().unwrap();
    assert_eq!(again.deliveries, 2);
}

/// With both queues `synced`, a dead-lettered item is on disk in `dead_letter_to`
/// before its confirmation in the source is (docs/storage.md, "Moves to
/// `expire_to`"): a power cut right after the take that moved it leaves it in one of
/// the two queues. It was in neither while the move did not wait for the target's
/// fsync (`QueueCore::move_expired` dropped the `Ticket` of `append_batch`); the same
/// held for `expire_to`, and for a target the move created.
#[test]
fn a_dead_letter_survives_a_power_cut_when_both_queues_are_synced() {
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("store");
    std::fs::create_dir(&root).unwrap();
    let power = common::power_cut::PowerCut::install(&root);
    let config_for: weir::ConfigFn = Arc::new(move |name: &str| QueueConfig {
        durability: weir::Durability::Synced,
        max_deliveries: (name == "jobs").then_some(1),
        dead_letter_to: (name == "jobs").then(|| "dead".to_string()),
        ..QueueConfig::default()
    });
    let options = StoreOptions {
        config_for: Some(config_for),
        ..StoreOptions::default()
    };
    let store = open(&root, options.clone());
    let dead = store.queue("dead").unwrap();
    dead.reader("").unwrap();
    dead.append(b"before", opts()).unwrap();
    let q = store.queue("jobs").unwrap();
    let r = q.reader("").unwrap();
    q.append(b"poison", opts()).unwrap();
    let l = r.take_leased().unwrap().unwrap();
    assert!(r.release(l.id).unwrap());
    // Cuts that keep nothing an fsync did not cover. Before the move, the item is there.
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1);
    let before = work.path().join("before");
    power.cut(&mut rng, 0.0, &before, || ()).unwrap();
    {
        // Opened without max_deliveries: what is there is handed out.
        let cut = Store::open(&before).unwrap();
        let r = cut.queue("jobs").unwrap().reader("").unwrap();
        let l = r.take_leased().unwrap().expect("the item before the move");
        assert_eq!((&l.item.data[..], l.deliveries), (&b"poison"[..], 2));
    }
    assert!(r.take().unwrap().is_none(), "moved to dead");
    let image = work.path().join("image");
    power.cut(&mut rng, 0.0, &image, || ()).unwrap();
    let cut = open(&image, options);
    let in_jobs = cut
        .queue("jobs")
        .unwrap()
        .reader("")
        .unwrap()
        .take()
        .unwrap();
    let dead = cut.queue("dead").unwrap().reader("").unwrap();
    assert_eq!(&dead.take().unwrap().unwrap().data[..], b"before");
    let in_dead = dead.take().unwrap();
    assert!(
        in_jobs.is_some() || in_dead.is_some(),
        "a dead-lettered item of a synced queue is in neither queue after a power cut"
    );
}
