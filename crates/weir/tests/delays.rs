//! Delayed jobs (`weir::jobs`, the delay wheel): invisible until due, never ready
//! early and at most a bucket late, across every level of the wheel; released with a
//! delay; kicked early; found by id; kept across a reopen; and the wheel's lanes
//! stay bounded however many jobs wait.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure is a panic

mod common;

use std::time::Duration;

use weir::jobs::JobState;
use weir::{ManualClock, QueueConfig, Store, StoreOptions};

const TTR: Duration = Duration::from_secs(60);

fn open(dir: &std::path::Path, clock: &ManualClock) -> Store {
    Store::open_with(
        dir,
        StoreOptions {
            defaults: QueueConfig::default(),
            clock: clock.clock(),
            ..StoreOptions::default()
        },
    )
    .unwrap()
}

/// The delay wheel's lanes (`lane:TUBE:dL-START`).
fn lanes(store: &Store) -> Vec<String> {
    store
        .queue_names()
        .into_iter()
        .filter(|n| {
            n.starts_with("lane:")
                && n.rsplit(':')
                    .next()
                    .is_some_and(|l| l.starts_with('d') && l.contains('-'))
        })
        .collect()
}

#[test]
fn a_delayed_job_is_ready_at_its_time_and_not_before() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = open(dir.path(), &clock);
    let tube = store.jobs().tube("d").unwrap();
    let id = tube
        .put_delayed(b"later", 5, TTR, Duration::from_secs(5))
        .unwrap();
    tube.put(b"now", 9, TTR).unwrap();
    let first = tube.reserve_now().unwrap().unwrap();
    assert_eq!(&first.job.data[..], b"now", "the delayed one is not ready");
    assert!(tube.delete(&first).unwrap());
    let stats = tube.stats().unwrap();
    assert_eq!((stats.delayed, stats.ready), (1, 0));
    assert_eq!(
        store.jobs().find(id).unwrap().unwrap().state,
        JobState::Delayed
    );
    assert_eq!(tube.peek_delayed().unwrap().map(|j| j.id), Some(id));
    clock.advance(Duration::from_millis(4_999));
    assert!(tube.reserve_now().unwrap().is_none(), "1 ms early");
    clock.advance(Duration::from_millis(130));
    let r = tube.reserve_now().unwrap().unwrap();
    assert_eq!((r.job.id, r.job.priority, r.job.due_ms), (id, 5, 0));
    assert!(tube.delete(&r).unwrap());
    assert!(
        lanes(&store).is_empty(),
        "the emptied bucket's lane went: {:?}",
        lanes(&store)
    );
}

#[test]
fn long_delays_go_down_the_wheel_and_arrive_in_due_order() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = open(dir.path(), &clock);
    let tube = store.jobs().tube("w").unwrap();
    // From 1 s to 40 days, put out of order.
    let delays_s = [3_456_000u64, 1, 86_400, 600, 30, 7_200, 2, 1_000_000];
    for d in delays_s {
        tube.put_delayed(d.to_string().as_bytes(), 1024, TTR, Duration::from_secs(d))
            .unwrap();
    }
    assert!(lanes(&store).len() <= delays_s.len());
    let mut sorted = delays_s.to_vec();
    sorted.sort_unstable();
    let mut elapsed = 0u64;
    for d in sorted {
        // Just before: not ready; just after: ready.
        let step = d * 1000 - elapsed;
        clock.advance(Duration::from_millis(step - 1));
        assert!(tube.reserve_now().unwrap().is_none(), "{d} s: early");
        clock.advance(Duration::from_millis(129));
        elapsed = d * 1000 + 128;
        let r = tube.reserve_now().unwrap().unwrap();
        assert_eq!(std::str::from_utf8(&r.job.data).unwrap(), d.to_string());
        assert!(tube.delete(&r).unwrap());
    }
    assert!(lanes(&store).is_empty(), "{:?}", lanes(&store));
}

#[test]
fn release_with_a_delay_kick_and_kick_job() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = open(dir.path(), &clock);
    let jobs = store.jobs();
    let tube = jobs.tube("r").unwrap();
    let a = tube.put(b"a", 1, TTR).unwrap();
    let r = tube.reserve_now().unwrap().unwrap();
    assert!(tube
        .release_delayed(&r, 1, Duration::from_secs(60))
        .unwrap());
    assert!(tube.reserve_now().unwrap().is_none());
    assert_eq!(jobs.find(a).unwrap().unwrap().state, JobState::Delayed);
    let b = tube
        .put_delayed(b"b", 1, TTR, Duration::from_secs(30))
        .unwrap();
    let c = tube
        .put_delayed(b"c", 1, TTR, Duration::from_secs(90))
        .unwrap();
    // No job is buried: kick moves delayed ones, the earliest bucket first.
    assert_eq!(tube.kick(1).unwrap(), 1);
    let first = tube.reserve_now().unwrap().unwrap();
    assert_eq!(first.job.id, b);
    assert!(tube.delete(&first).unwrap());
    assert!(jobs.kick_job(c).unwrap());
    assert!(!jobs.kick_job(c).unwrap(), "ready now");
    assert_eq!(jobs.find(c).unwrap().unwrap().state, JobState::Ready);
    assert_eq!(tube.stats().unwrap().delayed, 1);
    assert!(jobs.delete(a).unwrap(), "a delayed job deleted by id");
    assert_eq!(tube.stats().unwrap().delayed, 0);
}

#[test]
fn delayed_jobs_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let id;
    {
        let store = open(dir.path(), &clock);
        let tube = store.jobs().tube("p").unwrap();
        id = tube
            .put_delayed(b"kept", 1024, TTR, Duration::from_secs(3600))
            .unwrap();
        store.close().unwrap();
    }
    let store = open(dir.path(), &clock);
    let tube = store.jobs().tube("p").unwrap();
    assert_eq!(tube.stats().unwrap().delayed, 1);
    assert!(tube.reserve_now().unwrap().is_none());
    clock.advance(Duration::from_secs(3601));
    let r = tube.reserve_now().unwrap().unwrap();
    assert_eq!(r.job.id, id);
}

#[test]
fn many_delayed_jobs_keep_the_wheel_small() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = open(dir.path(), &clock);
    let tube = store.jobs().tube("many").unwrap();
    let mut state = 12345u64;
    for i in 0..3000u64 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let delay_ms = (state >> 33) % 86_400_000;
        tube.put_delayed(&i.to_le_bytes(), 1024, TTR, Duration::from_millis(delay_ms))
            .unwrap();
    }
    let buckets = lanes(&store).len();
    assert!(buckets <= 6 * 65, "{buckets} buckets");
    let mut got = 0;
    let mut now_ms = 0;
    while now_ms <= 86_400_000 + 200 {
        clock.advance(Duration::from_millis(600_000));
        now_ms += 600_000;
        while let Some(r) = tube.reserve_now().unwrap() {
            assert!(tube.delete(&r).unwrap());
            got += 1;
        }
        assert!(lanes(&store).len() <= 6 * 65);
    }
    assert_eq!(got, 3000);
    assert!(lanes(&store).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_reserve_wakes_when_a_delayed_job_is_due() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let tube = store.jobs().tube("wake").unwrap();
    let id = tube
        .put_delayed(b"soon", 1024, TTR, Duration::from_millis(300))
        .unwrap();
    let started = std::time::Instant::now();
    let r = tube
        .reserve(Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    let waited = started.elapsed();
    assert_eq!(r.job.id, id);
    assert!(waited >= Duration::from_millis(290), "early: {waited:?}");
    assert!(waited < Duration::from_secs(5), "not woken: {waited:?}");
}

/// `put_delayed_async` appends on the caller's thread to a bucket that exists and
/// leaves the rest to `put_delayed`: `None`, with nothing stored and no bucket made;
/// what it stores is delayed like any other put's, and becomes ready when due.
#[test]
fn put_delayed_async_goes_to_buckets_that_exist_and_leaves_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = open(dir.path(), &clock);
    let tube = store.jobs().tube("da").unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let delay = Duration::from_secs(3600);
    let put = |body: &'static [u8], pri: u32| {
        rt.block_on(tube.put_delayed_async(body, pri, TTR, delay))
            .unwrap()
    };
    assert_eq!(put(b"first", 1024), None, "no bucket yet");
    assert!(lanes(&store).is_empty(), "no bucket made on the event loop");
    assert_eq!(tube.stats().unwrap().delayed, 0);
    let first = tube.put_delayed(b"first", 1024, TTR, delay).unwrap();
    let second = put(b"second", 1024).expect("the bucket exists now");
    assert_eq!(put(b"other", 3), None, "priority 3 has no lane yet");
    assert_eq!(lanes(&store).len(), 1, "{:?}", lanes(&store));
    let stats = tube.stats().unwrap();
    assert_eq!((stats.delayed, stats.ready), (2, 0));
    assert_eq!(
        store.jobs().find(second).unwrap().unwrap().state,
        JobState::Delayed
    );
    assert!(tube.reserve_now().unwrap().is_none(), "not due");
    clock.advance(delay + Duration::from_secs(600));
    let order: Vec<u64> = std::iter::from_fn(|| {
        let r = tube.reserve_now().unwrap()?;
        assert!(tube.delete(&r).unwrap());
        Some(r.job.id)
    })
    .collect();
    assert_eq!(order, [first, second]);
}
