#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic
use std::time::Duration;
mod common;

use weir::*;

#[test]
fn basics() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = QueueConfig {
        segment_size_bytes: 4096,
        ..Default::default()
    };
    let store = Store::open_with(
        dir.path(),
        StoreOptions {
            defaults: cfg.clone(),
            config_for: None,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let q = store.queue("q").unwrap();
    for i in 0..1000u32 {
        q.append(
            format!("item{i}").as_bytes(),
            AppendOptions {
                flags: i,
                ..Default::default()
            },
        )
        .unwrap();
    }
    let r = q.reader("").unwrap();
    let a = r.take_leased().unwrap().unwrap();
    assert_eq!(&a.item.data[..], b"item0");
    let b = r.take().unwrap().unwrap();
    assert_eq!(&b.data[..], b"item1");
    assert!(r.release(a.id).unwrap());
    let c = r.take().unwrap().unwrap();
    assert_eq!(&c.data[..], b"item0");
    let it: Vec<_> = q.iter().unwrap().map(|i| i.unwrap().seq).collect();
    assert_eq!(it.len(), 998);
    let l = r.take_leased().unwrap().unwrap();
    assert_eq!(l.item.seq, 3);
    for i in 4..=500u64 {
        assert_eq!(r.take().unwrap().unwrap().seq, i);
    }
    let state = q.stats();
    assert_eq!(state.items, 501, "{state:?}");
    drop(q);
    drop(r);
    store.close().unwrap();
    let store = Store::open_with(
        dir.path(),
        StoreOptions {
            defaults: cfg,
            config_for: None,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    assert_eq!(
        r.take().unwrap().unwrap().seq,
        3,
        "lease comes back after reopen"
    );
    assert_eq!(r.take().unwrap().unwrap().seq, 501);
    let state = q.stats();
    assert_eq!(state.items, 499, "{state:?}");
    let files = std::fs::read_dir(dir.path().join("queues/q"))
        .unwrap()
        .count();
    assert!(files < 20, "segments reclaimed: {files}");
    // blocking
    let r2 = r.clone();
    let q2 = q.clone();
    let n = r.take_batch(10000).unwrap().len();
    assert_eq!(n, 499);
    // Appends once the take below is waiting (seen in the queue's stats), so the test
    // is of a wake-up, however slow the machine.
    let h = std::thread::spawn(move || {
        assert!(common::wait_until(Duration::from_secs(5), || q2
            .stats()
            .waiters
            >= 1));
        q2.append(b"late", AppendOptions::default()).unwrap();
    });
    let t = r2
        .take_timeout(TakeMode::Take, Duration::from_secs(5))
        .unwrap()
        .unwrap();
    assert_eq!(&t.item.data[..], b"late");
    h.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_wait() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let r = q.reader("x").unwrap();
    let t0 = std::time::Instant::now();
    assert!(r
        .take_async(TakeMode::Take, Duration::from_millis(100))
        .await
        .unwrap()
        .is_none());
    assert!(t0.elapsed() >= Duration::from_millis(100));
    let q2 = q.clone();
    tokio::spawn(async move {
        // Once the take below waits (seen in the stats): a wake-up, not a race.
        while q2.stats().waiters == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        q2.append_async(bytes::Bytes::from_static(b"hi"), AppendOptions::default())
            .await
            .unwrap();
    });
    let got = r
        .take_async(TakeMode::Take, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&got.item.data[..], b"hi");
    assert!(t0.elapsed() < Duration::from_secs(2));
}

#[test]
fn synced_threads() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = QueueConfig {
        durability: Durability::Synced,
        ..Default::default()
    };
    let store = Store::open_with(
        dir.path(),
        StoreOptions {
            defaults: cfg,
            config_for: None,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let q = store.queue("s").unwrap();
    std::thread::scope(|s| {
        for _ in 0..8 {
            let q = q.clone();
            s.spawn(move || {
                for _ in 0..50 {
                    q.append(b"x", AppendOptions::default()).unwrap();
                }
            });
        }
    });
    assert_eq!(q.stats().items, 400);
    assert!(Store::open(dir.path()).unwrap_err().kind() == ErrorKind::Locked);
}
