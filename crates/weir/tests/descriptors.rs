//! Descriptors and background work stay bounded however many queues a store holds:
//! past `files_open_max` the queues used least recently close their files, and reopen
//! them on their next use without the caller noticing; a queue with nothing left to do
//! drops off the background thread's list, and comes back on it with its next use (a
//! periodic fsync is still due after it).
//!
//! One test binary of its own: it counts the process's descriptors.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

mod common;

use std::time::Duration;

use common::wait_until;
use weir::{AppendOptions, Durability, QueueConfig, Store, StoreOptions};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// A store with a descriptor budget; the queue named "buffered" is `buffered`.
fn open_budgeted(dir: &std::path::Path, files_open_max: usize) -> Store {
    let config_for: weir::ConfigFn = std::sync::Arc::new(|name: &str| QueueConfig {
        durability: if name == "buffered" {
            Durability::Buffered
        } else {
            Durability::default()
        },
        ..QueueConfig::default()
    });
    Store::open_with(
        dir,
        StoreOptions {
            files_open_max,
            config_for: Some(config_for),
            ..StoreOptions::default()
        },
    )
    .unwrap()
}

#[test]
fn descriptors_stay_within_the_budget_and_idle_queues_cost_no_background_work() {
    const QUEUES: usize = 300;
    const BUDGET: usize = 30;
    let dir = tempfile::tempdir().unwrap();
    let before = open_fds();
    let store = open_budgeted(dir.path(), BUDGET);
    let mut names: Vec<String> = (0..QUEUES).map(|i| format!("q{i:04}")).collect();
    names.push("buffered".into());
    for (i, name) in names.iter().enumerate() {
        let q = store.queue(name).unwrap();
        q.reader("fan").unwrap();
        q.append(format!("item {i}").as_bytes(), AppendOptions::default())
            .unwrap();
    }
    // Far more queues than the budget: the least recently used close their files.
    let settled = wait_until(Duration::from_secs(10), || {
        open_fds() <= before + BUDGET + 16
    });
    assert!(
        settled,
        "{} descriptors open, {before} before, budget {BUDGET}",
        open_fds()
    );
    // Every queue still works, its files reopened on use; and the budget holds after.
    for (i, name) in names.iter().enumerate() {
        let q = store.queue(name).unwrap();
        let item = q.reader("").unwrap().take().unwrap().expect("the item");
        assert_eq!(item.data, format!("item {i}").as_bytes());
        assert_eq!(q.stats().readers.len(), 2, "{name}");
    }
    assert!(wait_until(Duration::from_secs(10), || open_fds()
        <= before + BUDGET + 16));
    // Stats of queues with closed files: the age of the oldest item is kept.
    std::thread::sleep(Duration::from_millis(20));
    let stats = store.queue(&names[0]).unwrap().stats();
    assert!(stats
        .readers
        .iter()
        .any(|r| r.name == "fan" && r.items == 1 && r.age_ms >= 20));
    // Idle and closed: the background thread stops visiting them.
    let quiet = wait_until(Duration::from_secs(15), || {
        let t0 = weir::fault::ticks_under(dir.path());
        std::thread::sleep(Duration::from_millis(200));
        weir::fault::ticks_under(dir.path()) <= t0 + 5
    });
    assert!(quiet, "idle queues are still ticked");
    // An idle buffered queue is fsync'ed before it closes its files: a write-back
    // error is reported only through a descriptor open when it happened.
    let buffered = dir.path().join("queues").join("buffered");
    assert!(
        weir::fault::fsyncs_under(&buffered) >= 1,
        "the idle buffered queue was synced"
    );
    store.close().unwrap();
    let store = open_budgeted(dir.path(), BUDGET);
    for (i, name) in names.iter().enumerate() {
        let r = store.queue(name).unwrap().reader("fan").unwrap();
        assert_eq!(
            r.take().unwrap().unwrap().data,
            format!("item {i}").as_bytes()
        );
    }
}

#[test]
fn a_queue_back_from_idle_is_fsynced_on_its_interval() {
    let dir = tempfile::tempdir().unwrap();
    // A budget of about one queue: using others closes this one's files at once, and
    // it leaves the background thread's list.
    let store = open_budgeted(dir.path(), 4);
    let a = store.queue("a").unwrap();
    let qdir = dir.path().join("queues").join("a");
    a.append(b"1", AppendOptions::default()).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || weir::fault::fsyncs_under(&qdir)
            >= 1),
        "the periodic fsync of a new queue"
    );
    for other in ["b", "c", "d"] {
        let q = store.queue(other).unwrap();
        q.append(b"1", AppendOptions::default()).unwrap();
    }
    let quiet = wait_until(Duration::from_secs(10), || {
        let t0 = weir::fault::ticks_under(&qdir);
        std::thread::sleep(Duration::from_millis(100));
        weir::fault::ticks_under(&qdir) == t0
    });
    assert!(quiet, "queue a left the background thread's list");
    let fsyncs = weir::fault::fsyncs_under(&qdir);
    a.append(b"2", AppendOptions::default()).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || weir::fault::fsyncs_under(&qdir)
            > fsyncs),
        "an append to a queue back from idle is fsynced within its interval"
    );
}
