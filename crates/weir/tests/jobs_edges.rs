//! The edges a review of the jobs found, each a case that failed before its fix: a
//! moved plain item found by its id; a kick-job racing a kick; delayed and buried
//! jobs untouched by the tube's expiry and delivery limit; the delay wheel bounded
//! without reserves; a failed promotion losing nothing; a lane never deleted under
//! a put; a lost item's delivery count not passed to the next one with its seq.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure is a panic

use std::time::Duration;

use weir::{AppendOptions, QueueConfig, Store, StoreOptions};

const TTR: Duration = Duration::from_secs(60);

/// A plain item (memcache set) buried: its id no longer finds it.
#[test]
fn plain_item_buried_is_lost_to_lookup() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let tube = store.jobs().tube("t").unwrap();
    tube.queue()
        .append(b"plain", AppendOptions::default())
        .unwrap();
    let r = tube.reserve_now().unwrap().unwrap();
    let id = r.job.id;
    assert!(
        store.jobs().find(id).unwrap().is_some(),
        "found while reserved"
    );
    assert!(tube.bury(&r).unwrap());
    assert_eq!(tube.stats().unwrap().buried, 1);
    let found = store.jobs().find(id).unwrap();
    println!(
        "buried plain job found by id: {:?}",
        found.as_ref().map(|f| f.state)
    );
    assert!(
        found.is_some(),
        "buried plain job {id:#x} not found by its id"
    );
}

/// kick_job racing a bulk kick (sequentially simulated: the bulk kick holds the
/// buried job under a lease when kick_job looks): the job ends up ready twice.
#[test]
fn kick_job_while_kick_holds_the_job_duplicates_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let tube = store.jobs().tube("t").unwrap();
    let id = tube.put(b"j", 1024, TTR).unwrap();
    let r = tube.reserve_now().unwrap().unwrap();
    assert!(tube.bury(&r).unwrap());
    // What `kick` does first: lease it from the buried lane.
    let buried = store.existing_queue("lane:t:buried").unwrap().unwrap();
    let lease = buried.reader("").unwrap().take_leased().unwrap().unwrap();
    let f = store.jobs().find(id).unwrap().unwrap();
    println!("state of a buried job under kick's lease: {:?}", f.state);
    let kicked = store.jobs().kick_job(id).unwrap();
    // ...and kick finishes: append to ready, confirm in buried.
    tube.queue()
        .append(
            &lease.item.data,
            AppendOptions {
                job: lease.item.job,
                ..AppendOptions::default()
            },
        )
        .unwrap();
    buried.reader("").unwrap().confirm(lease.id).unwrap();
    let s = tube.stats().unwrap();
    println!("kick_job returned {kicked}; ready now {}", s.ready);
    assert_eq!(s.ready, 1, "job {id} is ready {} times", s.ready);
}

/// A tube with `max_age`: a job delayed longer than that is not expired while it
/// waits (the delay buckets have no expiry).
#[test]
fn delayed_job_longer_than_max_age() {
    let dir = tempfile::tempdir().unwrap();
    let clock = weir::ManualClock::new();
    let options = StoreOptions {
        defaults: QueueConfig {
            max_age: Some(Duration::from_secs(60)),
            ..QueueConfig::default()
        },
        clock: clock.clock(),
        ..StoreOptions::default()
    };
    let store = Store::open_with(dir.path(), options).unwrap();
    let tube = store.jobs().tube("t").unwrap();
    let id = tube
        .put_delayed(b"later", 1024, TTR, Duration::from_secs(3600))
        .unwrap();
    // The wheel moves on at each look, the job down its levels; once ready, the
    // tube's max_age counts from then.
    for _ in 0..59 {
        clock.advance(Duration::from_secs(60));
        tube.stats().unwrap();
    }
    assert!(tube.reserve_now().unwrap().is_none(), "not yet due");
    clock.advance(Duration::from_secs(61));
    let r = tube
        .reserve_now()
        .unwrap()
        .expect("the delayed job is ready");
    assert_eq!(r.job.id, id);
}

/// A tube nobody reserves from: delay buckets pile up past the documented 390.
#[test]
fn buckets_grow_without_a_reserve() {
    let dir = tempfile::tempdir().unwrap();
    let clock = weir::ManualClock::new();
    let options = StoreOptions {
        clock: clock.clock(),
        ..StoreOptions::default()
    };
    let store = Store::open_with(dir.path(), options).unwrap();
    let tube = store.jobs().tube("t").unwrap();
    for _ in 0..1000 {
        tube.put_delayed(b"x", 1024, TTR, Duration::from_secs(1))
            .unwrap();
        clock.advance(Duration::from_millis(200));
    }
    let lanes = store
        .queue_names()
        .iter()
        .filter(|n| n.starts_with("lane:t:d"))
        .count();
    println!("delay lanes after 1000 puts 200 ms apart, no reserve: {lanes}");
    assert!(lanes <= 390, "{lanes} delay lanes");
}

/// The tube's `max_deliveries` does not apply to its buried lane, and a kick whose
/// priority has no room for a lane makes the job ready in the default lane, keeping
/// its priority: nothing is dropped.
#[test]
fn failed_kicks_drop_a_buried_job() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        defaults: QueueConfig {
            max_deliveries: Some(1),
            priorities_max: 2,
            ..QueueConfig::default()
        },
        ..StoreOptions::default()
    };
    let store = Store::open_with(dir.path(), options).unwrap();
    let tube = store.jobs().tube("t").unwrap();
    let id = tube.put(b"buried", 5, TTR).unwrap();
    let r = tube.reserve_now().unwrap().unwrap();
    assert!(tube.bury(&r).unwrap());
    tube.put(b"other", 7, TTR).unwrap();
    assert_eq!(tube.kick(1).unwrap(), 1);
    assert_eq!(tube.kick(1).unwrap(), 0);
    let found = store.jobs().find(id).unwrap().expect("not dropped");
    assert_eq!(
        (found.state, found.job.priority),
        (weir::jobs::JobState::Ready, 5)
    );
}

/// The same for a delayed job whose promotion fails (its ready lane is refused).
#[test]
fn failed_promotions_drop_a_delayed_job() {
    let dir = tempfile::tempdir().unwrap();
    let clock = weir::ManualClock::new();
    let options = StoreOptions {
        defaults: QueueConfig {
            max_deliveries: Some(1),
            priorities_max: 2,
            ..QueueConfig::default()
        },
        clock: clock.clock(),
        ..StoreOptions::default()
    };
    let store = Store::open_with(dir.path(), options).unwrap();
    let tube = store.jobs().tube("t").unwrap();
    let id = tube
        .put_delayed(b"later", 5, TTR, Duration::from_secs(1))
        .unwrap();
    tube.put(b"other", 7, TTR).unwrap();
    clock.advance(Duration::from_secs(2));
    let mut got = Vec::new();
    while let Some(r) = tube.reserve_now().unwrap() {
        got.push(r.job.id);
        assert!(tube.delete(&r).unwrap());
    }
    assert!(got.contains(&id), "the delayed job came due: {got:?}");
}

/// Puts into a priority lane racing `make_room_for_a_lane` deleting it as empty.
#[test]
fn lane_deletion_races_a_put() {
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        defaults: QueueConfig {
            priorities_max: 2,
            durability: weir::Durability::Buffered,
            ..QueueConfig::default()
        },
        ..StoreOptions::default()
    };
    let store = Store::open_with(dir.path(), options).unwrap();
    let put = Arc::new(Mutex::new(HashSet::new()));
    let done = Arc::new(Mutex::new(HashSet::new()));
    let errors = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let threads: Vec<_> = (0..2u32)
        .map(|t| {
            let (store, put, done, errors) =
                (store.clone(), put.clone(), done.clone(), errors.clone());
            std::thread::spawn(move || {
                let tube = store.jobs().tube("t").unwrap();
                let start = std::time::Instant::now();
                let mut k = 0u32;
                while start.elapsed() < Duration::from_secs(3) {
                    k += 1;
                    let pri = if t == 0 { 5 } else { 6 + k % 2 };
                    match tube.put(b"x", pri, TTR) {
                        Ok(id) => {
                            put.lock().unwrap().insert(id);
                        }
                        Err(_) => {
                            errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                    if let Ok(Some(r)) = tube.reserve_now() {
                        if tube.delete(&r).unwrap_or(false) {
                            done.lock().unwrap().insert(r.job.id);
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let tube = store.jobs().tube("t").unwrap();
    while let Some(r) = tube.reserve_now().unwrap() {
        assert!(tube.delete(&r).unwrap());
        done.lock().unwrap().insert(r.job.id);
    }
    let put = put.lock().unwrap();
    let done = done.lock().unwrap();
    let lost: Vec<_> = put.difference(&done).collect();
    println!(
        "put {}, delivered {}, refused puts {}, lost {}",
        put.len(),
        done.len(),
        errors.load(std::sync::atomic::Ordering::Relaxed),
        lost.len()
    );
    assert!(lost.is_empty(), "acknowledged puts lost: {}", lost.len());
}

/// A power cut keeps a Returns record but not the item it counts (a later seq of
/// the segment): the next item appended gets that seq, and its count.
#[test]
fn a_lost_items_return_count_goes_to_the_next_item_with_its_seq() {
    let dir = tempfile::tempdir().unwrap();
    let options = || StoreOptions {
        defaults: QueueConfig {
            max_deliveries: Some(1),
            ..QueueConfig::default()
        },
        ..StoreOptions::default()
    };
    {
        let store = Store::open_with(dir.path(), options()).unwrap();
        let q = store.queue("q").unwrap();
        q.append(b"AAAA", AppendOptions::default()).unwrap();
        q.append(b"BBBB", AppendOptions::default()).unwrap();
        let r = q.reader("").unwrap();
        let _a = r.take_leased().unwrap().unwrap();
        let b = r.take_leased().unwrap().unwrap();
        assert_eq!(b.item.seq, 2);
        r.release(b.id).unwrap();
        store.close().unwrap();
    }
    // The cut: record 2 never reached the disk (its bytes are zeroes).
    let seg = std::fs::read_dir(dir.path().join("queues"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with('q'))
        .unwrap()
        .join(format!("{:020}.seg", 1));
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = 32 + 40 + 4;
    for b in &mut bytes[at..at + 44] {
        *b = 0;
    }
    std::fs::write(&seg, &bytes).unwrap();
    let store = Store::open_with(dir.path(), options()).unwrap();
    let q = store.queue("q").unwrap();
    let c = q.append(b"CCCC", AppendOptions::default()).unwrap();
    let r = q.reader("").unwrap();
    let first = r.take_leased().unwrap().unwrap();
    println!(
        "seq of the new item: {c}; first take: seq {}",
        first.item.seq
    );
    let second = r.take_leased().unwrap();
    println!(
        "second take: {:?}; stats {:?}",
        second.as_ref().map(|l| (l.item.seq, l.deliveries)),
        q.stats().readers
    );
    assert!(
        second.is_some(),
        "the new item, never delivered, was dead-lettered (dropped)"
    );
}

/// `delete <id>` racing `kick-job <id>` on a buried job: kick-job looks under the
/// tube's wheel lock, appends the job to its ready lane, then discards the buried
/// copy. A delete by id that discarded the buried copy in between answered "deleted"
/// while the kicked copy lived on, ready. The delete now takes the wheel lock too.
#[test]
fn delete_by_id_racing_kick_job_never_leaves_a_deleted_job() {
    use std::sync::{Arc, Barrier};
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        defaults: QueueConfig {
            durability: weir::Durability::Synced,
            ..QueueConfig::default()
        },
        ..StoreOptions::default()
    };
    let store = Store::open_with(dir.path(), options).unwrap();
    let tube = store.jobs().tube("t").unwrap();
    let (mut deleted, mut kicked) = (0, 0);
    for round in 0..100 {
        let id = tube.put(b"j", 1024, TTR).unwrap();
        let r = tube.reserve_now().unwrap().unwrap();
        assert!(tube.bury(&r).unwrap());
        let barrier = Arc::new(Barrier::new(2));
        let kick = {
            let (jobs, barrier) = (store.jobs(), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                jobs.kick_job(id).unwrap()
            })
        };
        barrier.wait();
        let gone = store.jobs().delete(id).unwrap();
        let was_kicked = kick.join().unwrap();
        let left = store.jobs().find(id).unwrap();
        if gone {
            deleted += 1;
            assert!(
                left.is_none(),
                "round {round}: job {id} deleted (kick-job said {was_kicked}) is still there: {:?}",
                left.map(|f| f.state)
            );
        } else {
            kicked += 1;
            assert!(was_kicked, "round {round}: neither deleted nor kicked");
            let r = tube.reserve_now().unwrap().expect("the kicked job");
            assert!(tube.delete(&r).unwrap());
        }
        assert!(tube.reserve_now().unwrap().is_none(), "round {round}");
    }
    println!("deleted first {deleted} times, kicked first {kicked} times");
}

/// A lookup by id racing the promotion of delayed jobs: the bucket lane it is reading
/// is emptied and deleted under it. The lookup used to fail (`NotFound`, the lane's
/// segment gone); it now reads the tube again and finds the job where it went.
#[test]
fn lookup_racing_a_promotion_finds_the_job() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let clock = weir::ManualClock::new();
    let options = StoreOptions {
        clock: clock.clock(),
        ..StoreOptions::default()
    };
    let store = Store::open_with(dir.path(), options).unwrap();
    let tube = store.jobs().tube("t").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut lookups = 0;
    for round in 0..15u64 {
        // Jobs in many level-0 buckets (128 ms each), due within the next 4 s.
        let ids: Vec<u64> = (0..32u64)
            .map(|i| {
                let delay = Duration::from_millis(1 + i * 128);
                tube.put_delayed(b"d", 1024, TTR, delay).unwrap()
            })
            .collect();
        stop.store(false, Ordering::Relaxed);
        let promoter = {
            let (tube, clock, stop) = (tube.clone(), clock.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) && tube.delayed_count().unwrap() > 0 {
                    clock.advance(Duration::from_millis(128));
                    tube.promote_due().unwrap();
                }
            })
        };
        for &id in ids.iter().rev().cycle().take(200) {
            let found = store.jobs().find(id);
            let found = found.unwrap_or_else(|e| panic!("round {round}: find({id}): {e}"));
            assert!(found.is_some(), "round {round}: job {id} not found");
            lookups += 1;
        }
        stop.store(true, Ordering::Relaxed);
        promoter.join().unwrap();
        while let Some(r) = tube.reserve_now().unwrap() {
            assert!(tube.delete(&r).unwrap());
        }
    }
    println!("{lookups} lookups");
}
