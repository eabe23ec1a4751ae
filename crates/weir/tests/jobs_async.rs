//! The event-loop puts (`Tube::put_async`, `Tube::put_delayed_async`) racing what
//! changes a tube's lanes under it: puts into new lanes (made) and past
//! `priorities_max` (empty lanes deleted to make room), delayed puts while buckets
//! ripen and are emptied and deleted, reserves, deletes, releases to other
//! priorities, burials and kicks, all on four threads. Each putter tries the event
//! loop's way first and falls back to the blocking one, as the backend does. At the
//! end every job whose put was acknowledged is reserved and deleted exactly once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir::jobs::Tube;
use weir::{ManualClock, QueueConfig, Store, StoreOptions};

const TTR: Duration = Duration::from_secs(3600);
const PUTS_PER_THREAD: u64 = 1_500;
const PRIORITIES: [u32; 6] = [1024, 1, 2, 3, 4, 5];

/// Puts that took the event loop's way.
static FAST: AtomicU64 = AtomicU64::new(0);

/// Puts like the backend: the event loop's way, else the blocking one. The job's
/// id, or `None` when refused (a priority past `priorities_max`); counts the puts
/// the event loop's way took in `FAST`.
fn put(
    tube: &Tube,
    rt: &tokio::runtime::Runtime,
    data: &[u8],
    pri: u32,
    delay: Duration,
) -> Option<u64> {
    if let Some(id) = rt
        .block_on(tube.put_delayed_async(data, pri, TTR, delay))
        .unwrap()
    {
        FAST.fetch_add(1, Ordering::Relaxed);
        return Some(id);
    }
    match tube.put_delayed(data, pri, TTR, delay) {
        Ok(id) => Some(id),
        Err(e) if e.kind() == weir::ErrorKind::InvalidArgument => None,
        Err(e) => panic!("put: {e}"),
    }
}

fn putter(tube: Tube, seed: u64, acked: Arc<Mutex<HashMap<u64, Vec<u8>>>>, done: Arc<AtomicU64>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut x = seed;
    for i in 0..PUTS_PER_THREAD {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let pri = PRIORITIES[(x >> 33) as usize % PRIORITIES.len()];
        let delay = if (x >> 20).is_multiple_of(4) {
            Duration::from_millis(100 + (x >> 40) % 2_000)
        } else {
            Duration::ZERO
        };
        let data = format!("t{seed}-{i}").into_bytes();
        if let Some(id) = put(&tube, &rt, &data, pri, delay) {
            assert!(
                acked.lock().unwrap().insert(id, data).is_none(),
                "id {id} twice"
            );
        }
        done.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn event_loop_puts_race_lane_changes_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = Store::open_with(
        dir.path(),
        StoreOptions {
            defaults: QueueConfig {
                priorities_max: 4,
                ..QueueConfig::default()
            },
            clock: clock.clock(),
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let tube = store.jobs().tube("race").unwrap();
    let acked = Arc::new(Mutex::new(HashMap::new()));
    let done_puts = Arc::new(AtomicU64::new(0));
    let deleted = Arc::new(Mutex::new(HashMap::<u64, Vec<u8>>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let putters: Vec<_> = (1..=3u64)
        .map(|seed| {
            let (t, a, d) = (tube.clone(), Arc::clone(&acked), Arc::clone(&done_puts));
            std::thread::spawn(move || putter(t, seed, a, d))
        })
        .collect();
    let worker = {
        let (t, del, stop, clock) = (
            tube.clone(),
            Arc::clone(&deleted),
            Arc::clone(&stop),
            clock.clone(),
        );
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                clock.advance(Duration::from_millis(50));
                let Some(r) = t.reserve_now().unwrap() else {
                    std::thread::yield_now();
                    continue;
                };
                match n % 7 {
                    0 => assert!(t.bury(&r).unwrap()),
                    1 => assert!(t
                        .release(&r, PRIORITIES[(n as usize / 7) % PRIORITIES.len()])
                        .unwrap()),
                    2 => {
                        t.kick(5).unwrap();
                        assert!(t.release(&r, r.job.priority).unwrap());
                    }
                    _ => {
                        assert!(t.delete(&r).unwrap());
                        let old = del.lock().unwrap().insert(r.job.id, r.job.data.to_vec());
                        assert!(old.is_none(), "job {} reserved and deleted twice", r.job.id);
                    }
                }
            }
        })
    };
    for p in putters {
        p.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    worker.join().unwrap();
    // Everything due, everything buried kicked, then drained.
    clock.advance(Duration::from_secs(3600));
    loop {
        let kicked = tube.kick(u64::MAX).unwrap();
        let mut took = 0;
        while let Some(r) = tube.reserve_now().unwrap() {
            assert!(tube.delete(&r).unwrap());
            let old = deleted
                .lock()
                .unwrap()
                .insert(r.job.id, r.job.data.to_vec());
            assert!(old.is_none(), "job {} reserved and deleted twice", r.job.id);
            took += 1;
        }
        if kicked == 0 && took == 0 {
            break;
        }
    }
    let acked = acked.lock().unwrap();
    let deleted = deleted.lock().unwrap();
    assert_eq!(done_puts.load(Ordering::Relaxed), 3 * PUTS_PER_THREAD);
    let fast = FAST.load(Ordering::Relaxed);
    assert!(
        fast > PUTS_PER_THREAD && fast < acked.len() as u64,
        "both ways were taken: {fast} of {} on the event loop's",
        acked.len()
    );
    assert!(
        acked.len() as u64 > PUTS_PER_THREAD,
        "most puts were taken: {}",
        acked.len()
    );
    for (id, data) in acked.iter() {
        assert_eq!(deleted.get(id), Some(data), "job {id} lost or changed");
    }
    assert_eq!(deleted.len(), acked.len(), "a job nobody put came out");
    let stats = tube.stats().unwrap();
    assert_eq!(
        (stats.ready, stats.delayed, stats.buried, stats.reserved),
        (0, 0, 0, 0)
    );
}
