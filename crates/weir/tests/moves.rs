//! Moves to `expire_to`: an expired item is appended to the target queue before its
//! confirmation is journaled in the source queue, so a process killed in between
//! delivers it twice (at least once), never loses it; a move that fails for a reason
//! that can pass keeps the item in the source; and an item on its way counts as gone
//! for `max_items`, as it did when moves confirmed at once.
//!
//! The kill is a child process (this test binary, run with `--exact move_child`) that
//! aborts at the instant between the two steps, through the engine's fault-injection
//! hooks (cargo feature `fault-injection`, on for the crate's tests).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use common::now_ms;
use weir::{AppendOptions, ErrorKind, QueueConfig, Store, StoreOptions};

const ENV_DIR: &str = "WEIR_MOVE_CHILD_DIR";
const ITEMS: u64 = 20;

/// "src" expires into "dead"; every queue is otherwise default (`limits` applies to src).
fn options(limits: QueueConfig) -> StoreOptions {
    let config_for: weir::ConfigFn = Arc::new(move |name: &str| {
        if name == "src" {
            QueueConfig {
                expire_to: Some("dead".to_string()),
                ..limits.clone()
            }
        } else {
            QueueConfig::default()
        }
    });
    StoreOptions {
        defaults: QueueConfig::default(),
        config_for: Some(config_for),
        ..StoreOptions::default()
    }
}

fn open(dir: &Path, limits: QueueConfig) -> weir::Result<Store> {
    Store::open_with(dir, options(limits))
}

/// At most `max_items`, the oldest discarded to make room.
fn discarding_at(max_items: u64) -> QueueConfig {
    QueueConfig {
        max_items,
        discard_old_when_full: true,
        ..QueueConfig::default()
    }
}

fn expired() -> AppendOptions {
    AppendOptions {
        expires_at_ms: now_ms() - 10,
        ..AppendOptions::default()
    }
}

fn drain(store: &Store, queue: &str) -> Vec<Vec<u8>> {
    let r = store.queue(queue).unwrap().reader("").unwrap();
    std::iter::from_fn(|| r.take().unwrap())
        .map(|i| i.data.to_vec())
        .collect()
}

fn names(range: std::ops::RangeInclusive<u64>) -> Vec<Vec<u8>> {
    range.map(|i| format!("item {i}").into_bytes()).collect()
}

/// Runs only as a child (when `WEIR_MOVE_CHILD_DIR` is set); a no-op in a normal run.
#[test]
fn move_child() {
    let Some(dir) = std::env::var_os(ENV_DIR) else {
        return;
    };
    let store = open(Path::new(&dir), QueueConfig::default()).unwrap();
    let src = store.queue("src").unwrap();
    src.reader("").unwrap();
    store.queue("dead").unwrap().reader("").unwrap();
    for data in names(1..=ITEMS) {
        src.append(&data, expired()).unwrap();
    }
    weir::fault::abort_at(Some(weir::fault::MOVE_APPENDED));
    let _ = src.expire();
    unreachable!("the child aborts in the middle of the move");
}

#[test]
fn a_process_killed_in_the_middle_of_a_move_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let status = Command::new(exe)
        .args(["--exact", "move_child", "--nocapture", "--test-threads=1"])
        .env(ENV_DIR, dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "the child aborted: {status:?}");

    let store = open(dir.path(), QueueConfig::default()).unwrap();
    // The child appended every item to the target, then died before confirming any in
    // the source: both hold them now.
    let src = store.queue("src").unwrap();
    assert_eq!(
        src.stats().items,
        ITEMS,
        "nothing was confirmed in the source"
    );
    assert_eq!(store.queue("dead").unwrap().stats().items, ITEMS);
    // Expiring again moves them again: duplicates, never a loss.
    assert_eq!(src.expire().unwrap(), ITEMS);
    assert_eq!(src.stats().items, 0);
    let mut expected = names(1..=ITEMS);
    expected.extend(names(1..=ITEMS));
    assert_eq!(drain(&store, "dead"), expected);
}

#[test]
fn a_move_that_fails_for_lack_of_space_keeps_the_item() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), QueueConfig::default()).unwrap();
    let src = store.queue("src").unwrap();
    let src_r = src.reader("").unwrap();
    src.append(b"old", expired()).unwrap();
    let live = src.append(b"live", AppendOptions::default()).unwrap();
    // "dead" has no space for its first append (creating it needs none).
    let dead_dir = dir.path().join("queues").join("dead");
    weir::fault::set_disk_full(&dead_dir, true);
    let e = store
        .queue("dead")
        .unwrap()
        .append(b"x", AppendOptions::default())
        .expect_err("no space for the target");
    assert_eq!(e.kind(), ErrorKind::DiskFull);
    assert_eq!(src.expire().unwrap(), 1, "the item expired");
    assert_eq!(src.stats().items, 2, "but stays until it can be moved");
    assert_eq!(src.stats().readers[0].open_leases, 0);
    // A take meets it again (it fails again) and goes on to the live item.
    assert_eq!(src_r.take().unwrap().unwrap().seq, live);
    assert_eq!(src.stats().items, 1);

    weir::fault::set_disk_full(&dead_dir, false);
    assert_eq!(src.expire().unwrap(), 1);
    assert_eq!(src.stats().items, 0);
    assert_eq!(src.stats().expired, 1, "counted once");
    assert_eq!(drain(&store, "dead"), vec![b"old".to_vec()], "moved once");
}

#[test]
fn items_on_their_way_to_expire_to_make_room() {
    // A full queue that discards: the expired items at the head leave (moved), then as
    // few live ones as the append needs.
    let dir = tempfile::tempdir().unwrap();
    let limits = QueueConfig {
        max_items: 4,
        discard_old_when_full: true,
        ..QueueConfig::default()
    };
    let store = open(dir.path(), limits).unwrap();
    let src = store.queue("src").unwrap();
    src.reader("").unwrap();
    src.append(b"e1", expired()).unwrap();
    for data in [&b"l1"[..], b"l2", b"l3"] {
        src.append(data, AppendOptions::default()).unwrap();
    }
    src.append_batch(&[b"n1", b"n2"], AppendOptions::default())
        .unwrap();
    let stats = src.stats();
    assert_eq!((stats.discarded, stats.expired), (1, 1));
    let kept: Vec<Vec<u8>> = [&b"l2"[..], b"l3", b"n1", b"n2"]
        .iter()
        .map(|d| d.to_vec())
        .collect();
    assert_eq!(drain(&store, "src"), kept);
    assert_eq!(drain(&store, "dead"), vec![b"e1".to_vec()]);
}

#[test]
fn a_full_queue_of_expired_items_makes_room_by_moving_them() {
    // `discard_old_when_full`: expired items are room to make, even with no unexpired
    // item after them (the queue once answered Full here).
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), discarding_at(2)).unwrap();
    let src = store.queue("src").unwrap();
    let r = src.reader("").unwrap();
    src.append(b"old 1", expired()).unwrap();
    src.append(b"old 2", expired()).unwrap();
    src.append(b"new", AppendOptions::default()).unwrap();
    assert_eq!(
        drain(&store, "dead"),
        vec![b"old 1".to_vec(), b"old 2".to_vec()]
    );
    assert_eq!(&r.take().unwrap().unwrap().data[..], b"new");
}

#[test]
fn an_append_refused_as_full_still_moves_the_expired_items_it_met() {
    // Making room moves the expired items first; when leases fill what is left, the
    // append is refused, and the items it met must still reach the target (they were
    // once held for the move until a restart, neither moved nor delivered).
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), discarding_at(2)).unwrap();
    let src = store.queue("src").unwrap();
    let r = src.reader("").unwrap();
    src.append(b"a", AppendOptions::default()).unwrap();
    src.append(b"b", AppendOptions::default()).unwrap();
    let leases = [
        r.take_leased().unwrap().unwrap(),
        r.take_leased().unwrap().unwrap(),
    ];
    // Past the limit only through the set-up: lift it, add expired items, restore it.
    store.set_options(options(discarding_at(u64::MAX)));
    src.append(b"old", expired()).unwrap();
    store.set_options(options(discarding_at(2)));
    let refused = src.append(b"c", AppendOptions::default()).unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Full, "two leases fill the queue");
    assert_eq!(
        drain(&store, "dead"),
        vec![b"old".to_vec()],
        "moved all the same"
    );
    for lease in leases {
        assert!(r.confirm(lease.id).unwrap());
    }
    src.append(b"c", AppendOptions::default()).unwrap();
    assert_eq!(&r.take().unwrap().unwrap().data[..], b"c");
}
