//! Unit-level behaviour of the public API: names, error kinds, items (0 bytes, flags,
//! expiry), leases, readers, flush and delete, iteration, batches, blocking takes,
//! limits and stats. Each test opens its own store in its own temporary directory.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

// `is_multiple_of` is newer than the crate's rust-version (1.85).
#![allow(unknown_lints, clippy::manual_is_multiple_of)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{now_ms, open_on_manual_clock, open_with_config, payload, small_segments};
use weir::{AppendOptions, ErrorKind, QueueConfig, Store, StoreOptions, TakeMode, NAME_LENGTH_MAX};

fn opts() -> AppendOptions {
    AppendOptions::default()
}

fn flags(flags: u32) -> AppendOptions {
    AppendOptions {
        flags,
        ..AppendOptions::default()
    }
}

fn expiring_at(expires_at_ms: u64) -> AppendOptions {
    AppendOptions {
        expires_at_ms,
        ..AppendOptions::default()
    }
}

fn seqs_of(items: &[weir::Item]) -> Vec<u64> {
    items.iter().map(|i| i.seq).collect()
}

fn iter_seqs(q: &weir::Queue) -> Vec<u64> {
    q.iter()
        .expect("iter")
        .map(|r| r.expect("iter item").seq)
        .collect()
}

#[test]
fn handles_are_send_sync_and_clone() {
    fn check<T: Send + Sync + Clone + 'static>() {}
    check::<Store>();
    check::<weir::Queue>();
    check::<weir::Reader>();
    fn check_error<T: Send + Sync + std::error::Error + 'static>() {}
    check_error::<weir::Error>();
}

#[test]
fn invalid_queue_names_are_refused_and_never_become_paths() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let too_long = "a".repeat(NAME_LENGTH_MAX + 1);
    let bad: Vec<&str> = vec![
        "", "../x", "a/b", "..", ".", "a.b", "a b", "é", "a\0b", "/abs", &too_long,
    ];
    for name in &bad {
        let err = store.queue(name).expect_err(name);
        assert_eq!(err.kind(), ErrorKind::InvalidName, "queue({name:?}): {err}");
        let err = store.existing_queue(name).expect_err(name);
        assert_eq!(
            err.kind(),
            ErrorKind::InvalidName,
            "existing_queue({name:?})"
        );
        let err = store.delete_queue(name).expect_err(name);
        assert_eq!(err.kind(), ErrorKind::InvalidName, "delete_queue({name:?})");
    }
    assert!(store.queue_names().is_empty());
    // Nothing was created outside (or inside) the queue directory.
    assert!(!dir.path().join("x").exists());
    assert!(!dir.path().join("queues").join("a").exists());
    let inside: Vec<_> = std::fs::read_dir(dir.path().join("queues"))
        .unwrap()
        .collect();
    assert!(inside.is_empty(), "queues/ should be empty: {inside:?}");

    // 100 bytes is the longest accepted name.
    let longest = "b".repeat(NAME_LENGTH_MAX);
    let q = store.queue(&longest).unwrap();
    assert_eq!(q.name(), longest);
    store.queue("db_bench-0:x").unwrap();
    assert_eq!(
        store.queue_names(),
        vec![longest.clone(), "db_bench-0:x".to_string()]
    );
}

#[test]
fn invalid_reader_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let too_long = "r".repeat(NAME_LENGTH_MAX + 1);
    for name in ["../x", "a/b", "a.b", "a b", too_long.as_str()] {
        let err = q.reader(name).expect_err(name);
        assert_eq!(err.kind(), ErrorKind::InvalidName, "reader({name:?})");
    }
    // The default reader has the empty name; 100 bytes is fine.
    assert_eq!(q.reader("").unwrap().name(), "");
    q.reader(&"r".repeat(NAME_LENGTH_MAX)).unwrap();
    let mut names = q.reader_names();
    names.sort();
    assert_eq!(names, vec![String::new(), "r".repeat(NAME_LENGTH_MAX)]);
}

#[test]
fn sequence_numbers_start_at_one_and_increase() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let mut last = 0;
    for i in 0..10u64 {
        let seq = q.append(&payload(i, 10), opts()).unwrap();
        if i == 0 {
            assert_eq!(seq, 1, "the first item's seq is 1");
        }
        assert!(seq > last, "seq {seq} after {last}");
        last = seq;
    }
    drop(q);
    store.close().unwrap();
    // Still increasing after a reopen.
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let seq = q.append(b"after", opts()).unwrap();
    assert!(seq > last, "seq {seq} after reopen, last before {last}");
}

#[test]
fn zero_byte_items_round_trip_with_flags() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let s1 = q.append(b"", flags(7)).unwrap();
    let s2 = q.append(b"", flags(u32::MAX)).unwrap();
    let s3 = q.append(b"x", flags(0)).unwrap();
    assert_eq!(iter_seqs(&q), vec![s1, s2, s3]);
    let r = q.reader("").unwrap();
    let peeked = r.peek().unwrap().expect("peek");
    assert_eq!((peeked.seq, peeked.data.len(), peeked.flags), (s1, 0, 7));
    let a = r.take().unwrap().expect("take");
    assert_eq!((a.seq, a.data.len(), a.flags), (s1, 0, 7));
    drop((q, r));
    store.close().unwrap();

    let store = Store::open(dir.path()).unwrap();
    let r = store.queue("q").unwrap().reader("").unwrap();
    let b = r.take().unwrap().expect("0-byte item after reopen");
    assert_eq!((b.seq, b.data.len(), b.flags), (s2, 0, u32::MAX));
    let c = r.take().unwrap().expect("1-byte item");
    assert_eq!((c.seq, &c.data[..], c.flags), (s3, &b"x"[..], 0));
    assert!(r.take().unwrap().is_none());
}

#[test]
fn item_fields_are_returned() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let before = now_ms();
    let expires = now_ms() + 3_600_000;
    let seq = q
        .append(
            b"hello",
            AppendOptions {
                flags: 42,
                expires_at_ms: expires,
                sync: false,
                job: None,
            },
        )
        .unwrap();
    let after = now_ms();
    let item = q.reader("").unwrap().take().unwrap().unwrap();
    assert_eq!(item.seq, seq);
    assert_eq!(&item.data[..], b"hello");
    assert_eq!(item.flags, 42);
    assert_eq!(item.expires_at_ms, expires);
    assert!(
        (before..=after).contains(&item.enqueued_at_ms),
        "enqueued_at_ms {} not in {before}..={after}",
        item.enqueued_at_ms
    );
    assert!(!item.is_expired_at(now_ms(), None));
    assert!(item.is_expired_at(expires, None));
}

#[test]
fn too_large_items_are_refused_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with_config(
        dir.path(),
        QueueConfig {
            max_item_size_bytes: 100,
            ..QueueConfig::default()
        },
    )
    .unwrap();
    let q = store.queue("q").unwrap();
    q.append(&[1u8; 100], opts())
        .expect("exactly the limit is accepted");
    let err = q.append(&[1u8; 101], opts()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge, "{err}");
    // A batch is all or none.
    let err = q
        .append_batch(&[&[2u8; 10], &[3u8; 101], &[4u8; 10]], opts())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge, "{err}");
    assert_eq!(q.stats().items, 1);
    assert_eq!(q.stats().total_items, 1);
    let r = q.reader("").unwrap();
    assert_eq!(r.take().unwrap().unwrap().data.len(), 100);
    assert!(r.take().unwrap().is_none());
}

#[test]
fn max_items_refuses_appends_when_full() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with_config(
        dir.path(),
        QueueConfig {
            max_items: 3,
            ..QueueConfig::default()
        },
    )
    .unwrap();
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    for i in 0..3 {
        q.append(&payload(i, 5), opts()).unwrap();
    }
    let err = q.append(b"four", opts()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Full, "{err}");
    assert_eq!(q.stats().items, 3);
    // Taking one makes room for one.
    assert!(r.take().unwrap().is_some());
    q.append(b"four", opts()).unwrap();
    let err = q.append(b"five", opts()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Full, "{err}");
    // A leased item is still kept (not confirmed), so it still counts.
    let lease = r.take_leased().unwrap().unwrap();
    assert_eq!(
        q.append(b"five", opts()).unwrap_err().kind(),
        ErrorKind::Full
    );
    assert!(r.confirm(lease.id).unwrap());
    q.append(b"five", opts()).unwrap();
    let rest: Vec<Vec<u8>> = std::iter::from_fn(|| r.take().unwrap())
        .map(|i| i.data.to_vec())
        .collect();
    assert_eq!(
        rest,
        vec![payload(2, 5), b"four".to_vec(), b"five".to_vec()]
    );
}

#[test]
fn max_bytes_refuses_appends_when_full() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with_config(
        dir.path(),
        QueueConfig {
            max_bytes: 10,
            ..QueueConfig::default()
        },
    )
    .unwrap();
    let q = store.queue("q").unwrap();
    q.append(&[1; 5], opts()).unwrap();
    q.append(&[2; 5], opts()).unwrap();
    assert_eq!(q.stats().bytes, 10);
    let err = q.append(&[3; 1], opts()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Full, "{err}");
    // Taking one makes room again.
    let r = q.reader("").unwrap();
    assert_eq!(&r.take().unwrap().unwrap().data[..], &[1; 5]);
    q.append(&[3; 5], opts()).unwrap();
    assert_eq!(q.stats().bytes, 10);
}

#[test]
fn discard_old_when_full_drops_the_oldest() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with_config(
        dir.path(),
        QueueConfig {
            max_items: 3,
            discard_old_when_full: true,
            ..QueueConfig::default()
        },
    )
    .unwrap();
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    let seqs: Vec<u64> = (0..5)
        .map(|i| q.append(&payload(i, 9), opts()).unwrap())
        .collect();
    let stats = q.stats();
    assert_eq!(stats.items, 3);
    assert_eq!(stats.discarded, 2);
    assert_eq!(stats.total_items, 5);
    assert_eq!(stats.readers[0].discarded, 2);
    assert_eq!(iter_seqs(&q), seqs[2..].to_vec());
    let got: Vec<u64> = std::iter::from_fn(|| r.take().unwrap())
        .map(|i| i.seq)
        .collect();
    assert_eq!(got, seqs[2..].to_vec());
}

#[test]
fn second_open_of_a_directory_is_locked() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let err = Store::open(dir.path()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Locked, "{err}");
    // Still locked while any clone lives.
    let clone = store.clone();
    drop(store);
    assert_eq!(
        Store::open(dir.path()).unwrap_err().kind(),
        ErrorKind::Locked
    );
    clone.close().unwrap();
    let again = Store::open(dir.path()).expect("open after close");
    drop(again);
    Store::open(dir.path()).expect("open after drop");
}

#[test]
fn closed_store_refuses_calls() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    q.append(b"1", opts()).unwrap();
    let other = store.clone();
    store.close().unwrap();
    assert_eq!(other.queue("q").unwrap_err().kind(), ErrorKind::Closed);
    let err = q.append(b"2", opts()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Closed, "append after close: {err}");
    drop(q);
    drop(other);
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.queue("q").unwrap().stats().items, 1);
}

#[test]
fn deleted_queue_handles_get_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("gone").unwrap();
    let r = q.reader("").unwrap();
    q.append(b"one", opts()).unwrap();
    assert!(dir.path().join("queues").join("gone").is_dir());
    assert!(store.delete_queue("gone").unwrap());
    assert!(!dir.path().join("queues").join("gone").exists());
    assert!(store.existing_queue("gone").unwrap().is_none());
    assert!(store.queue_names().is_empty());
    assert!(!store.delete_queue("gone").unwrap());

    let err = q.append(b"two", opts()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "append: {err}");
    let err = r.take().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "take: {err}");
    let err = r.take_leased().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "take_leased: {err}");
    let err = q.reader("other").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "reader: {err}");

    // A queue of the same name starts empty, and survives a reopen empty.
    let q2 = store.queue("gone").unwrap();
    assert_eq!(q2.stats().items, 0);
    assert!(q2.reader("").unwrap().take().unwrap().is_none());
    drop((q, r, q2));
    store.close().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("gone").unwrap();
    assert!(q.reader("").unwrap().take().unwrap().is_none());
}

#[test]
fn deleted_queue_stays_deleted_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.queue("a").unwrap().append(b"1", opts()).unwrap();
    store.queue("b").unwrap().append(b"2", opts()).unwrap();
    assert!(store.delete_queue("a").unwrap());
    store.close().unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.queue_names(), vec!["b".to_string()]);
}

#[test]
fn fanout_every_reader_sees_every_item() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let a = q.reader("a").unwrap();
    let b = q.reader("b").unwrap();
    let seqs: Vec<u64> = (0..5)
        .map(|i| q.append(&payload(i, 20), opts()).unwrap())
        .collect();
    let from_a: Vec<u64> = std::iter::from_fn(|| a.take().unwrap())
        .map(|i| i.seq)
        .collect();
    assert_eq!(from_a, seqs);
    // b still sees them all, and the queue keeps them for b.
    assert_eq!(q.stats().items, 5);
    assert_eq!(iter_seqs(&q), seqs);
    let from_b: Vec<u64> = std::iter::from_fn(|| b.take().unwrap())
        .map(|i| i.seq)
        .collect();
    assert_eq!(from_b, seqs);
    assert_eq!(q.stats().items, 0);
    assert!(iter_seqs(&q).is_empty());
}

#[test]
fn handles_on_one_reader_compete() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let h1 = q.reader("w").unwrap();
    let h2 = q.reader("w").unwrap();
    for i in 0..4 {
        q.append(&payload(i, 8), opts()).unwrap();
    }
    let x = h1.take().unwrap().unwrap();
    let y = h2.take().unwrap().unwrap();
    let z = h1.take_leased().unwrap().unwrap();
    let w = h2.take().unwrap().unwrap();
    assert_eq!(
        vec![x.seq, y.seq, z.item.seq, w.seq],
        vec![1, 2, 3, 4],
        "the two handles share one position"
    );
    assert!(h1.take().unwrap().is_none());
    // A lease taken through one handle can be confirmed through the other.
    assert!(h2.confirm(z.id).unwrap());
}

#[test]
fn a_new_reader_starts_at_the_oldest_kept_item() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    // No reader yet: everything is kept.
    for i in 1..=3 {
        q.append(&payload(i, 4), opts()).unwrap();
    }
    assert_eq!(q.stats().items, 3);
    let a = q.reader("a").unwrap();
    assert_eq!(a.peek().unwrap().unwrap().seq, 1);
    // a confirms everything: nothing is kept any more.
    for _ in 0..3 {
        a.take().unwrap().unwrap();
    }
    q.append(&payload(4, 4), opts()).unwrap();
    let b = q.reader("b").unwrap();
    assert_eq!(
        b.take().unwrap().map(|i| i.seq),
        Some(4),
        "b starts at the oldest kept item"
    );
    assert!(b.take().unwrap().is_none());
    assert_eq!(a.take().unwrap().map(|i| i.seq), Some(4));
}

#[test]
fn leases_confirm_and_release() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    for i in 1..=5 {
        q.append(&payload(i, 16), opts()).unwrap();
    }
    let l1 = r.take_leased().unwrap().unwrap();
    let l2 = r.take_leased().unwrap().unwrap();
    let l3 = r.take_leased().unwrap().unwrap();
    assert_eq!(
        (l1.item.seq, l2.item.seq, l3.item.seq),
        (1, 2, 3),
        "leases hand out items in order"
    );
    assert_eq!(&l2.item.data[..], &payload(2, 16)[..]);
    assert_ne!(l1.id, l2.id);
    let s = q.stats();
    assert_eq!(s.open_leases, 3);
    assert_eq!(s.readers[0].open_leases, 3);
    assert_eq!(s.readers[0].items, 5, "leased items are not yet confirmed");

    // Released items come back ahead of newer ones, in seq order.
    assert!(r.release(l3.id).unwrap());
    assert!(r.release(l1.id).unwrap());
    assert!(!r.release(l1.id).unwrap(), "a lease releases once");
    assert_eq!(r.peek().unwrap().unwrap().seq, 1);
    assert_eq!(r.take().unwrap().unwrap().seq, 1);
    assert_eq!(r.take().unwrap().unwrap().seq, 3);
    assert_eq!(r.take().unwrap().unwrap().seq, 4);

    // Confirm is once only; a released lease cannot be confirmed.
    assert!(r.confirm(l2.id).unwrap());
    assert!(!r.confirm(l2.id).unwrap());
    assert!(!r.confirm(l3.id).unwrap());
    assert!(!r.confirm(weir::LeaseId(u64::MAX)).unwrap());
    assert_eq!(r.take().unwrap().unwrap().seq, 5);
    assert!(r.take().unwrap().is_none());
    assert_eq!(q.stats().open_leases, 0);
    assert_eq!(q.stats().items, 0);
}

#[test]
fn take_mode_and_peek() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    assert!(r.peek().unwrap().is_none());
    assert!(r.take_mode(TakeMode::Lease).unwrap().is_none());
    q.append(b"a", opts()).unwrap();
    q.append(b"b", opts()).unwrap();
    let p = r.take_mode(TakeMode::Peek).unwrap().unwrap();
    assert_eq!((p.item.seq, p.lease), (1, None));
    let p2 = r.peek().unwrap().unwrap();
    assert_eq!(p2.seq, 1, "peek takes nothing");
    let l = r.take_mode(TakeMode::Lease).unwrap().unwrap();
    assert_eq!(l.item.seq, 1);
    let lease = l.lease.expect("Lease mode returns a lease id");
    assert_eq!(r.peek().unwrap().unwrap().seq, 2, "peek skips leased items");
    let t = r.take_mode(TakeMode::Take).unwrap().unwrap();
    assert_eq!((t.item.seq, t.lease), (2, None));
    assert!(r.release(lease).unwrap());
    assert_eq!(r.peek().unwrap().unwrap().seq, 1);
}

#[test]
fn lease_timeout_releases_the_item() {
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = open_on_manual_clock(
        dir.path(),
        QueueConfig {
            open_timeout: Some(Duration::from_millis(100)),
            ..QueueConfig::default()
        },
    );
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    q.append(b"a", opts()).unwrap();
    q.append(b"b", opts()).unwrap();
    let l = r.take_leased().unwrap().unwrap();
    assert_eq!(l.item.seq, 1);
    clock.advance(Duration::from_millis(99));
    assert_eq!(q.stats().open_leases, 1);
    clock.advance(Duration::from_millis(1));
    // The background thread times it out at its next tick (20 ms of real time).
    assert!(
        common::wait_until(Duration::from_secs(3), || q.stats().open_leases == 0),
        "the lease was not released within 3 s of its open_timeout passing"
    );
    assert!(!r.confirm(l.id).unwrap(), "a timed-out lease is unknown");
    let again = r.take_leased().unwrap().unwrap();
    assert_eq!(again.item.seq, 1, "the timed-out item comes back first");
    assert!(r.confirm(again.id).unwrap());
    assert_eq!(r.take().unwrap().unwrap().seq, 2);
}

#[test]
fn leases_open_at_close_are_delivered_again_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open_with_config(dir.path(), small_segments(4096)).unwrap();
        let q = store.queue("q").unwrap();
        let r = q.reader("").unwrap();
        for i in 1..=6 {
            q.append(&payload(i, 300), opts()).unwrap();
        }
        let l1 = r.take_leased().unwrap().unwrap();
        let l2 = r.take_leased().unwrap().unwrap();
        assert!(r.take().unwrap().is_some()); // 3 confirmed
        assert!(r.confirm(l2.id).unwrap()); // 2 confirmed
        let _l4 = r.take_leased().unwrap().unwrap(); // 4 open at close
        assert_eq!(l1.item.seq, 1);
        drop((q, r));
        store.close().unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    assert_eq!(q.stats().open_leases, 0);
    let r = q.reader("").unwrap();
    let got: Vec<(u64, bool)> = std::iter::from_fn(|| r.take().unwrap())
        .map(|i| (i.seq, i.data[..] == payload(i.seq, 300)[..]))
        .collect();
    assert_eq!(
        got,
        vec![(1, true), (4, true), (5, true), (6, true)],
        "leases come back, confirmed items never"
    );
}

#[test]
fn reader_flush_and_queue_flush() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let a = q.reader("a").unwrap();
    let b = q.reader("b").unwrap();
    let c = q.reader("c").unwrap();
    for i in 1..=5 {
        q.append(&payload(i, 3), opts()).unwrap();
    }
    b.take().unwrap().unwrap();
    assert_eq!(a.flush().unwrap(), 5);
    assert!(a.take().unwrap().is_none());
    assert_eq!(
        b.take().unwrap().unwrap().seq,
        2,
        "flushing a leaves b alone"
    );
    assert_eq!(c.peek().unwrap().unwrap().seq, 1);
    // The queue flush returns what the most-behind reader (c) lost.
    assert_eq!(q.flush().unwrap(), 5);
    for r in [&a, &b, &c] {
        assert!(r.take().unwrap().is_none());
    }
    assert_eq!(q.stats().items, 0);
    assert!(iter_seqs(&q).is_empty());
    // Items appended after a flush are delivered to everyone.
    let s = q.append(b"new", opts()).unwrap();
    for r in [&a, &b, &c] {
        assert_eq!(r.take().unwrap().unwrap().seq, s);
    }
    // Flushes persist.
    q.append(b"flushed", opts()).unwrap();
    q.flush().unwrap();
    drop((q, a, b, c));
    store.close().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    assert_eq!(q.stats().items, 0);
    for name in ["a", "b", "c"] {
        assert!(q.reader(name).unwrap().take().unwrap().is_none(), "{name}");
    }
}

#[test]
fn flush_of_a_queue_without_readers_drops_everything() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    for i in 1..=4 {
        q.append(&payload(i, 3), opts()).unwrap();
    }
    assert_eq!(q.flush().unwrap(), 4);
    assert_eq!(q.stats().items, 0);
    let s = q.append(b"x", opts()).unwrap();
    assert_eq!(q.reader("").unwrap().take().unwrap().unwrap().seq, s);
}

#[test]
fn delete_reader_forgets_its_position() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let a = q.reader("a").unwrap();
    let b = q.reader("b").unwrap();
    for i in 1..=3 {
        q.append(&payload(i, 3), opts()).unwrap();
    }
    a.take().unwrap().unwrap();
    b.take().unwrap().unwrap();
    b.take().unwrap().unwrap();
    assert!(q.delete_reader("b").unwrap());
    assert!(!q.delete_reader("b").unwrap());
    assert_eq!(q.reader_names(), vec!["a".to_string()]);
    assert_eq!(q.stats().readers.len(), 1);
    // b comes back at the oldest kept item, which a still holds.
    let b = q.reader("b").unwrap();
    assert_eq!(b.take().unwrap().unwrap().seq, 2);
    // Deletion persists.
    assert!(q.delete_reader("a").unwrap());
    drop((q, a, b));
    store.close().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    assert_eq!(q.reader_names(), vec!["b".to_string()]);
}

#[test]
fn expired_items_are_never_delivered_and_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = open_on_manual_clock(dir.path(), QueueConfig::default());
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    let now = clock.now_ms();
    q.append(b"past", expiring_at(now - 1_000)).unwrap();
    q.append(b"past-too", expiring_at(1)).unwrap();
    let live = q.append(b"live", expiring_at(now + 3_600_000)).unwrap();
    let soon = q.append(b"soon", expiring_at(now + 150)).unwrap();
    assert_eq!(r.peek().unwrap().unwrap().seq, live);
    let item = r.take().unwrap().unwrap();
    assert_eq!((&item.data[..], item.seq), (&b"live"[..], live));
    clock.advance(Duration::from_millis(149));
    assert_eq!(r.peek().unwrap().unwrap().seq, soon, "1 ms before its time");
    clock.advance(Duration::from_millis(1));
    assert!(r.take().unwrap().is_none(), "'soon' expired at its time");
    assert!(r.take_leased().unwrap().is_none());
    let stats = q.stats();
    assert_eq!(stats.readers[0].expired, 3, "{stats:?}");
    assert_eq!(stats.expired, 3, "{stats:?}");
    assert_eq!(stats.items, 0);
}

#[test]
fn expire_drops_expired_items_at_the_head() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    for _ in 0..3 {
        q.append(b"old", expiring_at(now_ms() - 1)).unwrap();
    }
    let live = q.append(b"live", opts()).unwrap();
    assert_eq!(q.expire().unwrap(), 3);
    assert_eq!(q.expire().unwrap(), 0);
    let stats = q.stats();
    assert_eq!(stats.items, 1);
    assert_eq!(stats.expired, 3);
    assert_eq!(iter_seqs(&q), vec![live]);
    assert_eq!(r.take().unwrap().unwrap().seq, live);
}

#[test]
fn expire_before_and_after_the_head_is_due_with_and_without_readers() {
    // `expire` remembers when the head can expire at the earliest and answers from
    // memory before then: it must still drop the head once that time has come, and
    // forget what it remembered when the settings change.
    for with_reader in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (store, clock) = open_on_manual_clock(dir.path(), QueueConfig::default());
        let q = store.queue("q").unwrap();
        let r = with_reader.then(|| q.reader("").unwrap());
        let due = clock.now_ms() + 300;
        q.append(b"soon", expiring_at(due)).unwrap();
        q.append(b"never", opts()).unwrap();
        assert_eq!(q.expire().unwrap(), 0, "not due yet");
        clock.advance(Duration::from_millis(299));
        assert_eq!(q.expire().unwrap(), 0, "still not due, 1 ms before");
        clock.advance(Duration::from_millis(1));
        assert_eq!(q.expire().unwrap(), 1, "due now (reader: {with_reader})");
        assert_eq!(q.expire().unwrap(), 0);
        // A max_age set later applies to the head seen before it.
        store.set_options(StoreOptions {
            defaults: QueueConfig {
                max_age: Some(Duration::from_millis(1)),
                ..QueueConfig::default()
            },
            clock: clock.clock(),
            ..StoreOptions::default()
        });
        assert_eq!(q.expire().unwrap(), 1, "max_age (reader: {with_reader})");
        assert_eq!(q.stats().items, 0);
        drop(r);
    }
}

#[test]
fn max_age_expires_old_items() {
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = open_on_manual_clock(
        dir.path(),
        QueueConfig {
            max_age: Some(Duration::from_millis(100)),
            ..QueueConfig::default()
        },
    );
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    q.append(b"old", opts()).unwrap();
    clock.advance(Duration::from_millis(99));
    assert_eq!(q.iter().unwrap().count(), 1, "1 ms before its max_age");
    clock.advance(Duration::from_millis(1));
    let fresh = q.append(b"fresh", opts()).unwrap();
    assert_eq!(r.take().unwrap().unwrap().seq, fresh);
    assert_eq!(q.stats().expired, 1);
}

/// An item, the queue and its iterator agree on when it expires, `max_age` included:
/// `Item::is_expired_at` once ignored `max_age` and called an item the queue no longer
/// hands out unexpired.
#[test]
fn an_item_the_queue_expires_by_max_age_says_it_has_expired() {
    let dir = tempfile::tempdir().unwrap();
    let max_age = Some(Duration::from_millis(100));
    let (store, clock) = open_on_manual_clock(
        dir.path(),
        QueueConfig {
            max_age,
            ..QueueConfig::default()
        },
    );
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    q.append(b"old", opts()).unwrap();
    let item = r.peek().unwrap().unwrap();
    assert_eq!(item.expiry_ms(max_age), item.enqueued_at_ms + 100);
    assert!(!item.is_expired_at(item.enqueued_at_ms + 99, max_age));
    assert!(item.is_expired_at(item.enqueued_at_ms + 100, max_age));
    clock.advance(Duration::from_millis(100));
    assert!(item.is_expired_at(clock.now_ms(), max_age));
    assert_eq!(q.iter().unwrap().count(), 0, "the iterator skips it");
    assert!(r.take().unwrap().is_none(), "the queue expires it");
    assert_eq!(q.stats().expired, 1);
}

#[test]
fn expire_to_moves_expired_items_to_another_queue() {
    let dir = tempfile::tempdir().unwrap();
    let config_for: weir::ConfigFn = Arc::new(|name: &str| QueueConfig {
        expire_to: (name == "src").then(|| "dead".to_string()),
        ..QueueConfig::default()
    });
    let store = Store::open_with(
        dir.path(),
        StoreOptions {
            defaults: QueueConfig::default(),
            config_for: Some(config_for),
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let src = store.queue("src").unwrap();
    let dead = store.queue("dead").unwrap();
    let src_r = src.reader("").unwrap();
    let dead_r = dead.reader("").unwrap();
    let past = now_ms() - 10;
    src.append(
        b"e1",
        AppendOptions {
            flags: 5,
            expires_at_ms: past,
            sync: false,
            job: None,
        },
    )
    .unwrap();
    src.append(b"e2", expiring_at(past)).unwrap();
    let live = src.append(b"live", opts()).unwrap();
    assert_eq!(src.expire().unwrap(), 2);
    assert_eq!(src.stats().expired, 2);
    assert_eq!(src_r.take().unwrap().unwrap().seq, live);
    let moved: Vec<(Vec<u8>, u32)> = std::iter::from_fn(|| dead_r.take().unwrap())
        .map(|i| (i.data.to_vec(), i.flags))
        .collect();
    assert_eq!(
        moved,
        vec![(b"e1".to_vec(), 5), (b"e2".to_vec(), 0)],
        "expired items move to expire_to in order, with their flags, deliverable there"
    );
}

#[test]
fn expire_to_also_applies_when_a_take_skips_expired_items() {
    let dir = tempfile::tempdir().unwrap();
    let config_for: weir::ConfigFn = Arc::new(|name: &str| QueueConfig {
        expire_to: (name == "src").then(|| "dead".to_string()),
        ..QueueConfig::default()
    });
    let store = Store::open_with(
        dir.path(),
        StoreOptions {
            defaults: QueueConfig::default(),
            config_for: Some(config_for),
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let src = store.queue("src").unwrap();
    let dead_r = store.queue("dead").unwrap().reader("").unwrap();
    let src_r = src.reader("").unwrap();
    src.append(b"e1", expiring_at(now_ms() - 10)).unwrap();
    let live = src.append(b"live", opts()).unwrap();
    assert_eq!(src_r.take().unwrap().unwrap().seq, live);
    let moved = dead_r.take().unwrap().expect("the skipped item was moved");
    assert_eq!(&moved.data[..], b"e1");
}

#[test]
fn iter_reads_every_kept_item_without_consuming() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with_config(dir.path(), small_segments(4096)).unwrap();
    let q = store.queue("q").unwrap();
    assert!(iter_seqs(&q).is_empty());
    let seqs: Vec<u64> = (0..200u64)
        .map(|i| {
            q.append(&payload(i, (i as usize * 13) % 200), flags(i as u32))
                .unwrap()
        })
        .collect();
    // No reader: everything is kept.
    let items: Vec<weir::Item> = q.iter().unwrap().map(|r| r.unwrap()).collect();
    assert_eq!(seqs_of(&items), seqs);
    for (i, item) in items.iter().enumerate() {
        assert_eq!(&item.data[..], &payload(i as u64, (i * 13) % 200)[..]);
        assert_eq!(item.flags, i as u32);
    }
    let a = q.reader("a").unwrap();
    let b = q.reader("b").unwrap();
    for _ in 0..150 {
        a.take().unwrap().unwrap();
    }
    for _ in 0..100 {
        b.take().unwrap().unwrap();
    }
    // Kept: not yet confirmed by every reader.
    assert_eq!(iter_seqs(&q), seqs[100..].to_vec());
    assert_eq!(iter_seqs(&q), seqs[100..].to_vec(), "iter consumes nothing");
    assert_eq!(b.peek().unwrap().unwrap().seq, seqs[100]);
    // An iterator taken now is not disturbed by appends and takes meanwhile.
    let it = q.iter().unwrap();
    q.append(b"late", opts()).unwrap();
    b.take().unwrap().unwrap();
    let got: Vec<u64> = it.map(|r| r.unwrap().seq).collect();
    assert!(
        got.len() >= 99 && got.windows(2).all(|w| w[0] < w[1]),
        "a live iterator still yields items in order: {got:?}"
    );
}

#[test]
fn append_batch_and_take_batch() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let data: Vec<Vec<u8>> = (0..10).map(|i| payload(i, i as usize * 3)).collect();
    let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    let first = q.append_batch(&refs, flags(9)).unwrap();
    assert_eq!(first, 1);
    assert_eq!(q.stats().items, 10);
    let r = q.reader("").unwrap();
    let four = r.take_batch(4).unwrap();
    assert_eq!(seqs_of(&four), vec![1, 2, 3, 4]);
    let rest = r.take_batch(100).unwrap();
    assert_eq!(seqs_of(&rest), (5..=10).collect::<Vec<u64>>());
    for item in four.iter().chain(rest.iter()) {
        let i = item.seq - 1;
        assert_eq!(&item.data[..], &payload(i, i as usize * 3)[..]);
        assert_eq!(item.flags, 9);
    }
    assert!(r.take_batch(5).unwrap().is_empty());
    assert_eq!(q.stats().items, 0, "take_batch confirms");
    let next = q.append_batch(&[b"x", b"", b"z"], opts()).unwrap();
    assert_eq!(next, 11, "seqs continue after a batch");
    // An empty batch stores nothing (or is refused as an invalid argument).
    match q.append_batch(&[], opts()) {
        Ok(_) => {}
        Err(e) => assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}"),
    }
    assert_eq!(q.stats().items, 3);
    // take_batch skips leased items and leaves them leased.
    let l = r.take_leased().unwrap().unwrap();
    let got = r.take_batch(10).unwrap();
    assert_eq!(seqs_of(&got), vec![12, 13]);
    assert!(r.release(l.id).unwrap());
    assert_eq!(seqs_of(&r.take_batch(10).unwrap()), vec![11]);
}

#[test]
fn blocking_take_is_woken_by_an_append() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    let waiter = {
        let r = r.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            let got = r
                .take_timeout(TakeMode::Take, Duration::from_secs(10))
                .unwrap();
            (got, start.elapsed())
        })
    };
    assert!(
        common::wait_until(Duration::from_secs(5), || q.stats().waiters == 1),
        "the blocked taker shows up in stats.waiters"
    );
    assert_eq!(q.stats().readers[0].waiters, 1);
    std::thread::sleep(Duration::from_millis(50));
    let appended_at = Instant::now();
    let seq = q.append(b"wake", opts()).unwrap();
    let (got, _) = waiter.join().unwrap();
    let woke_after = appended_at.elapsed();
    let got = got.expect("the waiter got the item");
    assert_eq!((got.item.seq, &got.item.data[..]), (seq, &b"wake"[..]));
    assert!(
        woke_after < Duration::from_secs(1),
        "woken {woke_after:?} after the append"
    );
    assert_eq!(q.stats().waiters, 0);
    assert!(
        r.take().unwrap().is_none(),
        "the waiter took (and confirmed) it"
    );
}

#[test]
fn blocking_take_times_out_empty() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let r = store.queue("q").unwrap().reader("").unwrap();
    let start = Instant::now();
    let got = r
        .take_timeout(TakeMode::Lease, Duration::from_millis(200))
        .unwrap();
    let waited = start.elapsed();
    assert!(got.is_none());
    assert!(
        waited >= Duration::from_millis(190) && waited < Duration::from_secs(2),
        "waited {waited:?} for a 200 ms timeout"
    );
    // A zero timeout returns at once.
    let start = Instant::now();
    assert!(r
        .take_timeout(TakeMode::Take, Duration::ZERO)
        .unwrap()
        .is_none());
    assert!(start.elapsed() < Duration::from_millis(100));
}

#[test]
fn blocking_lease_from_another_thread() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let r = q.reader("w").unwrap();
    let t = {
        let r = r.clone();
        std::thread::spawn(move || {
            r.take_timeout(TakeMode::Lease, Duration::from_secs(10))
                .unwrap()
        })
    };
    // Appended once the taker waits, so the wake-up is what hands it the item.
    assert!(common::wait_until(Duration::from_secs(5), || q
        .stats()
        .waiters
        == 1));
    q.append(b"job", opts()).unwrap();
    let taken = t.join().unwrap().expect("leased");
    let lease = taken.lease.expect("lease id");
    assert_eq!(q.stats().open_leases, 1);
    assert!(r.confirm(lease).unwrap());
}

#[test]
fn stats_fields() {
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = open_on_manual_clock(dir.path(), QueueConfig::default());
    let q = store.queue("q").unwrap();
    let empty = q.stats();
    assert_eq!(empty.name, "q");
    assert_eq!(
        (empty.items, empty.bytes, empty.total_items, empty.age_ms),
        (0, 0, 0, 0)
    );
    for i in 0..4 {
        q.append(&payload(i, 10), opts()).unwrap();
    }
    let a = q.reader("a").unwrap();
    let b = q.reader("b").unwrap();
    clock.advance(Duration::from_millis(60));
    let lease = a.take_leased().unwrap().unwrap();
    a.take().unwrap().unwrap();
    b.take().unwrap().unwrap();
    b.take().unwrap().unwrap();
    b.take().unwrap().unwrap();
    let s = q.stats();
    assert_eq!(s.total_items, 4);
    assert_eq!(s.items, 3, "a, the most-behind reader, has 3 unconfirmed");
    assert_eq!(s.bytes, 30);
    assert_eq!(s.open_leases, 1);
    assert_eq!(s.waiters, 0);
    assert_eq!(s.expired, 0);
    assert_eq!(s.discarded, 0);
    assert_eq!(s.corrupt_records, 0);
    assert_eq!(s.age_ms, 60, "age of the oldest unconfirmed item");
    assert!(s.disk_bytes >= 40, "disk_bytes {}", s.disk_bytes);
    let mut readers = s.readers.clone();
    readers.sort_by(|x, y| x.name.cmp(&y.name));
    let ra = &readers[0];
    let reader_b = &readers[1];
    assert_eq!(ra.name, "a");
    assert_eq!((ra.items, ra.bytes), (3, 30));
    assert_eq!((ra.taken, ra.confirmed, ra.open_leases), (2, 1, 1));
    assert_eq!(ra.age_ms, 60);
    assert_eq!(reader_b.name, "b");
    assert_eq!((reader_b.items, reader_b.bytes), (1, 10));
    assert_eq!(
        (reader_b.taken, reader_b.confirmed, reader_b.open_leases),
        (3, 3, 0)
    );
    assert!(a.confirm(lease.id).unwrap());
    let s = q.stats();
    assert_eq!(s.items, 2);
    assert_eq!(s.open_leases, 0);
    let ra = s.readers.iter().find(|r| r.name == "a").unwrap();
    assert_eq!((ra.confirmed, ra.items), (2, 2));
    // Empty reader: age 0.
    b.take().unwrap().unwrap();
    let s = q.stats();
    let reader_b = s.readers.iter().find(|r| r.name == "b").unwrap();
    assert_eq!((reader_b.items, reader_b.age_ms), (0, 0));
}

#[test]
fn space_is_reclaimed_by_deleting_segments() {
    let dir = tempfile::tempdir().unwrap();
    let segment_size_bytes = 16 * 1024;
    let store = open_with_config(dir.path(), small_segments(segment_size_bytes)).unwrap();
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    for i in 0..1000 {
        q.append(&payload(i, 500), opts()).unwrap();
    }
    let full = q.stats().disk_bytes;
    let segs = common::segment_files(dir.path(), "q").len();
    assert!(full >= 500_000, "disk_bytes {full} after 500 KB of items");
    assert!(
        segs >= 20,
        "{segs} segment files for 500 KB in 16 KiB segments"
    );
    while r.take_batch(64).unwrap().len() == 64 {}
    let after = q.stats().disk_bytes;
    let segs_after = common::segment_files(dir.path(), "q").len();
    assert!(
        segs_after <= 2 && after <= 3 * segment_size_bytes + 64 * 1024,
        "after taking everything: {segs_after} segments, {after} bytes on disk (was {segs}, {full})"
    );
    // Still works, and still reclaims after a reopen.
    q.append(b"more", opts()).unwrap();
    drop((q, r));
    store.close().unwrap();
    let store = open_with_config(dir.path(), small_segments(segment_size_bytes)).unwrap();
    let q = store.queue("q").unwrap();
    assert_eq!(
        &q.reader("").unwrap().take().unwrap().unwrap().data[..],
        b"more"
    );
}

#[test]
fn flush_reclaims_space() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with_config(dir.path(), small_segments(8 * 1024)).unwrap();
    let q = store.queue("q").unwrap();
    for i in 0..400 {
        q.append(&payload(i, 400), opts()).unwrap();
    }
    assert!(common::segment_files(dir.path(), "q").len() >= 10);
    q.flush().unwrap();
    let segs = common::segment_files(dir.path(), "q").len();
    assert!(segs <= 2, "{segs} segment files left after a flush");
}

#[test]
fn per_append_sync_and_durability_modes() {
    use weir::Durability;
    for durability in [
        Durability::Buffered,
        Durability::Periodic(Duration::from_millis(10)),
        Durability::Synced,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let config = QueueConfig {
            durability,
            segment_size_bytes: 4096,
            ..QueueConfig::default()
        };
        let store = open_with_config(dir.path(), config.clone()).unwrap();
        let q = store.queue("q").unwrap();
        assert_eq!(q.config().durability, durability);
        for i in 0..50 {
            let sync = i % 7 == 0;
            q.append(
                &payload(i, 100),
                AppendOptions {
                    sync,
                    ..AppendOptions::default()
                },
            )
            .unwrap();
        }
        q.sync().unwrap();
        store.sync().unwrap();
        let r = q.reader("").unwrap();
        for _ in 0..10 {
            r.take().unwrap().unwrap();
        }
        drop((q, r));
        store.close().unwrap();
        let store = open_with_config(dir.path(), config).unwrap();
        let r = store.queue("q").unwrap().reader("").unwrap();
        let got: Vec<u64> = std::iter::from_fn(|| r.take().unwrap())
            .map(|i| {
                assert_eq!(&i.data[..], &payload(i.seq - 1, 100)[..]);
                i.seq
            })
            .collect();
        assert_eq!(got, (11..=50).collect::<Vec<u64>>(), "{durability:?}");
    }
}

#[test]
fn set_config_takes_effect() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    q.append(&[0; 50], opts()).unwrap();
    q.set_config(QueueConfig {
        max_item_size_bytes: 10,
        ..QueueConfig::default()
    });
    assert_eq!(q.config().max_item_size_bytes, 10);
    assert_eq!(
        q.append(&[0; 50], opts()).unwrap_err().kind(),
        ErrorKind::TooLarge
    );
    store.set_options(StoreOptions {
        defaults: QueueConfig {
            max_items: 1,
            ..QueueConfig::default()
        },
        config_for: None,
        ..StoreOptions::default()
    });
    assert_eq!(q.config().max_items, 1);
    assert_eq!(q.append(b"x", opts()).unwrap_err().kind(), ErrorKind::Full);
    // A new queue gets the new defaults.
    assert_eq!(store.queue("new").unwrap().config().max_items, 1);
}

#[test]
fn async_append_take_and_confirm() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    rt.block_on(async {
        let seq = q
            .append_async(bytes::Bytes::from_static(b"async"), opts())
            .await
            .unwrap();
        let t = r
            .take_async(TakeMode::Lease, Duration::from_millis(100))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((t.item.seq, &t.item.data[..]), (seq, &b"async"[..]));
        assert!(r.confirm_async(t.lease.unwrap()).await.unwrap());
        let start = Instant::now();
        let none = r
            .take_async(TakeMode::Take, Duration::from_millis(100))
            .await
            .unwrap();
        assert!(none.is_none());
        assert!(start.elapsed() >= Duration::from_millis(90));
    });
}

#[test]
fn reopen_right_after_dropping_the_last_handle() {
    // Dropping the last handle closes the store; the directory is free at once.
    let dir = tempfile::tempdir().unwrap();
    for i in 0..100u64 {
        let store = Store::open(dir.path())
            .unwrap_or_else(|e| panic!("open #{i} right after dropping the previous store: {e}"));
        store
            .queue("q")
            .unwrap()
            .append(&payload(i, 8), opts())
            .unwrap();
        drop(store);
    }
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.queue("q").unwrap().stats().items, 100);
}

/// Whether the segment files of queue `name` hold `needle`, read from disk (not through
/// the store): what a killed process would leave behind.
fn on_disk(dir: &std::path::Path, name: &str, needle: &[u8]) -> bool {
    common::segment_files(dir, name).iter().any(|path| {
        let bytes = std::fs::read(path).unwrap_or_default();
        bytes.windows(needle.len()).any(|w| w == needle)
    })
}

fn buffered() -> QueueConfig {
    QueueConfig {
        durability: weir::Durability::Buffered,
        ..QueueConfig::default()
    }
}

#[test]
fn buffered_appends_reach_the_file_within_the_stage_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with_config(dir.path(), buffered()).unwrap();
    let q = store.queue("q").unwrap();
    let item = payload(1, 300);
    q.append(&item, opts()).unwrap();
    // Served from the staging buffer at once...
    let r = q.reader("").unwrap();
    assert_eq!(&r.peek().unwrap().unwrap().data[..], &item[..]);
    // ... and in the file within 50 ms (plus a tick of the background thread), with no
    // sync and no other call.
    assert!(
        common::wait_until(Duration::from_secs(2), || on_disk(dir.path(), "q", &item)),
        "a staged append never reached the file"
    );
}

#[test]
fn buffered_items_larger_than_the_stage_are_written_before_the_append_returns() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with_config(dir.path(), buffered()).unwrap();
    let q = store.queue("q").unwrap();
    q.append(&payload(1, 100), opts()).unwrap();
    let big = payload(2, 100 * 1024);
    q.append(&big, opts()).unwrap();
    assert!(
        on_disk(dir.path(), "q", &big),
        "a 100 KiB item was left staged"
    );
    let batch: Vec<Vec<u8>> = (3..40).map(|i| payload(i, 4000)).collect();
    let refs: Vec<&[u8]> = batch.iter().map(|d| d.as_slice()).collect();
    q.append_batch(&refs, opts()).unwrap();
    assert!(
        on_disk(dir.path(), "q", &batch[36]),
        "a 148 KB batch was left staged"
    );
    let r = q.reader("").unwrap();
    let seqs: Vec<u64> = std::iter::from_fn(|| r.take().unwrap())
        .map(|i| i.seq)
        .collect();
    assert_eq!(seqs, (1..40).collect::<Vec<u64>>());
}

#[test]
fn switching_from_buffered_to_periodic_writes_what_is_staged() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with_config(dir.path(), buffered()).unwrap();
    let q = store.queue("q").unwrap();
    let staged = payload(1, 200);
    q.append(&staged, opts()).unwrap();
    q.set_config(QueueConfig::default());
    // Written by the switch, not by the 50 ms timer (which would need the time).
    assert!(on_disk(dir.path(), "q", &staged));
    // A periodic append is in the file when it returns.
    let mapped = payload(2, 200);
    q.append(&mapped, opts()).unwrap();
    assert!(on_disk(dir.path(), "q", &mapped));
    // And back: staged again, served to readers, and kept across a close.
    q.set_config(buffered());
    let again = payload(3, 200);
    q.append(&again, opts()).unwrap();
    drop(q);
    store.close().unwrap();
    let store = open_with_config(dir.path(), buffered()).unwrap();
    let r = store.queue("q").unwrap().reader("").unwrap();
    let got: Vec<Vec<u8>> = std::iter::from_fn(|| r.take().unwrap())
        .map(|i| i.data.to_vec())
        .collect();
    assert_eq!(got, vec![staged, mapped, again]);
}

#[test]
fn an_item_moved_into_a_buffered_queue_is_written_before_the_source_confirms_it() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        defaults: QueueConfig::default(),
        config_for: Some(Arc::new(|name: &str| {
            if name == "dead" {
                buffered()
            } else {
                QueueConfig {
                    expire_to: Some("dead".into()),
                    ..QueueConfig::default()
                }
            }
        })),
        ..StoreOptions::default()
    };
    let store = Store::open_with(dir.path(), options).unwrap();
    let q = store.queue("src").unwrap();
    let item = payload(7, 300);
    q.append(&item, expiring_at(now_ms().saturating_sub(1)))
        .unwrap();
    assert!(q.reader("").unwrap().take().unwrap().is_none());
    // The take moved it; the target wrote it before the source confirmed it, so a kill
    // now could not lose it from both queues.
    assert!(on_disk(dir.path(), "dead", &item));
    let moved = store.queue("dead").unwrap().reader("").unwrap().take();
    assert_eq!(moved.unwrap().map(|i| i.data.to_vec()), Some(item));
}

#[test]
fn synced_appends_fsync_and_buffered_ones_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        defaults: buffered(),
        config_for: Some(Arc::new(|name: &str| {
            if name == "synced" {
                QueueConfig {
                    durability: weir::Durability::Synced,
                    ..QueueConfig::default()
                }
            } else {
                buffered()
            }
        })),
        ..StoreOptions::default()
    };
    let store = Store::open_with(dir.path(), options).unwrap();
    let fsyncs = |queue: &str| weir::fault::fsyncs_under(&dir.path().join("queues").join(queue));
    let fast = store.queue("fast").unwrap();
    for i in 0..20 {
        fast.append(&payload(i, 100), opts()).unwrap();
    }
    assert_eq!(fsyncs("fast"), 0, "buffered appends fsynced");
    // One append asking for `sync` is fsynced, whatever the queue's mode.
    fast.append(
        &payload(20, 100),
        AppendOptions {
            sync: true,
            ..AppendOptions::default()
        },
    )
    .unwrap();
    assert!(fsyncs("fast") >= 1, "an append with sync made no fsync");
    let synced = store.queue("synced").unwrap();
    for i in 0..5 {
        let before = fsyncs("synced");
        synced.append(&payload(i, 100), opts()).unwrap();
        assert!(
            fsyncs("synced") > before,
            "synced append {i} returned without an fsync"
        );
    }
}

#[test]
fn after_begin_shutdown_a_released_lease_stays_out_until_the_store_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let queue = store.queue("q").unwrap();
    for data in [&b"a"[..], b"b", b"c"] {
        queue.append(data, opts()).unwrap();
    }
    let reader = queue.reader("").unwrap();
    let before = reader.take_leased().unwrap().unwrap();
    assert_eq!(&before.item.data[..], b"a");
    // Before a shutdown, a release puts the item back first in line.
    assert!(reader.release(before.id).unwrap());
    let lease = reader.take_leased().unwrap().unwrap();
    assert_eq!(&lease.item.data[..], b"a");
    store.begin_shutdown();
    // After it, the release is accepted but the item is not handed out again here.
    assert!(reader.release(lease.id).unwrap());
    let next = reader.take().unwrap().unwrap();
    assert_eq!(&next.data[..], b"b");
    // Appends and takes of other items go on.
    queue.append(b"d", opts()).unwrap();
    let rest: Vec<Vec<u8>> = std::iter::from_fn(|| reader.take().unwrap())
        .map(|item| item.data.to_vec())
        .collect();
    assert_eq!(rest, [b"c".to_vec(), b"d".to_vec()]);
    store.close().unwrap();
    // The restart delivers it again, as after a kill; what was confirmed stays gone.
    let store = Store::open(dir.path()).unwrap();
    let reader = store.queue("q").unwrap().reader("").unwrap();
    assert_eq!(&reader.take().unwrap().unwrap().data[..], b"a");
    assert!(reader.take().unwrap().is_none());
    store.close().unwrap();
}
