//! Memory: a backlog of millions of items must not raise the process's RSS (the engine
//! keeps no per-item index). Appends 4,000,000 small items, then takes them all, and
//! compares VmRSS before, at the full backlog, and after. The bound is generous; the
//! exact figure is a benchmark.
//!
//! One test in this file on purpose: other tests in the same process would move RSS.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

// `is_multiple_of` is newer than the crate's rust-version (1.85).
#![allow(unknown_lints, clippy::manual_is_multiple_of)]

mod common;

use std::time::Instant;

use common::{payload, rss_kib};
use weir::{AppendOptions, Store};

const ITEMS: u64 = 4_000_000;
const ITEM_LEN: usize = 16;
const BATCH: usize = 1000;
const GROWTH_MAX_KIB: u64 = 32 * 1024;

#[test]
fn rss_does_not_grow_with_the_backlog() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("mem").unwrap();
    let r = q.reader("").unwrap();
    // Warm up: the first segment, the buffers, the threads.
    for i in 0..10_000u64 {
        q.append(&payload(i, ITEM_LEN), AppendOptions::default())
            .unwrap();
    }
    while r.take_batch(BATCH).unwrap().len() == BATCH {}
    let (rss_before, anon_before) = rss_kib();
    let started = Instant::now();

    let data: Vec<Vec<u8>> = (0..BATCH as u64).map(|i| payload(i, ITEM_LEN)).collect();
    let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    let mut appended = 0u64;
    while appended < ITEMS {
        if appended % 100_000 == 0 {
            // Some single appends too, not only batches.
            for i in 0..100 {
                q.append(&payload(i, ITEM_LEN), AppendOptions::default())
                    .unwrap();
            }
            appended += 100;
        }
        q.append_batch(&refs, AppendOptions::default()).unwrap();
        appended += BATCH as u64;
    }
    let stats = q.stats();
    assert_eq!(stats.items, appended);
    let (rss_full, anon_full) = rss_kib();
    let appended_in = started.elapsed();

    let mut taken = 0u64;
    loop {
        if taken % 100_000 == 0 {
            for _ in 0..100 {
                if r.take().unwrap().is_some() {
                    taken += 1;
                }
            }
        }
        let n = r.take_batch(BATCH).unwrap().len() as u64;
        taken += n;
        if n == 0 {
            break;
        }
    }
    assert_eq!(taken, appended);
    let (rss_after, anon_after) = rss_kib();
    println!(
        "{appended} items of {ITEM_LEN} B ({} MB on disk at the peak), appended in \
         {appended_in:?}, all taken in {:?}",
        stats.disk_bytes / 1_000_000,
        started.elapsed() - appended_in
    );
    println!(
        "VmRSS: before {rss_before} KiB, full backlog {rss_full} KiB (+{} KiB), drained \
         {rss_after} KiB (+{} KiB)",
        rss_full as i64 - rss_before as i64,
        rss_after as i64 - rss_before as i64
    );
    println!(
        "RssAnon: before {anon_before} KiB, full backlog {anon_full} KiB (+{} KiB), drained \
         {anon_after} KiB (+{} KiB)",
        anon_full as i64 - anon_before as i64,
        anon_after as i64 - anon_before as i64
    );
    let growth_full = rss_full.saturating_sub(rss_before);
    let growth_after = rss_after.saturating_sub(rss_before);
    assert!(
        growth_full <= GROWTH_MAX_KIB,
        "VmRSS grew by {growth_full} KiB with a backlog of {appended} items (bound \
         {GROWTH_MAX_KIB} KiB)"
    );
    assert!(
        growth_after <= GROWTH_MAX_KIB,
        "VmRSS grew by {growth_after} KiB after {appended} items went through (bound \
         {GROWTH_MAX_KIB} KiB)"
    );
}
