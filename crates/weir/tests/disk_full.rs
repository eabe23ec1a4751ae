//! Disk full: on a 2 MiB tmpfs, appends fail with `ErrorKind::DiskFull`, nothing
//! already stored is damaged (checked after a reopen), and appends work again once
//! space is freed, whether by deleting another file or by consuming items so that
//! whole segments are deleted.
//!
//! The tmpfs tests need root (to mount tmpfs). Where mounting is impossible they are
//! skipped with the reason (or fail, with `WEIR_REQUIRE_MOUNTS=1`), and the `injected_*`
//! tests, which run everywhere, cover the engine's side: the full disk is injected where
//! the engine reserves disk space (`posix_fallocate`), through the fault-injection hooks
//! (cargo feature `fault-injection`, on for the crate's tests). They cannot cover what
//! only a real file system does (space that returns once a deleted segment is closed, a
//! reservation that fails half way).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{is_payload, open_with_config, payload};
use weir::{AppendOptions, Durability, ErrorKind, QueueConfig, Store};

const QUEUE: &str = "full";
const ITEM_LEN: usize = 1000;
const SEGMENT_SIZE_BYTES: u64 = 64 * 1024;
/// Items appended once space is freed: fewer than one segment holds, so this does not
/// depend on how much the engine reserves per segment (see `small_segments_use_the_disk`).
const AFTER_FREEING: u64 = 50;

/// A size-limited tmpfs, unmounted on drop.
struct Tmpfs {
    path: PathBuf,
    _dir: tempfile::TempDir,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (as mount(8) spells it) or explains why it cannot.
    fn mount(size: &str, serial: std::sync::MutexGuard<'static, ()>) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
        let path = dir.path().join("mnt");
        std::fs::create_dir(&path).map_err(|e| format!("mkdir: {e}"))?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs {
            path,
            _dir: dir,
            _serial: serial,
        })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let mut ok = false;
        for _ in 0..20 {
            ok = Command::new("umount")
                .arg(&self.path)
                .stderr(std::process::Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        if !ok {
            // Something still holds a file there; detach so the test run cleans up.
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}

/// Serializes the tests of this file: each spawns mount(8), umount(8) and sh, and a
/// process spawned while another test has a store open inherits that store's lock file
/// descriptor between fork and exec, which would make that test's reopen fail.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The tmpfs, or `None` when it cannot be mounted (the test is skipped; the
/// `injected_*` tests run instead), unless `WEIR_REQUIRE_MOUNTS=1` makes that a
/// failure (`scripts/test` sets it where a probe mount works).
/// Holds this file's test lock for as long as the tmpfs is mounted.
fn tmpfs_or_skip(size: &str) -> Option<Tmpfs> {
    let serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    match Tmpfs::mount(size, serial) {
        Ok(t) => Some(t),
        Err(reason) => {
            let msg = format!("disk-full test on tmpfs cannot run: {reason}");
            if std::env::var("WEIR_REQUIRE_MOUNTS").as_deref() == Ok("1") {
                panic!("{msg} (WEIR_REQUIRE_MOUNTS=1: this machine can mount)");
            }
            eprintln!("SKIPPED: {msg}; the injected_* tests cover the engine's side");
            None
        }
    }
}

fn config(durability: Durability) -> QueueConfig {
    QueueConfig {
        durability,
        segment_size_bytes: SEGMENT_SIZE_BYTES,
        ..QueueConfig::default()
    }
}

/// Appends items (seq S carries `payload(S, ITEM_LEN)`) until an append fails; checks
/// the failure is DiskFull and stays so. Returns the last acknowledged seq.
fn fill(store: &Store, from_seq: u64, batch: usize) -> u64 {
    let q = store.queue(QUEUE).unwrap();
    let mut next = from_seq;
    for _ in 0..100_000 {
        let data: Vec<Vec<u8>> = (0..batch as u64)
            .map(|i| payload(next + i, ITEM_LEN))
            .collect();
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        match q.append_batch(&refs, AppendOptions::default()) {
            Ok(first) => {
                assert_eq!(first, next, "seqs are consecutive here");
                next += batch as u64;
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::DiskFull, "the failing append: {e}");
                println!("disk full after seq {}: {e}", next - 1);
                print_files(store.dir());
                // It stays full for an append of the same size, and says so every
                // time (a smaller one may still fit in what is reserved).
                for _ in 0..5 {
                    let e = q.append_batch(&refs, AppendOptions::default());
                    let e = e.expect_err("still full");
                    assert_eq!(e.kind(), ErrorKind::DiskFull, "a retry: {e}");
                }
                return next - 1;
            }
        }
    }
    panic!(
        "appended {} items to a full disk without error",
        next - from_seq
    );
}

/// Lists the store's files with their sizes (what fills the disk).
fn print_files(dir: &std::path::Path) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("df -k {0} | tail -1; ls -lsR {0}", dir.display()))
        .output();
    if let Ok(out) = out {
        println!("{}", String::from_utf8_lossy(&out.stdout));
    }
}

/// Checks that the kept items are exactly seqs `from..=to`, intact.
fn check_items(store: &Store, from: u64, to: u64) {
    let q = store.queue(QUEUE).unwrap();
    let mut expect = from;
    for item in q.iter().expect("iter") {
        let item = item.expect("iter item");
        assert_eq!(item.seq, expect, "kept items run {from}..={to}");
        assert!(
            is_payload(&item.data, item.seq, ITEM_LEN),
            "seq {} damaged",
            item.seq
        );
        expect += 1;
    }
    assert_eq!(expect - 1, to, "kept items run {from}..={to}");
}

fn close(store: Store) {
    // The final sync of a full disk may fail; it must not lose anything either way.
    if let Err(e) = store.close() {
        assert_eq!(e.kind(), ErrorKind::DiskFull, "close on a full disk: {e}");
    }
}

#[test]
fn disk_full_then_space_freed_by_deleting_a_file() {
    let Some(fs) = tmpfs_or_skip("2m") else {
        return;
    };
    let filler = fs.path.join("filler");
    std::fs::write(&filler, vec![7u8; 512 * 1024]).unwrap();
    let dir = fs.path.join("store");
    let store = open_with_config(&dir, config(Durability::default())).unwrap();
    let r = store.queue(QUEUE).unwrap().reader("").unwrap();
    let last = fill(&store, 1, 1);
    assert!(last >= 50, "only {last} items of 1 KB fit");
    // Reading needs no space.
    assert_eq!(r.peek().unwrap().unwrap().seq, 1);
    check_items(&store, 1, last);
    drop(r);
    close(store);

    // Reopen while the filler still takes its space: everything acknowledged is there.
    let store =
        open_with_config(&dir, config(Durability::default())).expect("reopen on a full disk");
    check_items(&store, 1, last);

    // Free space: appends work again, and everything survives another reopen.
    std::fs::remove_file(&filler).unwrap();
    let q = store.queue(QUEUE).unwrap();
    for seq in last + 1..=last + AFTER_FREEING {
        let got = q
            .append(&payload(seq, ITEM_LEN), AppendOptions::default())
            .unwrap_or_else(|e| panic!("append after freeing space: {e}"));
        assert_eq!(got, seq);
    }
    drop(q);
    store.close().unwrap();
    let store = open_with_config(&dir, config(Durability::default())).unwrap();
    check_items(&store, 1, last + AFTER_FREEING);
    let r = store.queue(QUEUE).unwrap().reader("").unwrap();
    let mut n = 0;
    while let Some(item) = r.take().unwrap() {
        n += 1;
        assert_eq!(item.seq, n);
    }
    assert_eq!(n, last + AFTER_FREEING);
}

#[test]
fn disk_full_then_space_freed_by_consuming() {
    // 8 MiB: room for several segments, so consuming can free whole sealed ones.
    let Some(fs) = tmpfs_or_skip("8m") else {
        return;
    };
    let dir = fs.path.join("store");
    let store = open_with_config(&dir, config(Durability::default())).unwrap();
    let q = store.queue(QUEUE).unwrap();
    let r = q.reader("").unwrap();
    let last = fill(&store, 1, 1);
    let disk_full_bytes = q.stats().disk_bytes;
    // Consumers drain the queue: confirming must work on a full disk, or a full disk
    // could never be emptied.
    let mut taken = 0;
    loop {
        let batch = r
            .take_batch(50)
            .unwrap_or_else(|e| panic!("take_batch on a full disk after {taken} items: {e}"));
        if batch.is_empty() {
            break;
        }
        for item in &batch {
            taken += 1;
            assert_eq!(item.seq, taken);
            assert!(is_payload(&item.data, item.seq, ITEM_LEN));
        }
    }
    assert_eq!(taken, last);
    let after = q.stats().disk_bytes;
    assert!(
        after < disk_full_bytes / 4,
        "consuming everything frees the segments: {after} bytes on disk, was {disk_full_bytes}"
    );
    // Appends work again. The engine keeps sealed segments open until its next
    // periodic fsync (1 s by default), and a deleted file's space returns only when it
    // is closed: allow a moment for that.
    let drained_at = std::time::Instant::now();
    loop {
        match q.append(&payload(last + 1, ITEM_LEN), AppendOptions::default()) {
            Ok(seq) => {
                assert_eq!(seq, last + 1);
                break;
            }
            Err(e) if e.kind() == ErrorKind::DiskFull => {
                assert!(
                    drained_at.elapsed() < std::time::Duration::from_secs(5),
                    "still full 5 s after draining: {e}"
                );
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("append after draining: {e}"),
        }
    }
    println!(
        "appends work again {:?} after draining",
        drained_at.elapsed()
    );
    for seq in last + 2..=last + 500 {
        let got = q
            .append(&payload(seq, ITEM_LEN), AppendOptions::default())
            .unwrap_or_else(|e| {
                print_files(&dir);
                panic!("append after draining: {e}")
            });
        assert_eq!(got, seq);
    }
    drop((q, r));
    store.close().unwrap();
    let store = open_with_config(&dir, config(Durability::default())).unwrap();
    check_items(&store, last + 1, last + 500);
}

#[test]
fn disk_full_batches_are_all_or_none() {
    disk_full_with_batches();
}

#[test]
fn small_segments_use_the_disk() {
    let Some(fs) = tmpfs_or_skip("2m") else {
        return;
    };
    let dir = fs.path.join("store");
    let store = open_with_config(&dir, config(Durability::default())).unwrap();
    let last = fill(&store, 1, 1);
    assert!(
        last >= 1200,
        "only {last} items of 1 KB fit in 2 MiB with 64 KiB segments"
    );
}

fn disk_full_with_batches() {
    let Some(fs) = tmpfs_or_skip("2m") else {
        return;
    };
    let filler = fs.path.join("filler");
    std::fs::write(&filler, vec![1u8; 256 * 1024]).unwrap();
    let dir = fs.path.join("store");
    let store = open_with_config(&dir, config(Durability::Synced)).unwrap();
    let last = fill(&store, 1, 10);
    assert_eq!(last % 10, 0, "acknowledged: whole batches");
    close(store);
    // Nothing of the failed batch was stored: room for all of it is reserved first.
    let last = {
        let store = open_with_config(&dir, config(Durability::Synced)).unwrap();
        let n = store.queue(QUEUE).unwrap().stats().items;
        println!("after the failed batch: {n} items kept, {last} acknowledged");
        assert_eq!(
            n,
            last,
            "the failed batch left {} of its items",
            n.saturating_sub(last)
        );
        store.close().unwrap();
        n
    };
    let store = open_with_config(&dir, config(Durability::Synced)).unwrap();
    check_items(&store, 1, last);
    std::fs::remove_file(&filler).unwrap();
    let q = store.queue(QUEUE).unwrap();
    let data: Vec<Vec<u8>> = (1..=10).map(|i| payload(last + i, ITEM_LEN)).collect();
    let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    assert_eq!(
        q.append_batch(&refs, AppendOptions::default()).unwrap(),
        last + 1
    );
    drop(q);
    store.close().unwrap();
    let store = open_with_config(&dir, config(Durability::Synced)).unwrap();
    check_items(&store, 1, last + 10);
}

// --- Without root: the full disk injected where the engine reserves space -----------

/// A store directory whose disk can be made full (fault injection), and this file's
/// test lock (other tests here spawn processes, which must not inherit a store's lock
/// file descriptor). The disk is made usable again on drop.
struct Injected {
    dir: PathBuf,
    _tmp: tempfile::TempDir,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Injected {
    fn new() -> Injected {
        let serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let tmp = tempfile::tempdir().unwrap();
        Injected {
            dir: tmp.path().join("store"),
            _tmp: tmp,
            _serial: serial,
        }
    }

    fn full(&self, full: bool) {
        weir::fault::set_disk_full(&self.dir, full);
    }
}

impl Drop for Injected {
    fn drop(&mut self) {
        self.full(false);
    }
}

#[test]
fn injected_disk_full_then_space_freed() {
    injected_disk_full_then_space_freed_in(Durability::default());
}

/// `buffered` stages appends in memory (mapfile.rs) and reserves disk space before it
/// stages one: the same guarantees through the other write path.
#[test]
fn injected_disk_full_then_space_freed_buffered() {
    injected_disk_full_then_space_freed_in(Durability::Buffered);
}

fn injected_disk_full_then_space_freed_in(durability: Durability) {
    let disk = Injected::new();
    // Segments larger than the writer's window (256 KiB): the disk fills when the
    // window moves inside a segment (the batch test below fills at a new segment).
    let config = QueueConfig {
        segment_size_bytes: 1 << 20,
        ..config(durability)
    };
    let store = open_with_config(&disk.dir, config.clone()).unwrap();
    let q = store.queue(QUEUE).unwrap();
    let r = q.reader("").unwrap();
    for seq in 1..=200 {
        assert_eq!(
            q.append(&payload(seq, ITEM_LEN), AppendOptions::default())
                .unwrap(),
            seq
        );
    }
    disk.full(true);
    let last = fill(&store, 201, 1);
    // Reads need no space, and confirmations use the journal's reserved window.
    assert_eq!(r.peek().unwrap().unwrap().seq, 1);
    for seq in 1..=10 {
        let item = r.take().unwrap().expect("an item");
        assert_eq!(item.seq, seq);
        assert!(is_payload(&item.data, seq, ITEM_LEN));
    }
    check_items(&store, 11, last);
    drop((q, r));
    close(store);

    // Reopen while the disk is still full: everything acknowledged is there.
    let store = open_with_config(&disk.dir, config.clone()).expect("reopen on a full disk");
    check_items(&store, 11, last);

    // Space again: appends work, and everything survives another reopen.
    disk.full(false);
    let q = store.queue(QUEUE).unwrap();
    for seq in last + 1..=last + AFTER_FREEING {
        let got = q
            .append(&payload(seq, ITEM_LEN), AppendOptions::default())
            .unwrap_or_else(|e| panic!("append after freeing space: {e}"));
        assert_eq!(got, seq);
    }
    drop(q);
    store.close().unwrap();
    let store = open_with_config(&disk.dir, config).unwrap();
    check_items(&store, 11, last + AFTER_FREEING);
    let r = store.queue(QUEUE).unwrap().reader("").unwrap();
    let mut next = 11;
    while let Some(item) = r.take().unwrap() {
        assert_eq!(item.seq, next);
        next += 1;
    }
    assert_eq!(next, last + AFTER_FREEING + 1);
}

#[test]
fn injected_disk_full_batches_are_all_or_none() {
    let disk = Injected::new();
    let config = config(Durability::Synced);
    let store = open_with_config(&disk.dir, config.clone()).unwrap();
    // A new queue reserves no space until its first append: one batch reserves a
    // window, and more batches fit in it once the disk is full.
    let first: Vec<Vec<u8>> = (1..=10).map(|i| payload(i, ITEM_LEN)).collect();
    let refs: Vec<&[u8]> = first.iter().map(|d| d.as_slice()).collect();
    store
        .queue(QUEUE)
        .unwrap()
        .append_batch(&refs, AppendOptions::default())
        .unwrap();
    disk.full(true);
    let last = fill(&store, 11, 10);
    assert!(
        last >= 20,
        "some batches fit before the disk filled ({last})"
    );
    assert_eq!(last % 10, 0, "acknowledged: whole batches");
    close(store);
    {
        let store = open_with_config(&disk.dir, config.clone()).unwrap();
        let n = store.queue(QUEUE).unwrap().stats().items;
        assert_eq!(n, last, "the failed batch left nothing behind");
        check_items(&store, 1, last);
        store.close().unwrap();
    }
    disk.full(false);
    let store = open_with_config(&disk.dir, config.clone()).unwrap();
    let q = store.queue(QUEUE).unwrap();
    let data: Vec<Vec<u8>> = (1..=10).map(|i| payload(last + i, ITEM_LEN)).collect();
    let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    assert_eq!(
        q.append_batch(&refs, AppendOptions::default()).unwrap(),
        last + 1
    );
    drop(q);
    store.close().unwrap();
    let store = open_with_config(&disk.dir, config).unwrap();
    check_items(&store, 1, last + 10);
}
