//! Regressions found in review: each test names the defect it pins down.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

mod common;

use common::{now_ms, open_with_config, payload, small_segments};
use weir::{AppendOptions, ErrorKind, QueueConfig, Store, StoreOptions};

/// `delete_queue` racing `queue(name)`: the re-created queue must never reuse the old
/// directory's files (appends to unlinked files would vanish at the next open).
#[test]
fn appends_after_a_racing_delete_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut last_marker = 0u64;
    for round in 0..200u64 {
        std::thread::scope(|s| {
            let deleter = s.spawn(|| store.delete_queue("q").unwrap());
            // Appends while the delete runs may land before or after it.
            for i in 0..5 {
                let _ = store
                    .queue("q")
                    .and_then(|q| q.append(&payload(round * 100 + i, 8), AppendOptions::default()));
            }
            deleter.join().unwrap();
        });
        // After the delete has returned, this append is acknowledged and must stay.
        last_marker = 1_000_000 + round;
        store
            .queue("q")
            .unwrap()
            .append(&payload(last_marker, 8), AppendOptions::default())
            .unwrap();
    }
    let kept: Vec<_> = store
        .queue("q")
        .unwrap()
        .iter()
        .unwrap()
        .map(|i| i.unwrap().data)
        .collect();
    assert!(
        kept.contains(&payload(last_marker, 8).into()),
        "the last acknowledged append is there before reopen"
    );
    store.close().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let kept: Vec<_> = store
        .queue("q")
        .unwrap()
        .iter()
        .unwrap()
        .map(|i| i.unwrap().data)
        .collect();
    assert!(
        kept.contains(&payload(last_marker, 8).into()),
        "the last acknowledged append survives reopen ({} items kept)",
        kept.len()
    );
    // Nothing of the old directories is left behind.
    let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("queues"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "q")
        .collect();
    assert!(leftovers.is_empty(), "leftover directories: {leftovers:?}");
}

/// `expire()` on a queue with no reader stepped over the first item of the next segment
/// without checking it: an unexpired item was dropped at every segment boundary.
#[test]
fn expire_without_readers_stops_at_the_first_live_item_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with_config(dir.path(), small_segments(4096)).unwrap();
    let q = store.queue("exp").unwrap();
    let past = AppendOptions {
        expires_at_ms: now_ms().saturating_sub(1000).max(1),
        ..Default::default()
    };
    // Several segments of expired items (1 KiB each: 3 per 4 KiB segment).
    for i in 0..10u64 {
        q.append(&payload(i, 1024), past).unwrap();
    }
    let live: Vec<u64> = (100..110).collect();
    for &i in &live {
        q.append(&payload(i, 1024), AppendOptions::default())
            .unwrap();
    }
    assert_eq!(
        q.expire().unwrap(),
        10,
        "exactly the expired items are dropped"
    );
    assert_eq!(q.expire().unwrap(), 0);
    let kept: Vec<_> = q.iter().unwrap().map(|i| i.unwrap().data).collect();
    let want: Vec<bytes::Bytes> = live.iter().map(|&i| payload(i, 1024).into()).collect();
    assert_eq!(kept, want, "every live item is kept");
    assert_eq!(q.stats().items, live.len() as u64);
    // A reader created now starts at the first live item.
    let r = q.reader("").unwrap();
    assert_eq!(r.take().unwrap().unwrap().data, payload(100, 1024));
}

/// Bytes confirmed out of order before a restart were never subtracted after it, so
/// `max_bytes` refused appends to an empty queue.
#[test]
fn byte_count_is_exact_again_after_a_reopen_with_out_of_order_confirms() {
    let dir = tempfile::tempdir().unwrap();
    let config = QueueConfig {
        max_bytes: 1024 * 1024,
        ..Default::default()
    };
    let options = StoreOptions {
        defaults: config,
        config_for: None,
        ..StoreOptions::default()
    };
    {
        let store = Store::open_with(dir.path(), options.clone()).unwrap();
        let q = store.queue("b").unwrap();
        for i in 0..10u64 {
            q.append(&payload(i, 100 * 1024), AppendOptions::default())
                .unwrap();
        }
        let r = q.reader("").unwrap();
        let leases: Vec<_> = (0..10).map(|_| r.take_leased().unwrap().unwrap()).collect();
        for l in &leases[1..] {
            assert!(r.confirm(l.id).unwrap());
        }
        // Dropped without confirming the first lease: a restart releases it.
    }
    let store = Store::open_with(dir.path(), options).unwrap();
    let q = store.queue("b").unwrap();
    let r = q.reader("").unwrap();
    assert_eq!(r.take().unwrap().unwrap().data, payload(0, 100 * 1024));
    assert!(r.take().unwrap().is_none());
    let stats = q.stats();
    assert_eq!((stats.items, stats.bytes), (0, 0), "{stats:?}");
    let big = vec![7u8; 900 * 1024];
    q.append(&big, AppendOptions::default())
        .expect("room for 900 KiB in an empty 1 MiB queue");
    let err = q.append(&big, AppendOptions::default()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Full);
}

/// A caller's "wait for ever" timeout must not overflow the clock.
#[test]
fn huge_timeouts_do_not_panic() {
    let dir = tempfile::tempdir().unwrap();
    let config = QueueConfig {
        open_timeout: Some(std::time::Duration::MAX),
        ..Default::default()
    };
    let store = Store::open_with(
        dir.path(),
        StoreOptions {
            defaults: config,
            config_for: None,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let q = store.queue("t").unwrap();
    q.append(b"x", AppendOptions::default()).unwrap();
    let r = q.reader("").unwrap();
    let got = r
        .take_timeout(weir::TakeMode::Lease, std::time::Duration::MAX)
        .unwrap()
        .unwrap();
    assert!(r.release(got.lease.unwrap()).unwrap());
    assert_eq!(r.take().unwrap().unwrap().data, &b"x"[..]);
}

/// A take drops at most 1024 expired items per lock hold; behind a longer run of expired
/// items the live one must still come back from take, take_batch and peek, and a full
/// queue that discards old items must still make room.
#[test]
fn live_items_behind_a_long_run_of_expired_ones() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let past = AppendOptions {
        expires_at_ms: 1,
        ..Default::default()
    };
    let expired: Vec<Vec<u8>> = (0..3000u64).map(|i| payload(i, 16)).collect();
    let refs: Vec<&[u8]> = expired.iter().map(|d| d.as_slice()).collect();
    for name in ["take", "batch", "peek"] {
        let q = store.queue(name).unwrap();
        q.append_batch(&refs, past).unwrap();
        q.append(b"live", AppendOptions::default()).unwrap();
    }
    let r = store.queue("take").unwrap().reader("").unwrap();
    assert_eq!(r.take().unwrap().unwrap().data, &b"live"[..]);
    let r = store.queue("batch").unwrap().reader("").unwrap();
    let got = r.take_batch(10).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].data, &b"live"[..]);
    let q = store.queue("peek").unwrap();
    let r = q.reader("").unwrap();
    assert_eq!(r.peek().unwrap().unwrap().data, &b"live"[..]);
    let expired_count: u64 = q.stats().readers.iter().map(|r| r.expired).sum();
    assert_eq!(expired_count, 3000);

    let config = QueueConfig {
        max_items: 3001,
        discard_old_when_full: true,
        ..Default::default()
    };
    let q = store.queue("full").unwrap();
    q.set_config(config);
    q.reader("").unwrap();
    q.append_batch(&refs, past).unwrap();
    q.append(b"first live", AppendOptions::default()).unwrap();
    q.append(b"second live", AppendOptions::default())
        .expect("expired items make room");
}
