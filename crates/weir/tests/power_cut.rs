//! Simulated power cuts: what an OS crash or a power cut leaves of a store, checked
//! against what the engine acknowledged, in every durability mode.
//!
//! A SIGKILL leaves the page cache whole, so it cannot show what an fsync is for. Here
//! a workload runs in this process (appends in batches, leased takes, confirms and
//! releases by two readers, a third reader that reads nothing, small segments that
//! roll, a periodic `sync` in `buffered` mode) while the test takes crash images of
//! its directory. The engine tells the test of every fsync before it happens
//! (`weir::fault::observe_syncs`, a test-only hook on the one function each kind of
//! fsync goes through), and the test records what that fsync makes durable: a file's
//! whole content, a directory's entries. A crash image is then:
//!
//! - each directory: the entries its last fsync saw, plus any subset of the changes
//!   made since (a rename is one change: old name or new, never both or neither);
//! - each file: the content its last fdatasync saw, plus any subset of the 4 KiB pages
//!   written since (through the mapping or by `pwrite`), with the size it had at
//!   either moment; a file never fsync'ed starts from nothing.
//!
//! While an image is taken, fsyncs wait (the hook blocks), and the ledger of what was
//! acknowledged is frozen at that instant; writes to the page cache go on, so an image
//! can hold a record half written. Each image is opened as a store (no help, no
//! repair) and drained by every reader, then checked: nothing invented or corrupted;
//! every append acknowledged before the last completed fsync of its kind present
//! (`synced`: every acknowledged append; `periodic`: all but the last interval;
//! `buffered`: all before the last completed `sync`); no confirmed item delivered
//! again under the same rules; in `synced` mode, batches all or none.
//!
//! A second, fixed case cuts the power after an item came back twice to a reader, once
//! fsync'ed and once not: every image counts the fsync'ed return, may lose the other,
//! never counts more, and its journal still takes (and keeps) a confirmation.
//!
//! `WEIR_POWER_CUTS=N` sets the cuts per mode (default 80, so 240 per run);
//! `scripts/soak` runs thousands.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

mod common;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use weir::{AppendOptions, Durability, QueueConfig, Store, StoreOptions};

use common::power_cut::{lock, PowerCut};
use common::{is_payload, payload, payload_id};

const QUEUE: &str = "q";
/// Readers that take and confirm; `AUDIT` reads nothing until after a cut, so it sees
/// every item an image holds.
const READERS: [&str; 2] = ["", "fan"];
const AUDIT: &str = "audit";
const PERIODIC_INTERVAL: Duration = Duration::from_millis(50);

// --- The workload and its ledger ----------------------------------------------------

#[derive(Clone, Default)]
struct Ledger {
    next_id: u64,
    /// Every id ever appended or attempted: its payload length and its batch.
    attempted: HashMap<u64, (usize, u64)>,
    batches: HashMap<u64, Vec<u64>>,
    acked: HashMap<u64, Instant>,
    /// Per reader: ids a confirm was attempted for, and confirms acknowledged.
    confirm_attempted: Vec<HashSet<u64>>,
    confirmed: Vec<HashMap<u64, Instant>>,
    /// The start of the latest `sync` that completed (buffered mode).
    synced_from: Option<Instant>,
}

fn options(mode: &str) -> StoreOptions {
    let durability = match mode {
        "synced" => Durability::Synced,
        "periodic" => Durability::Periodic(PERIODIC_INTERVAL),
        _ => Durability::Buffered,
    };
    StoreOptions {
        defaults: QueueConfig {
            durability,
            // Small, so a run rolls through many segments; not so small that a
            // periodic round (one fdatasync per sealed segment) outlasts the interval.
            segment_size_bytes: 64 * 1024,
            ..QueueConfig::default()
        },
        ..StoreOptions::default()
    }
}

/// Appends, in the test's whole run, at most this many items: every cut reads the whole
/// store and the ledger, so both stay small.
const ITEMS_MAX: u64 = 20_000;

fn appender(q: weir::Queue, ledger: Arc<Mutex<Ledger>>, stop: Arc<AtomicBool>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    while !stop.load(Ordering::Relaxed) && lock(&ledger).next_id < ITEMS_MAX {
        let count = if rng.gen_bool(0.5) {
            1
        } else {
            rng.gen_range(2..6)
        };
        let items: Vec<(u64, Vec<u8>)> = {
            let mut l = lock(&ledger);
            let batch = l.next_id;
            let ids: Vec<u64> = (0..count).map(|i| batch + i).collect();
            l.next_id += count;
            let items: Vec<(u64, Vec<u8>)> = ids
                .iter()
                .map(|&id| (id, payload(id, rng.gen_range(16..700))))
                .collect();
            for (id, data) in &items {
                l.attempted.insert(*id, (data.len(), batch));
            }
            l.batches.insert(batch, ids);
            items
        };
        let refs: Vec<&[u8]> = items.iter().map(|(_, d)| d.as_slice()).collect();
        q.append_batch(&refs, AppendOptions::default()).unwrap();
        let now = Instant::now();
        {
            let mut l = lock(&ledger);
            for (id, _) in &items {
                l.acked.insert(*id, now);
            }
        }
        // A steady rate rather than a flood: the images stay small and quick to check.
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn taker(r: weir::Reader, index: usize, ledger: Arc<Mutex<Ledger>>, stop: Arc<AtomicBool>) {
    let mut rng = StdRng::seed_from_u64(index as u64);
    while !stop.load(Ordering::Relaxed) {
        let Some(lease) = r.take_leased().unwrap() else {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        };
        let id = payload_id(&lease.item.data).unwrap();
        if rng.gen_bool(0.1) {
            r.release(lease.id).unwrap();
            continue;
        }
        lock(&ledger).confirm_attempted[index].insert(id);
        assert!(r.confirm(lease.id).unwrap());
        lock(&ledger).confirmed[index].insert(id, Instant::now());
    }
}

fn syncer(store: Store, ledger: Arc<Mutex<Ledger>>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
        let started = Instant::now();
        store.sync().unwrap();
        lock(&ledger).synced_from = Some(started);
    }
}

// --- Checking an image --------------------------------------------------------------

/// Drains every reader of the store in `image`; returns the ids each got. `ledger` is
/// taken after the image, so it knows every item the image can hold (appends go on
/// while an image is taken).
fn drain(image: &Path, mode: &str, ledger: &Ledger) -> Vec<HashSet<u64>> {
    let store = Store::open_with(image, options(mode))
        .unwrap_or_else(|e| panic!("{mode}: the store does not open after a power cut: {e}"));
    let q = store.queue(QUEUE).unwrap();
    let mut got = Vec::new();
    for name in READERS.iter().chain([&AUDIT]) {
        let r = q.reader(name).unwrap();
        let mut ids = HashSet::new();
        while let Some(item) = r.take().unwrap() {
            let id = payload_id(&item.data).unwrap_or(u64::MAX);
            let Some(&(len, _)) = ledger.attempted.get(&id) else {
                panic!("{mode}: reader {name:?} got an item never appended (id {id})");
            };
            assert!(
                is_payload(&item.data, id, len),
                "{mode}: item {id} came back corrupted"
            );
            ids.insert(id);
        }
        got.push(ids);
    }
    store.close().unwrap();
    got
}

/// Whether an acknowledgement at `at` must have survived a cut at `cut`.
fn must_survive(mode: &str, at: Instant, cut: Instant, ledger: &Ledger, held: Duration) -> bool {
    match mode {
        "synced" => true,
        // One interval, one background tick (20 ms), one fsync, and the time fsyncs
        // were held back by the previous image.
        "periodic" => cut.saturating_duration_since(at) > PERIODIC_INTERVAL * 3 + held,
        _ => ledger.synced_from.is_some_and(|from| at < from),
    }
}

/// `ledger` is frozen at the cut; `after` is taken after the image (a confirm tried
/// after the cut may have reached the image's journal).
fn check(
    mode: &str,
    ledger: &Ledger,
    after: &Ledger,
    cut: Instant,
    held: Duration,
    got: &[HashSet<u64>],
) {
    let audit = &got[READERS.len()];
    let lost = ledger
        .acked
        .iter()
        .filter(|(id, at)| must_survive(mode, **at, cut, ledger, held) && !audit.contains(id))
        .count();
    if lost > 0 {
        let mut seqs: Vec<u64> = audit.iter().copied().collect();
        seqs.sort_unstable();
        eprintln!(
            "{mode}: {lost} lost of {} acked; audit holds {} ids, first {:?} last {:?}",
            ledger.acked.len(),
            audit.len(),
            seqs.first(),
            seqs.last()
        );
    }
    for (&id, &at) in &ledger.acked {
        if must_survive(mode, at, cut, ledger, held) {
            assert!(
                audit.contains(&id),
                "{mode}: acknowledged item {id} lost ({:?} before the cut)",
                cut - at
            );
        }
    }
    if mode == "synced" {
        for ids in ledger.batches.values() {
            let n = ids.iter().filter(|id| audit.contains(id)).count();
            assert!(
                n == 0 || n == ids.len(),
                "{mode}: a batch came back in part: {n} of {} (ids {ids:?}, acknowledged: {})",
                ids.len(),
                ids.iter().all(|id| ledger.acked.contains_key(id))
            );
        }
    }
    for (index, name) in READERS.iter().enumerate() {
        for (&id, &at) in &ledger.confirmed[index] {
            if must_survive(mode, at, cut, ledger, held) {
                assert!(
                    !got[index].contains(&id),
                    "{mode}: item {id} confirmed by {name:?} {:?} before the cut came again",
                    cut - at
                );
            }
        }
        // What the reader had not confirmed (nor tried to) is still there for it.
        for (&id, &at) in &ledger.acked {
            if must_survive(mode, at, cut, ledger, held)
                && !after.confirm_attempted[index].contains(&id)
            {
                assert!(
                    got[index].contains(&id),
                    "{mode}: reader {name:?} lost item {id}"
                );
            }
        }
    }
}

fn power_cuts(mode: &'static str) {
    let cuts: usize = std::env::var("WEIR_POWER_CUTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(80);
    let seed: u64 = std::env::var("WEIR_POWER_CUT_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    println!("{mode}: {cuts} cuts, seed {seed} (WEIR_POWER_CUT_SEED repeats it)");
    let mut rng = StdRng::seed_from_u64(seed);
    // On a tmpfs where there is one: fsyncs cost nothing there, and the simulation
    // does not need the disk's.
    let shm = Path::new("/dev/shm");
    let work = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap_or_else(|_| tempfile::tempdir().unwrap())
    } else {
        tempfile::tempdir().unwrap()
    };
    let root = work.path().join("store");
    fs::create_dir(&root).unwrap();
    let power = PowerCut::install(&root);
    // WEIR_POWER_CUT_KEEP_IMAGES=1: a failing image stays on disk to be looked at.
    let work_path = work.path().to_path_buf();
    let work = if std::env::var_os("WEIR_POWER_CUT_KEEP_IMAGES").is_some() {
        eprintln!("{mode}: images under {}", work_path.display());
        let _ = work.keep();
        None
    } else {
        Some(work)
    };
    let store = Store::open_with(&root, options(mode)).unwrap();
    let q = store.queue(QUEUE).unwrap();
    let readers: Vec<weir::Reader> = READERS.iter().map(|name| q.reader(name).unwrap()).collect();
    q.reader(AUDIT).unwrap();
    store.sync().unwrap();
    let ledger = Arc::new(Mutex::new(Ledger {
        confirm_attempted: vec![HashSet::new(); READERS.len()],
        confirmed: vec![HashMap::new(); READERS.len()],
        ..Ledger::default()
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for i in 0..2 {
        let (q, l, s) = (q.clone(), Arc::clone(&ledger), Arc::clone(&stop));
        threads.push(std::thread::spawn(move || appender(q, l, s, seed ^ i)));
    }
    for (i, r) in readers.into_iter().enumerate() {
        let (l, s) = (Arc::clone(&ledger), Arc::clone(&stop));
        threads.push(std::thread::spawn(move || taker(r, i, l, s)));
    }
    if mode == "buffered" {
        let (st, l, s) = (store.clone(), Arc::clone(&ledger), Arc::clone(&stop));
        threads.push(std::thread::spawn(move || syncer(st, l, s)));
    }
    let mut held = Duration::ZERO;
    let mut checked_items = 0;
    for i in 0..cuts {
        std::thread::sleep(Duration::from_millis(rng.gen_range(2..25)));
        let keep = match std::env::var("WEIR_POWER_CUT_KEEP") {
            Ok(k) => k.parse().unwrap(),
            Err(_) => [0.0, 0.3, 0.7, 1.0][rng.gen_range(0..4)],
        };
        let image = work_path.join(format!("cut-{i}"));
        let started = Instant::now();
        let (frozen, cut) = power
            .cut(&mut rng, keep, &image, || {
                (lock(&ledger).clone(), Instant::now())
            })
            .unwrap();
        let previous_hold = held;
        held = started.elapsed();
        let after = lock(&ledger).clone();
        if std::env::var_os("WEIR_POWER_CUT_KEEP_IMAGES").is_some() {
            let raw = work_path.join(format!("raw-{i}"));
            std::process::Command::new("cp")
                .arg("-a")
                .arg(&image)
                .arg(&raw)
                .status()
                .unwrap();
        }
        let got = drain(&image, mode, &after);
        check(mode, &frozen, &after, cut, previous_hold.max(held), &got);
        checked_items += got[READERS.len()].len();
        fs::remove_dir_all(&image).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let acked = lock(&ledger).acked.len();
    println!("{mode}: {cuts} cuts checked, {acked} appends acknowledged, {checked_items} items found in the images");
    assert!(
        acked > 100,
        "{mode}: the workload barely ran ({acked} appends)"
    );
    drop(q);
    store.close().unwrap();
    drop(work);
}

#[test]
fn power_cuts_synced() {
    power_cuts("synced");
}

#[test]
fn power_cuts_periodic() {
    power_cuts("periodic");
}

#[test]
fn power_cuts_buffered() {
    power_cuts("buffered");
}

// --- Delivery counts ------------------------------------------------------------------

/// Power cuts after an item came back twice: once fsync'ed (a `synced` release waits
/// for it; the other modes by `Store::sync`), once not (`release_nowait`). Every image
/// opens, hands the item out intact with the fsync'ed return counted and never more
/// than the two (the second may be lost), and takes a confirmation that a reopen keeps:
/// a torn count record does not corrupt the journal. Returns the deliveries seen.
fn return_counts_across_cuts(mode: &str) -> HashSet<u32> {
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("store");
    fs::create_dir(&root).unwrap();
    let power = PowerCut::install(&root);
    let store = Store::open_with(&root, options(mode)).unwrap();
    let q = store.queue(QUEUE).unwrap();
    let r = q.reader("").unwrap();
    let sync = AppendOptions {
        sync: true,
        ..AppendOptions::default()
    };
    q.append(&payload(1, 100), sync).unwrap();
    store.sync().unwrap();
    let first = r.take_leased().unwrap().unwrap();
    assert!(r.release(first.id).unwrap());
    if mode != "synced" {
        store.sync().unwrap();
    }
    let second = r.take_leased().unwrap().unwrap();
    assert_eq!(second.deliveries, 2);
    assert!(r.release_nowait(second.id).unwrap());
    let mut seen = HashSet::new();
    let mut rng = StdRng::seed_from_u64(7);
    for i in 0..24 {
        let keep = [0.0, 0.5, 1.0][i % 3];
        let image = work.path().join(format!("cut-{i}"));
        power.cut(&mut rng, keep, &image, || ()).unwrap();
        {
            let cut = Store::open_with(&image, options(mode))
                .unwrap_or_else(|e| panic!("{mode}: no store after a cut: {e}"));
            let r = cut.queue(QUEUE).unwrap().reader("").unwrap();
            let l = r.take_leased().unwrap().expect("the item after a cut");
            assert!(is_payload(&l.item.data, 1, 100), "{mode}: item corrupted");
            assert!(
                (2..=3).contains(&l.deliveries),
                "{mode}: keep {keep}: deliveries {} after a cut, expected 2 (the fsync'ed \
                 return) or 3",
                l.deliveries
            );
            seen.insert(l.deliveries);
            assert!(r.confirm(l.id).unwrap());
            drop(r);
            cut.close().unwrap();
        }
        let again = Store::open_with(&image, options(mode)).unwrap();
        let r = again.queue(QUEUE).unwrap().reader("").unwrap();
        assert!(
            r.take().unwrap().is_none(),
            "{mode}: the confirmation after a cut did not hold"
        );
        drop(r);
        again.close().unwrap();
        fs::remove_dir_all(&image).unwrap();
    }
    drop((q, r));
    store.close().unwrap();
    drop(power);
    seen
}

#[test]
fn return_counts_survive_power_cuts_once_fsynced() {
    for mode in ["synced", "periodic", "buffered"] {
        let seen = return_counts_across_cuts(mode);
        println!("{mode}: deliveries after a cut: {seen:?}");
    }
}
