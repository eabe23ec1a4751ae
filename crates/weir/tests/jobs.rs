//! The work-queue features over the engine (`weir::jobs`): priorities in lanes,
//! reserve by urgency, release with another priority, bury and kick, jobs found by
//! id, ttr as the reservation's lease, the bound on priorities, plain items as jobs,
//! a waiting reserve, and all of it across a reopen.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure is a panic

mod common;

use std::collections::HashSet;
use std::time::Duration;

use weir::jobs::JobState;
use weir::{AppendOptions, QueueConfig, Store};

const TTR: Duration = Duration::from_secs(60);

fn data(r: &weir::jobs::Reserved) -> &[u8] {
    &r.job.data
}

#[test]
fn reserve_goes_by_priority_then_arrival_and_ids_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut ids = Vec::new();
    {
        let store = Store::open(dir.path()).unwrap();
        let tube = store.jobs().tube("emails").unwrap();
        for (body, pri) in [
            ("low", 5000u32),
            ("default1", 1024),
            ("urgent", 0),
            ("default2", 1024),
            ("mid", 10),
        ] {
            ids.push(tube.put(body.as_bytes(), pri, TTR).unwrap());
        }
        assert_eq!(
            ids.iter().collect::<HashSet<_>>().len(),
            5,
            "ids are unique"
        );
        let names = store.queue_names();
        assert!(names.contains(&"lane:emails:p0".to_string()), "{names:?}");
        assert!(
            !names.contains(&"lane:emails:p1024".to_string()),
            "the default is the tube's queue"
        );
        let first = tube.reserve_now().unwrap().unwrap();
        assert_eq!(
            (data(&first), first.job.id, first.job.priority),
            (&b"urgent"[..], ids[2], 0)
        );
        assert!(tube.delete(&first).unwrap());
        store.close().unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    let tube = store.jobs().tube("emails").unwrap();
    let order: Vec<(Vec<u8>, u64)> = std::iter::from_fn(|| {
        let r = tube.reserve_now().unwrap()?;
        assert!(tube.delete(&r).unwrap());
        Some((r.job.data.to_vec(), r.job.id))
    })
    .collect();
    let bodies: Vec<&[u8]> = order.iter().map(|(b, _)| &b[..]).collect();
    assert_eq!(bodies, vec![&b"mid"[..], b"default1", b"default2", b"low"]);
    assert_eq!(order[0].1, ids[4], "the id is the same after a reopen");
    let next = tube.put(b"new", 1024, TTR).unwrap();
    assert!(!ids.contains(&next), "never reused");
    assert!(next >> 16 > ids.iter().map(|i| i >> 16).max().unwrap());
}

#[test]
fn release_bury_kick_and_find_by_id() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let jobs = store.jobs();
    let tube = jobs.tube("work").unwrap();
    let a = tube.put(b"a", 100, TTR).unwrap();
    let b = tube.put(b"b", 100, TTR).unwrap();
    let ra = tube.reserve_now().unwrap().unwrap();
    assert_eq!(jobs.find(a).unwrap().unwrap().state, JobState::Reserved);
    assert!(!jobs.delete(a).unwrap(), "a reserved job is its holder's");
    // Released with a later priority: b comes first now.
    assert!(tube.release(&ra, 200).unwrap());
    assert!(!tube.delete(&ra).unwrap(), "the old reservation is over");
    let rb = tube.reserve_now().unwrap().unwrap();
    assert_eq!(rb.job.id, b);
    assert!(tube.bury(&rb).unwrap());
    let found = jobs.find(b).unwrap().unwrap();
    assert_eq!(
        (found.state, found.tube.as_str()),
        (JobState::Buried, "work")
    );
    assert_eq!(tube.peek_buried().unwrap().map(|j| j.id), Some(b));
    let again = tube.reserve_now().unwrap().unwrap();
    assert_eq!(
        (again.job.id, again.job.priority),
        (a, 200),
        "same id, new priority"
    );
    assert!(tube.delete(&again).unwrap());
    assert!(tube.reserve_now().unwrap().is_none(), "b is buried");
    assert_eq!(tube.stats().unwrap().buried, 1);
    assert!(jobs.kick_job(b).unwrap());
    assert!(!jobs.kick_job(b).unwrap(), "not buried any more");
    assert_eq!(jobs.find(b).unwrap().unwrap().state, JobState::Ready);
    assert!(jobs.delete(b).unwrap(), "a ready job is deleted by id");
    assert!(jobs.find(b).unwrap().is_none());
    assert!(jobs.find(a).unwrap().is_none(), "deleted by its holder");
    let stats = tube.stats().unwrap();
    assert_eq!(
        (stats.ready, stats.reserved, stats.buried, stats.total_put),
        (0, 0, 0, 2)
    );
}

#[test]
fn kick_moves_the_oldest_buried_first_and_keeps_priorities() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let tube = store.jobs().tube("k").unwrap();
    for (body, pri) in [("x", 7u32), ("y", 3), ("z", 7)] {
        tube.put(body.as_bytes(), pri, TTR).unwrap();
    }
    for _ in 0..3 {
        let r = tube.reserve_now().unwrap().unwrap();
        assert!(tube.bury(&r).unwrap());
    }
    // Buried in reserve order: y (3), x, z.
    assert_eq!(tube.kick(2).unwrap(), 2);
    assert_eq!(tube.stats().unwrap().buried, 1);
    let r = tube.reserve_now().unwrap().unwrap();
    assert_eq!((data(&r), r.job.priority), (&b"y"[..], 3));
    assert_eq!(tube.kick(10).unwrap(), 1);
    assert_eq!(tube.kick(10).unwrap(), 0);
}

#[test]
fn the_ttr_is_the_reservations_lease_and_touch_renews_it() {
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = common::open_on_manual_clock(dir.path(), QueueConfig::default());
    let tube = store.jobs().tube("t").unwrap();
    tube.put(b"slow", 1024, Duration::from_secs(2)).unwrap();
    let r = tube.reserve_now().unwrap().unwrap();
    assert!(tube.time_left(&r).unwrap() <= Duration::from_secs(2));
    clock.advance(Duration::from_millis(1500));
    assert!(tube.touch(&r).unwrap());
    clock.advance(Duration::from_millis(1500));
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        tube.reserve_now().unwrap().is_none(),
        "touched: still reserved"
    );
    clock.advance(Duration::from_millis(600));
    assert!(common::wait_until(Duration::from_secs(3), || tube
        .stats()
        .unwrap()
        .reserved
        == 0));
    let again = tube.reserve_now().unwrap().unwrap();
    assert_eq!((data(&again), again.deliveries), (&b"slow"[..], 2));
    assert!(
        tube.time_left(&r).is_none(),
        "the first reservation is over"
    );
}

#[test]
fn priorities_are_bounded_and_empty_lanes_make_room() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open_with_config(
        dir.path(),
        QueueConfig {
            priorities_max: 3,
            ..QueueConfig::default()
        },
    )
    .unwrap();
    let tube = store.jobs().tube("b").unwrap();
    tube.put(b"1", 1, TTR).unwrap();
    tube.put(b"2", 2, TTR).unwrap();
    tube.put(b"d", 1024, TTR).unwrap();
    let refused = tube.put(b"3", 3, TTR).unwrap_err();
    assert_eq!(refused.kind(), weir::ErrorKind::InvalidArgument);
    assert!(refused.to_string().contains("priorities_max"), "{refused}");
    let one = tube.reserve_now().unwrap().unwrap();
    assert!(tube.delete(&one).unwrap());
    tube.put(b"3", 3, TTR).unwrap();
    assert!(
        !store.queue_names().contains(&"lane:b:p1".to_string()),
        "the empty lane went"
    );
}

#[test]
fn a_plain_item_is_a_job_with_an_id_made_from_its_seq() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let jobs = store.jobs();
    let tube = jobs.tube("mixed").unwrap();
    tube.queue()
        .append(b"from memcache", AppendOptions::default())
        .unwrap();
    let peeked = tube.peek_ready().unwrap().unwrap();
    assert_eq!(peeked.priority, 1024);
    let found = jobs.find(peeked.id).unwrap().unwrap();
    assert_eq!(
        (&found.job.data[..], found.state),
        (&b"from memcache"[..], JobState::Ready)
    );
    let r = tube.reserve_now().unwrap().unwrap();
    assert_eq!((r.job.id, r.job.ttr), (peeked.id, weir::jobs::TTR_DEFAULT));
    assert!(tube.delete(&r).unwrap());
    assert!(jobs.find(peeked.id).unwrap().is_none());
}

#[test]
fn lane_names_are_not_tubes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert!(store.jobs().tube("lane:x:p1").is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_reserve_wakes_for_a_job_in_a_new_lane_and_times_out_empty() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let jobs = store.jobs();
    let a = jobs.tube("a").unwrap();
    let b = jobs.tube("b").unwrap();
    let none = jobs
        .reserve(&[a.clone(), b.clone()], Duration::from_millis(100))
        .await
        .unwrap();
    assert!(none.is_none());
    let putter = b.clone();
    let put = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        putter.put(b"late", 77, TTR).unwrap()
    });
    let started = std::time::Instant::now();
    let got = jobs
        .reserve(&[a, b], Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.job.id, put.await.unwrap());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "woken, not timed out"
    );
}

/// `put_async` appends on the caller's thread to a lane that exists (the tube's own
/// queue, or a priority's lane an earlier put made) and leaves the rest to `put`:
/// `None`, with nothing stored and no lane made; so does a put that would write the
/// id counter's file (the process's first).
#[test]
fn put_async_goes_to_lanes_that_exist_and_leaves_the_rest_to_put() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let tube = store.jobs().tube("async").unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let put_async =
        |body: &'static [u8], pri: u32| rt.block_on(tube.put_async(body, pri, TTR)).unwrap();
    assert_eq!(
        put_async(b"own", 1024),
        None,
        "the first id opens the counter's file"
    );
    let own = tube.put(b"own", 1024, TTR).unwrap();
    let own2 = put_async(b"own2", 1024).expect("the default priority's lane is the tube's queue");
    assert_eq!(put_async(b"new", 7), None, "no lane for 7 yet");
    assert!(
        !store.queue_names().contains(&"lane:async:p7".to_string()),
        "no lane made on the event loop"
    );
    assert_eq!(
        tube.stats().unwrap().ready,
        2,
        "nothing stored for the refusals"
    );
    let first7 = tube.put(b"seven-1", 7, TTR).unwrap();
    let second7 = put_async(b"seven-2", 7).expect("the lane exists now");
    let ids: HashSet<u64> = [own, own2, first7, second7].into_iter().collect();
    assert_eq!(ids.len(), 4, "ids are unique");
    let order: Vec<(Vec<u8>, u64)> = std::iter::from_fn(|| {
        let r = tube.reserve_now().unwrap()?;
        assert!(tube.delete(&r).unwrap());
        Some((r.job.data.to_vec(), r.job.id))
    })
    .collect();
    assert_eq!(
        order,
        [
            (b"seven-1".to_vec(), first7),
            (b"seven-2".to_vec(), second7),
            (b"own".to_vec(), own),
            (b"own2".to_vec(), own2),
        ]
    );
}
