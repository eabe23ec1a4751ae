//! Directory fsyncs: a file created, renamed or removed survives a power cut only
//! once its directory is fsync'ed. Each test checks that the engine fsyncs the right
//! directory before it reports the operation durable: a new store's directories
//! before any queue lives in them, a new queue's entry and files by its first sync, a
//! deleted queue's rename before `delete_queue` returns, consumed segments' removal by
//! the next sync. (`weir::fault::dir_syncs_of` counts fsyncs of one directory.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

use std::path::Path;

use weir::fault::dir_syncs_of;
use weir::{AppendOptions, Durability, QueueConfig, Store, StoreOptions};

fn synced_store(dir: &Path, segment_size_bytes: u64) -> Store {
    Store::open_with(
        dir,
        StoreOptions {
            defaults: QueueConfig {
                durability: Durability::Synced,
                segment_size_bytes,
                ..QueueConfig::default()
            },
            ..StoreOptions::default()
        },
    )
    .unwrap()
}

#[test]
fn a_new_store_makes_its_directories_durable_before_use() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("data");
    let store = Store::open(&dir).unwrap();
    // `data` in its parent, `queues` in `data`.
    assert!(dir_syncs_of(parent.path()) >= 1);
    assert!(dir_syncs_of(&dir) >= 1);
    store.close().unwrap();
    // Reopening finds them in place: no fsync needed.
    let before = dir_syncs_of(&dir);
    let store = Store::open(&dir).unwrap();
    assert_eq!(dir_syncs_of(&dir), before);
    store.close().unwrap();
}

#[test]
fn a_synced_append_to_a_new_queue_makes_the_queue_durable_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = synced_store(dir.path(), QueueConfig::SEGMENT_SIZE_BYTES_DEFAULT);
    let queues = dir.path().join("queues");
    let before = dir_syncs_of(&queues);
    let queue = store.queue("fresh").unwrap();
    queue.append(b"x", AppendOptions::default()).unwrap();
    // When the append returns, the queue's entry in `queues/` and its files' entries
    // in its own directory have been fsync'ed.
    assert!(dir_syncs_of(&queues) > before);
    assert!(dir_syncs_of(&queues.join("fresh")) >= 1);
    // Later appends to the same queue need no directory fsync.
    let after_first = dir_syncs_of(&queues.join("fresh"));
    queue.append(b"y", AppendOptions::default()).unwrap();
    assert_eq!(dir_syncs_of(&queues.join("fresh")), after_first);
    store.close().unwrap();
}

#[test]
fn a_deleted_queue_is_durably_gone_when_delete_returns() {
    let dir = tempfile::tempdir().unwrap();
    let store = synced_store(dir.path(), QueueConfig::SEGMENT_SIZE_BYTES_DEFAULT);
    let queues = dir.path().join("queues");
    store
        .queue("doomed")
        .unwrap()
        .append(b"x", AppendOptions::default())
        .unwrap();
    let before = dir_syncs_of(&queues);
    assert!(store.delete_queue("doomed").unwrap());
    assert!(dir_syncs_of(&queues) > before);
    assert!(!queues.join("doomed").exists());
    store.close().unwrap();
}

#[test]
fn consumed_segments_are_durably_removed_by_the_next_sync() {
    const SEGMENT_BYTES: u64 = 64 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let store = synced_store(dir.path(), SEGMENT_BYTES);
    let queue = store.queue("q").unwrap();
    let qdir = dir.path().join("queues").join("q");
    let item = vec![7u8; 4096];
    for _ in 0..64 {
        queue.append(&item, AppendOptions::default()).unwrap();
    }
    let segments = |d: &Path| {
        std::fs::read_dir(d)
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy().ends_with(".seg")
            })
            .count()
    };
    assert!(segments(&qdir) >= 3, "the items span several segments");
    let before = dir_syncs_of(&qdir);
    let reader = queue.reader("").unwrap();
    while reader.take().unwrap().is_some() {}
    store.sync().unwrap();
    assert!(segments(&qdir) <= 2, "consumed segments were removed");
    // The removals were made durable: the queue's directory was fsync'ed after the
    // takes began (by a synced take's commit round, or by the sync above).
    assert!(
        dir_syncs_of(&qdir) > before,
        "no directory fsync after the removals"
    );
    store.close().unwrap();
}
