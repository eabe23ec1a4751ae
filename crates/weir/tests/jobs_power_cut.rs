//! Jobs across simulated power cuts: what an OS crash or a power cut leaves of a tube
//! whose jobs move between lanes, checked against what the jobs API acknowledged.
//!
//! `jobs_crash.rs` kills a process (SIGKILL), which leaves the page cache whole. Here
//! the tool of `power_cut.rs` (`common::power_cut`: crash images made of what each
//! fsync made durable plus any subset of the page writes since) cuts the power under
//! a store while three threads work one tube on a manual clock that a fourth thread
//! runs at twice real time: puts of random priority (four priorities: the tube's
//! queue and three lanes), a quarter of them delayed up to 600 ms; reserves, then
//! delete, release with the same priority, with another one or with a delay (after
//! a touch, at times), bury; kick; kick-job and delete by id of buried jobs. A ledger
//! records every operation before it is tried and again once acknowledged; puts go
//! one at a time, so ids follow the order jobs arrive in their lane.
//!
//! Each image is opened (`Store::open_with`, no help) on a clock a day ahead, so every
//! delayed job is due; every buried one is kicked and the tube drained by
//! `reserve_now`. Checked in every image:
//!
//! - nothing is there that was not put, and every job's data is intact;
//! - ids are stable (a job comes back with the id its put returned) and never reused
//!   (a put into the image gets an id above every one handed out before the cut);
//! - reserves go by priority, and within a priority by arrival in the lane, which
//!   for jobs put straight to ready and never moved is their id order (a moved job
//!   arrives again, later).
//!
//! Under `synced` (every acknowledged append, confirmation and discard is fsync'ed
//! before the call returns), as docs/library.md ("Jobs") promises:
//!
//! - every job whose put was acknowledged before the cut and whose delete was not
//!   tried is there; a job whose delete was acknowledged is not;
//! - a job is there once, but for the window of a move (append to the new lane, then
//!   confirm in the old): each move by its holder (release with another priority or a
//!   delay, bury) under way at the cut may leave one copy more (the new copy can be
//!   reserved and moved on before the old one is confirmed: three copies for two
//!   moves), and of the moves the tube makes under its wheel lock (promotion, kick,
//!   kick-job: one job at a time), the one under way may leave one job that was ever
//!   buried or delayed there once more. A move never leaves a job nowhere.
//!
//! Under `periodic`, what was acknowledged more than the interval before the cut
//! (with the room `power_cut.rs` gives: 3 intervals plus the time fsyncs were held
//! back) holds: a delete is kept; a job left alone since is there exactly once. Jobs
//! ever buried or delayed are left out of that: the tube moves them (kick,
//! promotion) at times the ledger does not know, and a move within the interval can
//! keep the confirmation and lose the new copy (library.md). `buffered` is not run:
//! it promises nothing before a `sync`, which `power_cut.rs` checks.
//!
//! `WEIR_POWER_CUTS=N` sets the cuts per mode (default 40); `WEIR_POWER_CUT_SEED`
//! repeats a run's choices (not its threads' interleaving).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

mod common;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::IteratorRandom;
use rand::{Rng, SeedableRng};
use weir::jobs::{Reserved, Tube};
use weir::{Durability, ManualClock, QueueConfig, Store, StoreOptions};

use common::power_cut::{lock, PowerCut};
use common::{is_payload, payload, payload_id};

const TUBE: &str = "work";
/// The tube's default priority (`QueueConfig::PRIORITY_DEFAULT`) and three others.
const PRIORITIES: [u32; 4] = [1024, 1, 5, 9000];
/// Long enough that no reservation ends while the test runs.
const TTR: Duration = Duration::from_secs(24 * 3600);
/// Jobs kept at most (put and not deleted): every image is drained whole.
const BACKLOG_MAX: usize = 2_000;
const WORKERS: u64 = 3;
/// Cuts per mode unless `WEIR_POWER_CUTS` says otherwise.
const CUTS_DEFAULT: u64 = 40;
const PERIODIC_INTERVAL: Duration = Duration::from_millis(50);

// --- The ledger -----------------------------------------------------------------------

#[derive(Clone, Default)]
struct Ledger {
    next_key: u64,
    /// Every put tried, by the key its data carries: the data's length.
    attempted: HashMap<u64, usize>,
    /// Acknowledged puts: id to key, and key to id.
    put: HashMap<u64, u64>,
    id_of: HashMap<u64, u64>,
    /// Jobs put straight to ready whose holder never tried to move them.
    direct: HashSet<u64>,
    /// Deletes tried and not known to have done nothing; deletes under way (two
    /// workers may try one job: a delete by id that did nothing says nothing of the
    /// other's); deletes acknowledged.
    deleting: HashSet<u64>,
    deletes_in_flight: HashMap<u64, u32>,
    deleted: HashSet<u64>,
    /// Moves by a job's holder: tried, and acknowledged, per job.
    moves_tried: HashMap<u64, u32>,
    moves_done: HashMap<u64, u32>,
    /// Jobs buried or delayed at some point (the tube's own moves take only those).
    parked: HashSet<u64>,
    /// Jobs last known buried: what kick-job and delete by id aim at.
    buried: HashSet<u64>,
    /// When each job was last worked on (put, delete, move, kick-job tried or
    /// acknowledged), and when deletes were acknowledged: what `periodic` keeps.
    touched: HashMap<u64, Instant>,
    deleted_at: HashMap<u64, Instant>,
    /// What happened to each job, for a failure's message.
    story: HashMap<u64, Vec<String>>,
}

impl Ledger {
    /// One delete of `id` is over; how many others are still under way.
    fn delete_over(&mut self, id: u64) -> u32 {
        let left = self
            .deletes_in_flight
            .get(&id)
            .map_or(0, |n| n.saturating_sub(1));
        if left == 0 {
            self.deletes_in_flight.remove(&id);
        } else {
            self.deletes_in_flight.insert(id, left);
        }
        left
    }

    fn tell(&mut self, id: u64, what: String) {
        self.story.entry(id).or_default().push(what);
        self.touched.insert(id, Instant::now());
    }
}

fn options(mode: &str, clock: &ManualClock) -> StoreOptions {
    let durability = match mode {
        "synced" => Durability::Synced,
        _ => Durability::Periodic(PERIODIC_INTERVAL),
    };
    StoreOptions {
        defaults: QueueConfig {
            durability,
            segment_size_bytes: 64 * 1024,
            ..QueueConfig::default()
        },
        clock: clock.clock(),
        ..StoreOptions::default()
    }
}

// --- The workload ---------------------------------------------------------------------

struct Worker {
    tube: Tube,
    ledger: Arc<Mutex<Ledger>>,
    /// Held across a put: ids then follow the order jobs arrive in a lane.
    put_order: Arc<Mutex<()>>,
    rng: StdRng,
}

impl Worker {
    fn run(mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            match self.rng.gen_range(0..20) {
                0..=7 => self.put(),
                8..=17 => self.reserve(),
                18 => {
                    self.tube.kick(self.rng.gen_range(1..4)).unwrap();
                }
                _ => self.by_id(),
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }

    fn put(&mut self) {
        let delay = if self.rng.gen_bool(0.25) {
            Duration::from_millis(self.rng.gen_range(1..600))
        } else {
            Duration::ZERO
        };
        let priority = PRIORITIES[self.rng.gen_range(0..PRIORITIES.len())];
        let data = {
            let mut l = lock(&self.ledger);
            if l.put.len().saturating_sub(l.deleted.len()) >= BACKLOG_MAX {
                return;
            }
            let key = l.next_key;
            l.next_key += 1;
            let data = payload(key, self.rng.gen_range(8..300));
            l.attempted.insert(key, data.len());
            data
        };
        let id = {
            let _order = lock(&self.put_order);
            self.tube.put_delayed(&data, priority, TTR, delay).unwrap()
        };
        let key = payload_id(&data).unwrap();
        let mut l = lock(&self.ledger);
        l.put.insert(id, key);
        l.id_of.insert(key, id);
        l.tell(id, format!("put p{priority} delay {delay:?}"));
        if !delay.is_zero() {
            l.parked.insert(id);
        } else if !l.moves_tried.contains_key(&id) {
            // (Its reserver may have tried to move it already: then it is not direct.)
            l.direct.insert(id);
        }
    }

    fn reserve(&mut self) {
        let Some(r) = self.tube.reserve_now().unwrap() else {
            return;
        };
        let id = r.job.id;
        let action = self.rng.gen_range(0..6);
        {
            let mut l = lock(&self.ledger);
            // Told without touching it: a lease is not stored.
            l.story.entry(id).or_default().push(format!(
                "reserved p{}, then action {action}",
                r.job.priority
            ));
            let key = payload_id(&r.job.data).unwrap();
            // Its put may not be in the ledger yet (acknowledged, not yet recorded).
            if let Some(&known) = l.id_of.get(&key) {
                assert_eq!(known, id, "job {key}'s id changed");
            }
            assert!(!l.deleted.contains(&id), "deleted job {id} reserved");
        }
        match action {
            0 | 1 => self.delete(&r),
            2 => assert!(self.tube.release(&r, r.job.priority).unwrap()),
            3 => {
                if self.rng.gen_bool(0.5) {
                    assert!(self.tube.touch(&r).unwrap());
                }
                let delay = Duration::from_millis(self.rng.gen_range(0..400));
                let priority = PRIORITIES[self.rng.gen_range(0..PRIORITIES.len())];
                self.moved(id, !delay.is_zero(), false, |t| {
                    t.release_delayed(&r, priority, delay)
                });
            }
            4 => {
                let priority = PRIORITIES[self.rng.gen_range(0..PRIORITIES.len())];
                self.moved(id, false, false, |t| t.release(&r, priority));
            }
            _ => self.moved(id, false, true, |t| t.bury(&r)),
        }
    }

    fn delete(&mut self, r: &Reserved) {
        {
            let mut l = lock(&self.ledger);
            l.deleting.insert(r.job.id);
            *l.deletes_in_flight.entry(r.job.id).or_default() += 1;
            l.tell(r.job.id, "deleting".into());
        }
        assert!(self.tube.delete(r).unwrap());
        let mut l = lock(&self.ledger);
        l.delete_over(r.job.id);
        l.deleted.insert(r.job.id);
        l.deleted_at.insert(r.job.id, Instant::now());
        l.tell(r.job.id, "deleted".into());
    }

    /// A move by the job's holder, recorded before it is tried and once it is done.
    fn moved(
        &mut self,
        id: u64,
        delayed: bool,
        buried: bool,
        call: impl FnOnce(&Tube) -> weir::Result<bool>,
    ) {
        {
            let mut l = lock(&self.ledger);
            l.tell(id, format!("moving (delayed {delayed}, buried {buried})"));
            *l.moves_tried.entry(id).or_default() += 1;
            l.direct.remove(&id);
            if delayed || buried {
                l.parked.insert(id);
            }
        }
        assert!(call(&self.tube).unwrap(), "job {id}'s reservation ended");
        let mut l = lock(&self.ledger);
        l.tell(id, format!("moved (delayed {delayed}, buried {buried})"));
        *l.moves_done.entry(id).or_default() += 1;
        if buried {
            l.buried.insert(id);
        }
    }

    /// Kick-job or delete by id of a job last known buried (it may have been kicked
    /// since: then nothing happens).
    fn by_id(&mut self) {
        let Some(id) = lock(&self.ledger)
            .buried
            .iter()
            .copied()
            .choose(&mut self.rng)
        else {
            return;
        };
        let jobs = self.tube.jobs().clone();
        if self.rng.gen_bool(0.5) {
            lock(&self.ledger).tell(id, "kick-job".into());
            let kicked = jobs.kick_job(id).unwrap();
            let mut l = lock(&self.ledger);
            l.tell(id, format!("kick-job: {kicked}"));
            if kicked {
                l.buried.remove(&id);
            }
            return;
        }
        {
            let mut l = lock(&self.ledger);
            l.deleting.insert(id);
            *l.deletes_in_flight.entry(id).or_default() += 1;
            l.tell(id, "deleting by id".into());
        }
        let done = jobs.delete(id).unwrap();
        let mut l = lock(&self.ledger);
        l.tell(id, format!("delete by id: {done}"));
        let others = l.delete_over(id);
        if done {
            l.deleted.insert(id);
            l.deleted_at.insert(id, Instant::now());
            l.buried.remove(&id);
        } else if others == 0 && !l.deleted.contains(&id) {
            // Known to have done nothing, and no other delete of it under way or done.
            l.deleting.remove(&id);
        }
    }
}

/// Runs the manual clock 2 times faster than real time, so that delays come due.
fn ticker(clock: ManualClock, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(5));
        clock.advance(Duration::from_millis(10));
    }
}

// --- Checking an image ----------------------------------------------------------------

/// What an image holds: each id's copies, and the order `reserve_now` handed them out.
struct Drained {
    copies: HashMap<u64, u32>,
    /// Each copy's priority, enqueue time and delivery count.
    details: HashMap<u64, Vec<String>>,
    /// A put into the image: its id.
    new_id: u64,
}

/// Opens the image a day ahead of `now_ms` (so every delayed job is due), kicks every
/// buried job and drains the tube, checking each job and the reserve order.
fn drain(image: &Path, mode: &str, now_ms: u64, after: &Ledger) -> Drained {
    let clock = ManualClock::new();
    clock.advance(Duration::from_millis(
        now_ms.saturating_sub(clock.now_ms()) + 24 * 3600 * 1000,
    ));
    let store = Store::open_with(image, options(mode, &clock))
        .unwrap_or_else(|e| panic!("{mode}: the store does not open after a power cut: {e}"));
    let jobs = store.jobs();
    let tube = jobs.tube(TUBE).unwrap();
    while tube.promote_due().unwrap() > 0 {}
    while tube.kick(u64::MAX).unwrap() > 0 {}
    let mut copies: HashMap<u64, u32> = HashMap::new();
    let mut details: HashMap<u64, Vec<String>> = HashMap::new();
    let mut last_priority = 0;
    // Per priority, the last job put straight to ready and never moved.
    let mut last_direct: HashMap<u32, u64> = HashMap::new();
    while let Some(r) = tube.reserve_now().unwrap() {
        let (id, priority) = (r.job.id, r.job.priority);
        let key = payload_id(&r.job.data).unwrap_or(u64::MAX);
        let Some(&len) = after.attempted.get(&key) else {
            panic!("job {id} was never put (key {key})");
        };
        assert!(is_payload(&r.job.data, key, len), "job {id}'s data changed");
        match after.id_of.get(&key) {
            Some(&known) => assert_eq!(known, id, "job {key} came back with another id"),
            None => assert!(!after.put.contains_key(&id), "id {id} handed out twice"),
        }
        assert!(
            priority >= last_priority,
            "job {id} of priority {priority} reserved after one of {last_priority}"
        );
        last_priority = priority;
        if after.direct.contains(&id) {
            if let Some(&before) = last_direct.get(&priority) {
                assert!(
                    id > before,
                    "job {id} reserved after job {before}, put later, of the same priority"
                );
            }
            last_direct.insert(priority, id);
        }
        *copies.entry(id).or_default() += 1;
        details.entry(id).or_default().push(format!(
            "p{priority}, enqueued at {} ms, delivery {}",
            r.job.enqueued_at_ms, r.deliveries
        ));
        assert!(tube.delete(&r).unwrap());
    }
    let new_id = tube.put(b"after the cut", PRIORITIES[0], TTR).unwrap();
    drop(tube);
    store.close().unwrap();
    Drained {
        copies,
        details,
        new_id,
    }
}

/// Checks an image of a `synced` store against the ledger frozen at the cut
/// (`frozen`) and the ledger taken after the image (`after`: what was tried by then
/// may have reached it).
fn check_synced(frozen: &Ledger, after: &Ledger, got: &Drained) {
    let count = |id: &u64| got.copies.get(id).copied().unwrap_or(0);
    let mut wheel_doubles = Vec::new();
    for (id, key) in &after.put {
        let n = count(id);
        if frozen.deleted.contains(id) {
            assert_eq!(
                n,
                0,
                "job {id}, deleted before the cut, came back; {}",
                got.story(id, frozen, after)
            );
            continue;
        }
        if frozen.put.contains_key(id) && !after.deleting.contains(id) {
            assert!(
                n >= 1,
                "job {id} (key {key}) lost; {}",
                got.story(id, frozen, after)
            );
        }
        // Each move of its holder's under way at the cut (or tried since) may have
        // left one copy more: a move's new copy can be reserved and moved on before
        // the move confirmed the old one.
        let under_way = after.moves_tried.get(id).copied().unwrap_or(0)
            - frozen.moves_done.get(id).copied().unwrap_or(0);
        if n > 1 + under_way {
            assert!(
                n == 2 + under_way && after.parked.contains(id),
                "job {id} is there {n} times, {under_way} moves of it under way; {}",
                got.story(id, frozen, after)
            );
            wheel_doubles.push(*id);
        }
    }
    assert!(
        wheel_doubles.len() <= 1,
        "jobs there once too often with no move of theirs under way: {wheel_doubles:?} \
         (the tube's own moves go one job at a time)"
    );
    check_ids(frozen, got);
}

/// Checks an image of a `periodic` store: what was acknowledged before `settled` (the
/// cut less the interval and the time fsyncs were held back) and not worked on since
/// is as it was. A job ever buried or delayed is left out: the tube moves those on
/// its own (kick, promotion), at times the ledger does not know, and a move within
/// the interval can lose the new copy and keep the confirmation (library.md).
fn check_periodic(frozen: &Ledger, after: &Ledger, got: &Drained, settled: Instant) {
    let count = |id: &u64| got.copies.get(id).copied().unwrap_or(0);
    let before = |t: Option<&Instant>| t.is_some_and(|t| *t < settled);
    for id in frozen.put.keys() {
        let n = count(id);
        if before(frozen.deleted_at.get(id)) {
            assert_eq!(
                n,
                0,
                "job {id}, deleted before the interval, came back; {}",
                got.story(id, frozen, after)
            );
            continue;
        }
        let quiet = after.touched.get(id) == frozen.touched.get(id)
            && before(frozen.touched.get(id))
            && !after.parked.contains(id)
            && !after.deleting.contains(id);
        if quiet {
            assert_eq!(
                n,
                1,
                "job {id}, left alone since before the interval, is there {n} times; {}",
                got.story(id, frozen, after)
            );
        }
    }
    check_ids(frozen, got);
}

/// Ids are never reused: a put into the image gets one above every id handed out
/// before the cut (the counter's file is fsync'ed before a block of ids is used).
fn check_ids(frozen: &Ledger, got: &Drained) {
    let counter = |id: u64| id >> 16;
    let highest = frozen
        .put
        .keys()
        .chain(got.copies.keys())
        .map(|&id| counter(id))
        .max()
        .unwrap_or(0);
    assert!(
        counter(got.new_id) > highest,
        "a put after the cut got id {} (counter {}), not above every id handed out \
         before it (counter {highest})",
        got.new_id,
        counter(got.new_id)
    );
}

impl Drained {
    fn story(&self, id: &u64, frozen: &Ledger, after: &Ledger) -> String {
        format!(
            "its story before the cut: {:?}; after: {:?}; copies in the image: {:?}",
            frozen.story.get(id),
            after.story.get(id),
            self.details.get(id)
        )
    }
}

// --- The run --------------------------------------------------------------------------

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|n| n.parse().ok())
}

fn work_dir() -> tempfile::TempDir {
    // On a tmpfs where there is one: fsyncs cost nothing there, and the simulation
    // does not need the disk's.
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap_or_else(|_| tempfile::tempdir().unwrap())
    } else {
        tempfile::tempdir().unwrap()
    }
}

fn power_cuts(mode: &'static str) {
    let cuts = env_number("WEIR_POWER_CUTS").unwrap_or(CUTS_DEFAULT);
    let seed = env_number("WEIR_POWER_CUT_SEED").unwrap_or_else(|| rand::thread_rng().gen());
    println!("{mode} jobs: {cuts} cuts, seed {seed} (WEIR_POWER_CUT_SEED repeats it)");
    let mut rng = StdRng::seed_from_u64(seed);
    let work = work_dir();
    let root = work.path().join("store");
    fs::create_dir(&root).unwrap();
    let power = PowerCut::install(&root);
    let clock = ManualClock::new();
    let store = Store::open_with(&root, options(mode, &clock)).unwrap();
    let tube = store.jobs().tube(TUBE).unwrap();
    store.sync().unwrap();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let put_order = Arc::new(Mutex::new(()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for i in 0..WORKERS {
        let worker = Worker {
            tube: tube.clone(),
            ledger: Arc::clone(&ledger),
            put_order: Arc::clone(&put_order),
            rng: StdRng::seed_from_u64(seed ^ (i + 1)),
        };
        let s = Arc::clone(&stop);
        threads.push(std::thread::spawn(move || worker.run(&s)));
    }
    {
        let (c, s) = (clock.clone(), Arc::clone(&stop));
        threads.push(std::thread::spawn(move || ticker(c, s)));
    }
    let (mut found, mut doubled, mut held) = (0, 0, Duration::ZERO);
    for i in 0..cuts {
        std::thread::sleep(Duration::from_millis(rng.gen_range(5..60)));
        let keep = [0.0, 0.3, 0.7, 1.0][rng.gen_range(0..4)];
        let image = work.path().join(format!("cut-{i}"));
        let started = Instant::now();
        let (frozen, now_ms, cut) = power
            .cut(&mut rng, keep, &image, || {
                (lock(&ledger).clone(), clock.now_ms(), Instant::now())
            })
            .unwrap();
        let previous_hold = held;
        held = started.elapsed();
        let after = lock(&ledger).clone();
        let got = drain(&image, mode, now_ms, &after);
        if mode == "synced" {
            check_synced(&frozen, &after, &got);
        } else {
            // As power_cut.rs: one interval, one background tick (20 ms), one fsync,
            // and the time fsyncs were held back by the previous image.
            let window = PERIODIC_INTERVAL * 3 + previous_hold.max(held);
            check_periodic(
                &frozen,
                &after,
                &got,
                cut.checked_sub(window).unwrap_or(cut),
            );
        }
        found += got.copies.len();
        doubled += got.copies.values().filter(|&&n| n > 1).count();
        fs::remove_dir_all(&image).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let l = lock(&ledger);
    let moves: u32 = l.moves_done.values().sum();
    println!(
        "{mode} jobs: {cuts} cuts checked, {} puts, {} deletes, {moves} moves acknowledged; \
         {found} jobs found in the images, {doubled} of them more than once",
        l.put.len(),
        l.deleted.len()
    );
    assert!(
        l.put.len() > 200,
        "{mode}: the workload barely ran ({} puts)",
        l.put.len()
    );
    assert!(moves > 50, "{mode}: few moves ({moves})");
    drop(l);
    drop(tube);
    store.close().unwrap();
    drop(power);
}

#[test]
fn jobs_survive_power_cuts_synced() {
    power_cuts("synced");
}

#[test]
fn jobs_survive_power_cuts_periodic() {
    power_cuts("periodic");
}
