//! Moving a reader (`Reader::seek`) and finding a seq by enqueue time
//! (`Queue::seq_at_time`): replay delivers exactly the items from the chosen point,
//! positions survive a reopen, other readers are untouched, bounds clamp, and the time
//! search agrees with a scan of every item across many segments.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

mod common;

use std::time::Duration;

use common::{is_payload, open_on_manual_clock, open_with_config, payload, payload_id};
use weir::{AppendOptions, Durability, QueueConfig, Store};

const LEN: usize = 40;

fn config() -> QueueConfig {
    QueueConfig {
        segment_size_bytes: 4096,
        durability: Durability::Synced,
        ..QueueConfig::default()
    }
}

fn append_ids(q: &weir::Queue, ids: std::ops::Range<u64>) {
    for id in ids {
        q.append(&payload(id, LEN), AppendOptions::default())
            .expect("append");
    }
}

/// Takes and confirms everything the reader has; returns the payload ids in order.
fn drain(r: &weir::Reader) -> Vec<u64> {
    let mut out = Vec::new();
    while let Some(item) = r.take().expect("take") {
        let id = payload_id(&item.data).expect("an id");
        assert!(is_payload(&item.data, id, LEN), "item {id} is damaged");
        assert_eq!(item.seq, id + 1, "seq and payload agree");
        out.push(id);
    }
    out
}

#[test]
fn a_reader_moved_back_gets_exactly_the_items_from_there_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with_config(dir.path(), config()).unwrap();
    let q = store.queue("events").unwrap();
    let a = q.reader("a").unwrap();
    let b = q.reader("b").unwrap();
    append_ids(&q, 0..300);
    assert_eq!(drain(&a), (0..300).collect::<Vec<_>>());
    assert_eq!(drain(&b).len(), 300);
    // Nobody needed the old segments, so they are gone: the oldest seq is past 1,
    // and a seek before it stops there.
    let (oldest, next) = q.seq_bounds().unwrap();
    assert_eq!(next, 301);
    assert!(
        oldest > 1,
        "consumed segments were reclaimed (oldest {oldest})"
    );
    assert_eq!(a.seek(1).unwrap(), oldest);
    let replayed = drain(&a);
    assert_eq!(replayed, (oldest - 1..300).collect::<Vec<_>>());
    assert!(drain(&b).is_empty(), "another reader is untouched");
}

#[test]
fn a_seek_holds_segments_for_the_reader_and_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open_with_config(dir.path(), config()).unwrap();
        let q = store.queue("events").unwrap();
        let a = q.reader("a").unwrap();
        let keeper = q.reader("keeper").unwrap();
        append_ids(&q, 0..300);
        assert_eq!(drain(&a).len(), 300);
        // `keeper` holds everything, so `a` can go back to any seq.
        assert_eq!(a.seek(120).unwrap(), 120);
        drop(keeper);
        store.close().unwrap();
    }
    let store = open_with_config(dir.path(), config()).unwrap();
    let q = store.queue("events").unwrap();
    let a = q.reader("a").unwrap();
    assert_eq!(drain(&a), (119..300).collect::<Vec<_>>());
    assert_eq!(reader_items(&q, "keeper"), 300);
}

/// Items pending for reader `name` of `q`, from the queue's stats.
fn reader_items(q: &weir::Queue, name: &str) -> u64 {
    q.stats()
        .readers
        .iter()
        .find(|r| r.name == name)
        .map_or(0, |r| r.items)
}

#[test]
fn a_seek_ahead_drops_items_and_ends_leases() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with_config(dir.path(), config()).unwrap();
    let q = store.queue("events").unwrap();
    let a = q.reader("a").unwrap();
    append_ids(&q, 0..50);
    let lease = a.take_leased().unwrap().expect("an item");
    assert_eq!(a.seek(41).unwrap(), 41);
    assert!(
        !a.confirm(lease.id).unwrap(),
        "the lease ended with the seek"
    );
    assert_eq!(drain(&a), (40..50).collect::<Vec<_>>());
    // Past the end: clamped to the next seq; the next append is the next item.
    assert_eq!(a.seek(u64::MAX).unwrap(), 51);
    append_ids(&q, 50..51);
    assert_eq!(drain(&a), vec![50]);
}

#[test]
fn a_waiting_reader_wakes_when_a_seek_gives_it_items() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with_config(dir.path(), config()).unwrap();
    let q = store.queue("events").unwrap();
    let a = q.reader("a").unwrap();
    let _keeper = q.reader("keeper").unwrap();
    append_ids(&q, 0..5);
    assert_eq!(drain(&a).len(), 5);
    let waiter = {
        let a = a.clone();
        std::thread::spawn(move || {
            a.take_timeout(weir::TakeMode::Take, Duration::from_secs(20))
                .expect("take")
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    a.seek(3).unwrap();
    let item = waiter.join().unwrap().expect("woken with an item");
    assert_eq!(item.item.seq, 3);
}

#[test]
fn seq_at_time_agrees_with_a_scan_of_every_item() {
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = open_on_manual_clock(dir.path(), config());
    let q = store.queue("events").unwrap();
    let _keeper = q.reader("keeper").unwrap();
    let start = clock.now_ms();
    // 600 items over many 4 KiB segments, 10 ms apart, with a few gaps and several
    // items in the same millisecond.
    for id in 0..600u64 {
        let step = match id % 97 {
            0 => 5_000,
            n if n % 3 == 0 => 0,
            _ => 10,
        };
        clock.advance(Duration::from_millis(step));
        q.append(&payload(id, LEN), AppendOptions::default())
            .unwrap();
    }
    let segments = common::segment_files(dir.path(), "events").len();
    assert!(segments > 5, "the items span many segments ({segments})");
    let times: Vec<(u64, u64)> = q
        .iter()
        .unwrap()
        .map(|item| item.map(|i| (i.seq, i.enqueued_at_ms)))
        .collect::<weir::Result<_>>()
        .unwrap();
    let end = clock.now_ms();
    let mut probe = start.saturating_sub(1000);
    while probe <= end + 1000 {
        let want = times
            .iter()
            .find(|(_, t)| *t >= probe)
            .map_or(601, |(seq, _)| *seq);
        assert_eq!(q.seq_at_time(probe).unwrap(), want, "time {probe}");
        probe += 37;
    }
    // And a reader moved there gets exactly the items from that time on.
    let a = q.reader("a").unwrap();
    let t = times[321].1;
    a.seek(q.seq_at_time(t).unwrap()).unwrap();
    let first = a.take().unwrap().expect("an item");
    assert!(first.enqueued_at_ms >= t);
    assert!(times
        .iter()
        .filter(|(seq, _)| *seq < first.seq)
        .all(|(_, time)| *time < t));
}

#[test]
fn seq_at_time_of_an_empty_queue_is_the_next_seq() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("empty").unwrap();
    assert_eq!(q.seq_at_time(0).unwrap(), 1);
    assert_eq!(q.seq_bounds().unwrap(), (1, 1));
}

#[test]
fn a_reader_made_at_the_end_gets_only_what_follows_and_is_never_moved_again() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open_with_config(dir.path(), config()).unwrap();
        let q = store.queue("events").unwrap();
        let keep = q.reader("keep").unwrap();
        append_ids(&q, 0..5);
        let r = q.reader_at_end("r").unwrap();
        assert_eq!(drain(&r), Vec::<u64>::new());
        append_ids(&q, 5..8);
        // Made again (another caller, a moment later): found made, left where it is.
        // Moving it to the end here is what skipped 5..8 before.
        let again = q.reader_at_end("r").unwrap();
        assert_eq!(drain(&again), (5..8).collect::<Vec<_>>());
        append_ids(&q, 8..10);
        assert_eq!(drain(&keep), (0..10).collect::<Vec<_>>());
    }
    // The position is journaled: a reopen keeps it, and the call moves nothing.
    let store = open_with_config(dir.path(), config()).unwrap();
    let q = store.queue("events").unwrap();
    let r = q.reader_at_end("r").unwrap();
    assert_eq!(drain(&r), (8..10).collect::<Vec<_>>());
    assert!(
        q.reader_at_end("bad/name").is_err(),
        "reader names are checked"
    );
}

#[test]
fn readers_made_at_the_end_at_once_skip_nothing_appended_after_the_first() {
    for _round in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let store = open_with_config(dir.path(), config()).unwrap();
        let q = store.queue("events").unwrap();
        let _keep = q.reader("keep").unwrap();
        let go = std::sync::Barrier::new(5);
        let nexts = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            s.spawn(|| {
                go.wait();
                append_ids(&q, 0..200);
            });
            for _ in 0..4 {
                s.spawn(|| {
                    go.wait();
                    q.reader_at_end("r").expect("reader_at_end");
                    // The reader exists by now: it stands at or before this seq.
                    let (_, next) = q.seq_bounds().expect("bounds");
                    nexts.lock().unwrap().push(next);
                });
            }
        });
        let first_next = nexts
            .lock()
            .unwrap()
            .iter()
            .copied()
            .min()
            .expect("four calls");
        let got = drain(&q.reader("r").unwrap());
        // Contiguous up to the last append, starting no later than any caller saw
        // (seq = id + 1; after the 200 appends the next seq is 201).
        let start = got.first().map_or(201, |id| id + 1);
        assert!(
            start <= first_next,
            "reader starts at seq {start}, after seq {first_next}"
        );
        assert_eq!(got, (start - 1..200).collect::<Vec<_>>());
    }
}

#[test]
fn a_queue_moves_only_a_reader_that_exists() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with_config(dir.path(), config()).unwrap();
    let q = store.queue("events").unwrap();
    append_ids(&q, 0..10);
    // No such reader: nothing is made.
    assert_eq!(q.seek_reader("gone", 1).unwrap(), None);
    assert!(!q.has_reader("gone"));
    // One that exists is moved, as through its handle.
    let a = q.reader("a").unwrap();
    assert_eq!(drain(&a).len(), 10);
    assert_eq!(q.seek_reader("a", 6).unwrap(), Some(6));
    assert_eq!(drain(&a), (5..10).collect::<Vec<_>>());
    // Deleted, it stays deleted (a handle's seek would make it again).
    assert!(q.delete_reader("a").unwrap());
    assert_eq!(q.seek_reader("a", 1).unwrap(), None);
    assert!(!q.has_reader("a"));
    a.seek(1).unwrap();
    assert!(q.has_reader("a"), "the handle's seek makes it");
}
