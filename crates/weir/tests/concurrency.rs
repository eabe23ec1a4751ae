//! Concurrency: many threads appending and taking from one queue with several readers
//! (every item delivered exactly once per reader when nothing crashes), group commit
//! under `synced`, and async takers woken by appends.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

// `is_multiple_of` is newer than the crate's rust-version (1.85).
#![allow(unknown_lints, clippy::manual_is_multiple_of)]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::{is_payload, open_with_config, payload, payload_id, small_segments};
use weir::{AppendOptions, Durability, QueueConfig, Reader, Store, TakeMode};

const PRODUCERS: u64 = 4;
const PER_PRODUCER: u64 = 25_000;
const TOTAL: u64 = PRODUCERS * PER_PRODUCER;
/// A hung test fails instead of hanging CI.
const DEADLINE: Duration = Duration::from_secs(60);

fn id_of(producer: u64, i: u64) -> u64 {
    (producer << 32) | i
}

fn len_of(id: u64) -> usize {
    8 + (id % 57) as usize
}

/// How one consumer thread reads its reader.
#[derive(Clone, Copy, Debug)]
enum Style {
    Take,
    Batch,
    Blocking,
    Leased,
}

fn consume(r: Reader, style: Style, done: Arc<AtomicU64>, stop: Arc<AtomicBool>) -> Vec<u64> {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut n = 0u64;
    let check = |item: &weir::Item| -> u64 {
        let id = payload_id(&item.data).expect("payload with an id");
        assert!(
            is_payload(&item.data, id, len_of(id)),
            "seq {} damaged",
            item.seq
        );
        id
    };
    while done.load(Ordering::SeqCst) < TOTAL && !stop.load(Ordering::SeqCst) {
        assert!(
            started.elapsed() < DEADLINE,
            "consumer {style:?} ran out of time"
        );
        n += 1;
        match style {
            Style::Take => match r.take().unwrap() {
                Some(item) => {
                    got.push(check(&item));
                    done.fetch_add(1, Ordering::SeqCst);
                }
                None => std::thread::yield_now(),
            },
            Style::Batch => {
                let items = r.take_batch(1 + (n % 64) as usize).unwrap();
                for item in &items {
                    got.push(check(item));
                }
                done.fetch_add(items.len() as u64, Ordering::SeqCst);
                if items.is_empty() {
                    std::thread::yield_now();
                }
            }
            Style::Blocking => {
                if let Some(t) = r
                    .take_timeout(TakeMode::Take, Duration::from_millis(20))
                    .unwrap()
                {
                    got.push(check(&t.item));
                    done.fetch_add(1, Ordering::SeqCst);
                }
            }
            Style::Leased => {
                if let Some(t) = r
                    .take_timeout(TakeMode::Lease, Duration::from_millis(20))
                    .unwrap()
                {
                    let lease = t.lease.expect("lease id");
                    let id = check(&t.item);
                    if n % 10 == 0 {
                        // Given back: some handle of this reader gets it again.
                        assert!(r.release(lease).unwrap());
                    } else {
                        assert!(r.confirm(lease).unwrap(), "confirm of a fresh lease");
                        got.push(id);
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }
    }
    got
}

#[test]
fn threads_append_and_take_exactly_once_per_reader() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with_config(dir.path(), small_segments(256 * 1024)).unwrap();
    let q = store.queue("busy").unwrap();
    let readers: Vec<(&str, Vec<Style>)> = vec![
        ("plain", vec![Style::Take, Style::Take, Style::Take]),
        ("leased", vec![Style::Leased, Style::Leased, Style::Leased]),
        ("batch", vec![Style::Batch]),
        (
            "mixed",
            vec![Style::Blocking, Style::Blocking, Style::Batch],
        ),
    ];
    // Create every reader before the first append, so each must see every item.
    for (name, _) in &readers {
        q.reader(name).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let barrier = Arc::new(Barrier::new(PRODUCERS as usize + 1));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let q = q.clone();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                let mut i = 0;
                while i < PER_PRODUCER {
                    if i % 7 == 3 && i + 3 <= PER_PRODUCER {
                        let data: Vec<Vec<u8>> = (i..i + 3)
                            .map(|j| payload(id_of(p, j), len_of(id_of(p, j))))
                            .collect();
                        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
                        q.append_batch(&refs, AppendOptions::default()).unwrap();
                        i += 3;
                    } else {
                        let id = id_of(p, i);
                        q.append(&payload(id, len_of(id)), AppendOptions::default())
                            .unwrap();
                        i += 1;
                    }
                }
            })
        })
        .collect();
    let mut consumers = Vec::new();
    for (name, styles) in &readers {
        let done = Arc::new(AtomicU64::new(0));
        for &style in styles {
            let r = q.reader(name).unwrap();
            let done = Arc::clone(&done);
            let stop = Arc::clone(&stop);
            consumers.push((
                name.to_string(),
                std::thread::spawn(move || consume(r, style, done, stop)),
            ));
        }
    }
    barrier.wait();
    for p in producers {
        p.join().unwrap();
    }
    let mut per_reader: HashMap<String, Vec<u64>> = HashMap::new();
    for (name, c) in consumers {
        let got = match c.join() {
            Ok(got) => got,
            Err(panic) => {
                stop.store(true, Ordering::SeqCst);
                std::panic::resume_unwind(panic);
            }
        };
        per_reader.entry(name).or_default().extend(got);
    }
    let elapsed = started.elapsed();
    let mut expected: Vec<u64> = (0..PRODUCERS)
        .flat_map(|p| (0..PER_PRODUCER).map(move |i| id_of(p, i)))
        .collect();
    expected.sort_unstable();
    for (name, mut got) in per_reader {
        let n = got.len();
        got.sort_unstable();
        let dups = got.windows(2).filter(|w| w[0] == w[1]).count();
        assert_eq!(dups, 0, "reader {name}: {dups} items delivered twice");
        assert_eq!(n as u64, TOTAL, "reader {name}: {n} items delivered");
        assert!(got == expected, "reader {name}: a different set of items");
    }
    let stats = q.stats();
    assert_eq!(stats.items, 0, "{stats:?}");
    assert_eq!(stats.open_leases, 0);
    assert_eq!(stats.total_items, TOTAL);
    println!(
        "{TOTAL} items from {PRODUCERS} threads, 4 readers x {} consumer threads, in {elapsed:?}",
        readers.iter().map(|r| r.1.len()).sum::<usize>()
    );
}

#[test]
fn synced_appends_from_many_threads_share_fsyncs() {
    let dir = tempfile::tempdir().unwrap();
    let config = QueueConfig {
        durability: Durability::Synced,
        ..QueueConfig::default()
    };
    let store = open_with_config(dir.path(), config.clone()).unwrap();
    let q = store.queue("synced").unwrap();
    const THREADS: u64 = 32;
    const EACH: u64 = 40;
    // A lost wake-up in group commit would hang here: fail instead.
    let _watchdog = Watchdog::start("synced appends from many threads", Duration::from_secs(120));
    let started = Instant::now();
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let q = q.clone();
            std::thread::spawn(move || {
                (0..EACH)
                    .map(|i| {
                        let id = id_of(t, i);
                        q.append(&payload(id, 100), AppendOptions::default())
                            .unwrap()
                    })
                    .collect::<Vec<u64>>()
            })
        })
        .collect();
    let mut seqs: Vec<u64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let elapsed = started.elapsed();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len() as u64, THREADS * EACH, "seqs are unique");
    // Every append waited for an fsync, and callers shared them: far fewer fsyncs than
    // appends (each round fsyncs the segment, and the directory at most once).
    let fsyncs = weir::fault::fsyncs_under(dir.path());
    println!(
        "{} synced appends from {THREADS} threads in {elapsed:?}: {fsyncs} fsyncs",
        THREADS * EACH
    );
    assert!(fsyncs >= 1, "synced appends made no fsync");
    assert!(
        fsyncs < THREADS * EACH / 2,
        "group commit shared no fsyncs: {fsyncs} for {} appends",
        THREADS * EACH
    );
    drop(q);
    store.close().unwrap();
    let store = open_with_config(dir.path(), config).unwrap();
    let q = store.queue("synced").unwrap();
    let mut ids: Vec<u64> = q
        .iter()
        .unwrap()
        .map(|i| payload_id(&i.unwrap().data).unwrap())
        .collect();
    ids.sort_unstable();
    let mut expected: Vec<u64> = (0..THREADS)
        .flat_map(|t| (0..EACH).map(move |i| id_of(t, i)))
        .collect();
    expected.sort_unstable();
    assert_eq!(ids, expected);
}

/// Aborts the test process if it is still alive after `limit` (a deadlock), since a
/// hung test would otherwise stall CI until its global timeout.
struct Watchdog(Arc<AtomicBool>);

impl Watchdog {
    fn start(what: &'static str, limit: Duration) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&done);
        std::thread::spawn(move || {
            let started = Instant::now();
            while started.elapsed() < limit {
                if flag.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            eprintln!("{what}: still running after {limit:?}; a lost wake-up?");
            std::process::abort();
        });
        Watchdog(done)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Every way of waiting for an fsync at once on one queue: synced appends from
/// threads, per-append `sync` requests, `Queue::sync` calls and async appends (which
/// wait on tokio's blocking pool). Each returns, and what returned is there after a
/// reopen.
#[test]
fn every_kind_of_fsync_wait_at_once_all_return() {
    let _watchdog = Watchdog::start("mixed fsync waits", Duration::from_secs(120));
    let dir = tempfile::tempdir().unwrap();
    let config = QueueConfig {
        durability: Durability::Periodic(Duration::from_secs(3600)),
        ..QueueConfig::default()
    };
    let store = open_with_config(dir.path(), config.clone()).unwrap();
    let q = store.queue("mixed").unwrap();
    const THREADS: u64 = 16;
    const EACH: u64 = 30;
    let rt = runtime();
    let async_q = q.clone();
    let async_appends = rt.spawn(async move {
        let mut tasks = Vec::new();
        for t in 0..8u64 {
            let q = async_q.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..EACH {
                    let options = AppendOptions {
                        sync: true,
                        ..AppendOptions::default()
                    };
                    q.append_async(payload(id_of(100 + t, i), 64), options)
                        .await
                        .unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    });
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let q = q.clone();
            std::thread::spawn(move || {
                for i in 0..EACH {
                    if t % 4 == 0 {
                        q.sync().unwrap();
                    }
                    let options = AppendOptions {
                        sync: t % 2 == 0,
                        ..AppendOptions::default()
                    };
                    q.append(&payload(id_of(t, i), 64), options).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    rt.block_on(async_appends).unwrap();
    drop(q);
    store.close().unwrap();
    let store = open_with_config(dir.path(), config).unwrap();
    let q = store.queue("mixed").unwrap();
    let items: Vec<weir::Item> = q.iter().unwrap().collect::<weir::Result<_>>().unwrap();
    assert_eq!(items.len() as u64, (THREADS + 8) * EACH);
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn async_takers_are_woken_by_appends() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("async").unwrap();
    let rt = runtime();
    const WAITERS: usize = 16;
    // Two readers, each with WAITERS tasks waiting on an empty queue.
    let readers = [q.reader("x").unwrap(), q.reader("y").unwrap()];
    let mut tasks = Vec::new();
    for r in &readers {
        for _ in 0..WAITERS {
            let r = r.clone();
            tasks.push(rt.spawn(async move {
                let got = r
                    .take_async(TakeMode::Take, Duration::from_secs(20))
                    .await
                    .unwrap();
                (
                    r.name().to_string(),
                    got.map(|t| t.item.seq),
                    Instant::now(),
                )
            }));
        }
    }
    assert!(
        common::wait_until(Duration::from_secs(5), || q.stats().waiters
            == 2 * WAITERS as u64),
        "waiters: {}",
        q.stats().waiters
    );
    let appended_at = Instant::now();
    for i in 0..WAITERS as u64 {
        q.append(&payload(i, 10), AppendOptions::default()).unwrap();
    }
    let mut per_reader: HashMap<String, Vec<u64>> = HashMap::new();
    let mut slowest = Duration::ZERO;
    rt.block_on(async {
        for t in tasks {
            let (name, seq, at) = t.await.unwrap();
            slowest = slowest.max(at.duration_since(appended_at));
            per_reader
                .entry(name)
                .or_default()
                .push(seq.expect("every waiter gets an item"));
        }
    });
    for (name, mut seqs) in per_reader {
        seqs.sort_unstable();
        assert_eq!(
            seqs,
            (1..=WAITERS as u64).collect::<Vec<_>>(),
            "reader {name}: each item to exactly one of its waiters"
        );
    }
    assert!(
        slowest < Duration::from_secs(2),
        "the last waiter woke {slowest:?} after the appends (timeout was 20 s)"
    );
    assert_eq!(q.stats().waiters, 0);
}

#[test]
fn async_take_times_out_and_a_dropped_future_takes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("async").unwrap();
    let r = q.reader("").unwrap();
    let rt = runtime();
    rt.block_on(async {
        let start = Instant::now();
        let none = r
            .take_async(TakeMode::Lease, Duration::from_millis(150))
            .await
            .unwrap();
        assert!(none.is_none());
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(140) && waited < Duration::from_secs(2),
            "waited {waited:?} for a 150 ms timeout"
        );
        // Dropped while waiting: registers nothing, takes nothing.
        let dropped = tokio::time::timeout(
            Duration::from_millis(50),
            r.take_async(TakeMode::Take, Duration::from_secs(10)),
        )
        .await;
        assert!(dropped.is_err(), "the outer timeout fired first");
    });
    assert_eq!(q.stats().waiters, 0, "a dropped future is no waiter");
    let seq = q.append(b"still here", AppendOptions::default()).unwrap();
    assert_eq!(r.take().unwrap().unwrap().seq, seq);
}

#[test]
fn async_producers_and_leased_consumers_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with_config(dir.path(), small_segments(128 * 1024)).unwrap();
    let q = store.queue("tasks").unwrap();
    q.reader("work").unwrap();
    let rt = runtime();
    const TASK_PRODUCERS: u64 = 4;
    const EACH: u64 = 3_000;
    const TASK_CONSUMERS: usize = 6;
    let total = TASK_PRODUCERS * EACH;
    let done = Arc::new(AtomicU64::new(0));
    let ids = rt.block_on(async {
        let mut consumers = Vec::new();
        for c in 0..TASK_CONSUMERS {
            let r = q.reader("work").unwrap();
            let done = Arc::clone(&done);
            consumers.push(tokio::spawn(async move {
                let started = Instant::now();
                let mut got = Vec::new();
                let mut n = 0u64;
                while done.load(Ordering::SeqCst) < total {
                    assert!(started.elapsed() < DEADLINE, "consumer {c} ran out of time");
                    let Some(t) = r
                        .take_async(TakeMode::Lease, Duration::from_millis(50))
                        .await
                        .unwrap()
                    else {
                        continue;
                    };
                    n += 1;
                    let lease = t.lease.unwrap();
                    if n % 13 == 0 {
                        assert!(r.release(lease).unwrap());
                        continue;
                    }
                    assert!(r.confirm_async(lease).await.unwrap());
                    got.push(payload_id(&t.item.data).unwrap());
                    done.fetch_add(1, Ordering::SeqCst);
                }
                got
            }));
        }
        let mut producers = Vec::new();
        for p in 0..TASK_PRODUCERS {
            let q = q.clone();
            producers.push(tokio::spawn(async move {
                for i in 0..EACH {
                    let id = id_of(p, i);
                    q.append_async(payload(id, 32), AppendOptions::default())
                        .await
                        .unwrap();
                    if i % 100 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            }));
        }
        for p in producers {
            p.await.unwrap();
        }
        let mut ids = Vec::new();
        for c in consumers {
            ids.extend(c.await.unwrap());
        }
        ids
    });
    let mut ids = ids;
    ids.sort_unstable();
    let n = ids.len();
    ids.dedup();
    assert_eq!(n, ids.len(), "{} items confirmed twice", n - ids.len());
    assert_eq!(n as u64, total);
    assert_eq!(q.stats().open_leases, 0);
    assert_eq!(q.stats().items, 0);
}
