//! The embedded engine's map file (`DATA_DIR/maps/NAME.map`, `local_map.rs`): what a
//! restart, a kill mid-write, damage and compaction leave of it. Its compare-and-set
//! answers are the contract's (`common::a_map_writes_compare_and_set`, in
//! `tests/contract.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure is a panic

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use weir_backend::{Expect, Kind, LocalMap, MAP_VALUE_BYTES_MAX};

fn file(dir: &Path) -> PathBuf {
    dir.join("maps").join("m.map")
}

fn state(map: &LocalMap) -> Vec<(String, Vec<u8>, u64)> {
    map.list()
        .unwrap()
        .into_iter()
        .map(|e| (e.key, e.value.to_vec(), e.revision))
        .collect()
}

/// Two keys written, one replaced, one deleted, one written again.
fn fill(dir: &Path) -> Vec<(String, Vec<u8>, u64)> {
    let map = LocalMap::open(dir, "m").unwrap();
    let a = map.put("a", Bytes::from("one"), Expect::Absent).unwrap();
    map.put("a", Bytes::from("two"), Expect::Revision(a))
        .unwrap();
    let b = map.put("b", Bytes::from("bee"), Expect::Absent).unwrap();
    assert!(map.delete("b", b).unwrap());
    map.put("c", Bytes::from("sea"), Expect::Absent).unwrap();
    state(&map)
}

#[test]
fn a_reopened_map_holds_what_was_written_and_its_revisions_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let before = fill(dir.path());
    assert_eq!(before.len(), 2);
    let map = LocalMap::open(dir.path(), "m").unwrap();
    assert_eq!(state(&map), before);
    let c = map.get("c").unwrap().unwrap().revision;
    assert!(map.delete("c", c).unwrap());
    drop(map);
    // The delete of `c` took the last revision given: none is given twice, even
    // when the newest write was a delete.
    let map = LocalMap::open(dir.path(), "m").unwrap();
    let next = map.put("d", Bytes::from("dee"), Expect::Absent).unwrap();
    assert_eq!(next, c + 2);
    assert_eq!(
        map.get("a").unwrap().map(|e| e.value),
        Some(Bytes::from("two"))
    );
}

#[test]
fn two_handles_on_one_file_share_one_state() {
    let dir = tempfile::tempdir().unwrap();
    let one = LocalMap::open(dir.path(), "m").unwrap();
    let two = LocalMap::open(dir.path(), "m").unwrap();
    let r = one.put("a", Bytes::from("x"), Expect::Absent).unwrap();
    let e = two.put("a", Bytes::from("y"), Expect::Absent).unwrap_err();
    assert_eq!(e.kind(), Kind::Conflict);
    assert_eq!(two.get("a").unwrap().unwrap().revision, r);
}

#[test]
fn a_torn_last_record_is_cut_off_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let before = fill(dir.path());
    let path = file(dir.path());
    let good = fs::metadata(&path).unwrap().len();
    // A kill mid-append: part of a record (its frame says 40 bytes, 5 are there),
    // then, on a second try, a whole frame whose body is not what its CRC says,
    // then zeros (a file system that grew the file but never wrote it).
    let tails: [&[u8]; 3] = [
        &[40, 0, 0, 0, 1, 2, 3, 4, 1, 9, 9, 9, 9],
        &[3, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3],
        &[0; 4096],
    ];
    for tail in tails {
        OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(tail)
            .unwrap();
        let map = LocalMap::open(dir.path(), "m").unwrap();
        assert_eq!(state(&map), before);
        assert_eq!(fs::metadata(&path).unwrap().len(), good, "cut off");
    }
    // Writes go on after the cut, and are read back.
    let map = LocalMap::open(dir.path(), "m").unwrap();
    map.put("e", Bytes::from("after"), Expect::Absent).unwrap();
    let after = state(&map);
    drop(map);
    assert_eq!(state(&LocalMap::open(dir.path(), "m").unwrap()), after);
}

#[test]
fn a_damaged_record_with_good_ones_after_it_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path());
    let path = file(dir.path());
    let mut bytes = fs::read(&path).unwrap();
    // The first record's value ("one"), past the magic, its frame and its header.
    let at = 8 + 8 + 1 + 8 + 2 + 1;
    assert_eq!(&bytes[at..at + 3], b"one");
    bytes[at] ^= 0x20;
    fs::write(&path, &bytes).unwrap();
    let e = LocalMap::open(dir.path(), "m").err().unwrap();
    let message = e.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains("damaged at byte 8"), "{message}");
    // Not the magic of a map at all.
    fs::write(&path, b"something else entirely").unwrap();
    let e = LocalMap::open(dir.path(), "m").err().unwrap();
    assert!(e.to_string().contains("magic"), "{e}");
}

#[test]
fn compaction_bounds_the_file_and_keeps_every_value_and_revision() {
    let dir = tempfile::tempdir().unwrap();
    let map = LocalMap::open(dir.path(), "m").unwrap();
    let big = Bytes::from(vec![b'v'; 10_000]);
    map.put("keep", Bytes::from("kept"), Expect::Absent)
        .unwrap();
    let mut revision = map.put("k", big.clone(), Expect::Absent).unwrap();
    for i in 0..200u32 {
        let mut value = big.to_vec();
        value[..4].copy_from_slice(&i.to_le_bytes());
        revision = map
            .put("k", Bytes::from(value), Expect::Revision(revision))
            .unwrap();
    }
    // 2 MB written; the file holds a bounded multiple of the live 10 kB.
    let len = fs::metadata(file(dir.path())).unwrap().len();
    assert!(len < 120_000, "{len} bytes");
    let gone = map.put("gone", Bytes::from("x"), Expect::Absent).unwrap();
    assert!(map.delete("gone", gone).unwrap());
    let before = state(&map);
    drop(map);
    let map = LocalMap::open(dir.path(), "m").unwrap();
    assert_eq!(state(&map), before);
    assert_eq!(
        map.get("k").unwrap().unwrap().value[..4],
        199u32.to_le_bytes()
    );
    assert!(!dir.path().join("maps").join("m.map.tmp").exists());
    // Compacted away or not, no revision is given twice.
    let next = map.put("new", Bytes::new(), Expect::Absent).unwrap();
    assert_eq!(next, gone + 2);
}

#[test]
fn a_value_over_the_limit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let map = LocalMap::open(dir.path(), "m").unwrap();
    let e = map
        .put(
            "a",
            Bytes::from(vec![0; MAP_VALUE_BYTES_MAX + 1]),
            Expect::Absent,
        )
        .unwrap_err();
    assert_eq!(e.kind(), Kind::TooLarge, "{e}");
    map.put(
        "a",
        Bytes::from(vec![0; MAP_VALUE_BYTES_MAX]),
        Expect::Absent,
    )
    .unwrap();
}
