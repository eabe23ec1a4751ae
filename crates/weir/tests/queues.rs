//! Many queues: `queues_max` is exact under concurrent creation, a creation is all or
//! nothing (what a crash in the middle leaves is removed at the next open), and queues
//! already on disk are opened even past the cap.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

mod common;

use std::sync::{Arc, Barrier};

use weir::{AppendOptions, ErrorKind, Store, StoreOptions};

fn open_capped(dir: &std::path::Path, queues_max: usize) -> Store {
    Store::open_with(
        dir,
        StoreOptions {
            queues_max,
            ..StoreOptions::default()
        },
    )
    .unwrap()
}

fn queue_dirs(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("queues"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn the_cap_is_exact_under_concurrent_creation() {
    const CAP: usize = 40;
    const THREADS: usize = 8;
    const PER_THREAD: usize = 20;
    let dir = tempfile::tempdir().unwrap();
    let store = open_capped(dir.path(), CAP);
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = store.clone();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                let mut made = 0;
                for i in 0..PER_THREAD {
                    // Every thread also asks for names the others create.
                    for name in [format!("t{t}_{i}"), format!("shared{i}")] {
                        match store.queue(&name) {
                            Ok(q) => {
                                q.append(name.as_bytes(), AppendOptions::default()).unwrap();
                                made += 1;
                            }
                            Err(e) => assert_eq!(e.kind(), ErrorKind::TooManyQueues, "{e}"),
                        }
                    }
                }
                made
            })
        })
        .collect();
    let made: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(made >= CAP, "{made} successful uses");
    assert_eq!(store.queue_count(), CAP);
    assert_eq!(store.queue_names().len(), CAP);
    assert_eq!(
        queue_dirs(dir.path()),
        store.queue_names(),
        "no half-made queue on disk"
    );
    // Existing queues keep working at the cap; a delete makes room for exactly one.
    let first = store.queue_names()[0].clone();
    store
        .queue(&first)
        .unwrap()
        .append(b"more", AppendOptions::default())
        .unwrap();
    assert_eq!(
        store.queue("one_more").unwrap_err().kind(),
        ErrorKind::TooManyQueues
    );
    assert!(store.delete_queue(&first).unwrap());
    store.queue("one_more").unwrap();
    assert_eq!(
        store.queue("two_more").unwrap_err().kind(),
        ErrorKind::TooManyQueues
    );
    store.close().unwrap();
    // Reopened with a lower cap: every queue on disk is open all the same.
    let store = open_capped(dir.path(), 5);
    assert_eq!(store.queue_count(), CAP);
    assert_eq!(
        store.queue("new").unwrap_err().kind(),
        ErrorKind::TooManyQueues
    );
}

#[test]
fn a_creation_cut_short_is_removed_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        store
            .queue("kept")
            .unwrap()
            .append(b"x", AppendOptions::default())
            .unwrap();
        store.close().unwrap();
    }
    // What a crash in the middle of creating "half" leaves: its temporary directory,
    // with some of its files.
    let tmp = dir.path().join("queues").join(".creating-half-123");
    std::fs::create_dir(&tmp).unwrap();
    std::fs::write(tmp.join("readers.00000000000000000001"), b"WEIRJRN1").unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.queue_names(), ["kept"]);
    assert_eq!(queue_dirs(dir.path()), ["kept"]);
    let r = store.queue("kept").unwrap().reader("").unwrap();
    assert_eq!(&r.take().unwrap().unwrap().data[..], b"x");
}

#[test]
fn a_new_queue_is_whole_on_disk_at_once_and_durable_after_a_sync() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let fsyncs_before = weir::fault::fsyncs_under(dir.path());
    store.queue("fresh").unwrap();
    let qdir = dir.path().join("queues").join("fresh");
    let mut files: Vec<String> = std::fs::read_dir(&qdir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "00000000000000000001.seg",
            "reader-names",
            "readers.00000000000000000001"
        ]
    );
    assert_eq!(
        weir::fault::fsyncs_under(dir.path()),
        fsyncs_before,
        "creating a queue costs no fsync"
    );
    store.sync().unwrap();
    assert!(
        weir::fault::fsyncs_under(dir.path()) >= fsyncs_before + 2,
        "its first sync covers its files"
    );
}
