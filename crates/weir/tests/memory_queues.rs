//! Memory with many queues: a queue's mapping windows (what its recent writes touched)
//! count in RSS while mapped; a queue idle for a couple of seconds gives them back, so
//! many quiet queues cost little memory.
//!
//! One test in this file on purpose: other tests in the same process would move RSS.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

mod common;

use std::time::Duration;

use common::{payload, rss_kib, wait_until};
use weir::{AppendOptions, Store};

const QUEUES: usize = 200;
const ITEMS_PER_QUEUE: u64 = 200;
const ITEM_LEN: usize = 1024;

#[test]
fn idle_queues_give_their_windows_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    // Warm up the process (threads, allocator) with one queue.
    store
        .queue("warm")
        .unwrap()
        .append(b"x", AppendOptions::default())
        .unwrap();
    let (rss_base, _) = rss_kib();
    for q in 0..QUEUES {
        let queue = store.queue(&format!("q{q}")).unwrap();
        for i in 0..ITEMS_PER_QUEUE {
            queue
                .append(&payload(i, ITEM_LEN), AppendOptions::default())
                .unwrap();
        }
    }
    let (rss_busy, anon_busy) = rss_kib();
    println!("busy: VmRSS {rss_busy} KiB, RssAnon {anon_busy} KiB");
    let busy_kib = rss_busy.saturating_sub(rss_base);
    // Each queue wrote ~200 KiB through its window: that is in RSS now.
    assert!(
        busy_kib > (QUEUES as u64 * ITEMS_PER_QUEUE * ITEM_LEN as u64 / 1024) / 2,
        "writes through the windows should show in RSS: +{busy_kib} KiB"
    );
    let mut rss_idle = rss_busy;
    let dropped = wait_until(Duration::from_secs(10), || {
        rss_idle = rss_kib().0;
        rss_idle.saturating_sub(rss_base) < 4 * 1024
    });
    println!(
        "VmRSS: base {rss_base} KiB, {QUEUES} busy queues +{busy_kib} KiB, idle +{} KiB",
        rss_idle.saturating_sub(rss_base)
    );
    assert!(
        dropped,
        "idle queues kept their windows: +{} KiB after 10 s",
        rss_idle.saturating_sub(rss_base)
    );
    // And they still work, from the start of their files.
    for q in [0, QUEUES / 2, QUEUES - 1] {
        let queue = store.queue(&format!("q{q}")).unwrap();
        queue.append(b"more", AppendOptions::default()).unwrap();
        assert_eq!(queue.stats().items, ITEMS_PER_QUEUE + 1);
        let first = queue.reader("").unwrap().take().unwrap().unwrap();
        assert_eq!(first.data, payload(0, ITEM_LEN));
    }
    store.close().unwrap();
}
