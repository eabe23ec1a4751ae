//! Items stored with a job extension (`AppendOptions::job`): the id, priority and ttr
//! come back with the item, the data without them, through takes, leases, peeks,
//! iteration, a reopen, a move to `dead_letter_to`, and a torn tail's recovery; a
//! batch with a job is refused; the queue's item size limit applies to the data.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure is a panic

mod common;

use std::fs::OpenOptions;
use std::io::Write;

use weir::{AppendOptions, ErrorKind, JobMeta, QueueConfig, Store, TakeMode};

fn job(id: u64) -> AppendOptions {
    AppendOptions {
        flags: 3,
        job: Some(JobMeta {
            id,
            priority: 10,
            ttr_s: 120,
            due_ms: 0,
        }),
        ..AppendOptions::default()
    }
}

#[test]
fn a_job_comes_back_with_its_extension_and_clean_data() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let q = store.queue("q").unwrap();
        let r = q.reader("").unwrap();
        q.append(b"plain", AppendOptions::default()).unwrap();
        q.append(b"work", job(77)).unwrap();
        q.append(b"", job(78)).unwrap();
        let kept: Vec<_> = q.iter().unwrap().map(|i| i.unwrap()).collect();
        assert_eq!(kept.len(), 3);
        assert_eq!((kept[0].job, &kept[0].data[..]), (None, &b"plain"[..]));
        assert_eq!(kept[1].job.map(|j| j.id), Some(77));
        assert_eq!(&kept[1].data[..], b"work");
        assert_eq!(kept[2].data.len(), 0, "an empty job is empty");
        assert_eq!(r.take().unwrap().unwrap().job, None);
        let peeked = r.take_mode(TakeMode::Peek).unwrap().unwrap();
        assert_eq!(
            peeked.item.job.map(|j| (j.priority, j.ttr_s)),
            Some((10, 120))
        );
        let l = r.take_leased().unwrap().unwrap();
        assert_eq!((l.item.job.map(|j| j.id), l.item.flags), (Some(77), 3));
        assert!(r.release(l.id).unwrap());
        // The payload bytes counted are the data and the 24-byte extension.
        assert_eq!(q.stats().bytes, 4 + 24 + 24);
        drop((q, r));
        store.close().unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    let r = store.queue("q").unwrap().reader("").unwrap();
    let again = r.take().unwrap().unwrap();
    assert_eq!(
        (again.job.map(|j| j.id), &again.data[..]),
        (Some(77), &b"work"[..])
    );
    assert_eq!(r.take().unwrap().unwrap().job.map(|j| j.id), Some(78));
}

#[test]
fn a_batch_with_a_job_is_refused_and_the_size_limit_is_the_datas() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open_with_config(
        dir.path(),
        QueueConfig {
            max_item_size_bytes: 8,
            ..QueueConfig::default()
        },
    )
    .unwrap();
    let q = store.queue("q").unwrap();
    let refused = q.append_batch(&[b"a", b"b"], job(1)).unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::InvalidArgument);
    q.append(b"12345678", job(2)).unwrap();
    let big = q.append(b"123456789", job(3)).unwrap_err();
    assert_eq!(big.kind(), ErrorKind::TooLarge);
    assert_eq!(q.stats().total_items, 1);
}

#[test]
fn a_dead_letter_keeps_its_job() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open_with_config(
        dir.path(),
        QueueConfig {
            max_deliveries: Some(1),
            dead_letter_to: Some("dead".into()),
            ..QueueConfig::default()
        },
    )
    .unwrap();
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    q.append(b"poison", job(5)).unwrap();
    let l = r.take_leased().unwrap().unwrap();
    assert!(r.release(l.id).unwrap());
    assert!(r.take().unwrap().is_none());
    let moved = store
        .queue("dead")
        .unwrap()
        .reader("")
        .unwrap()
        .take()
        .unwrap()
        .unwrap();
    assert_eq!(
        (moved.job.map(|j| j.id), &moved.data[..]),
        (Some(5), &b"poison"[..])
    );
}

#[test]
fn a_torn_job_record_is_cut_and_the_ones_before_kept() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let q = store.queue("q").unwrap();
        q.append(b"first", job(1)).unwrap();
        q.append(b"second", job(2)).unwrap();
        store.close().unwrap();
    }
    // Tear the last record: zero its last 4 bytes (data written only in part).
    let seg = common::segment_files(dir.path(), "q").pop().unwrap();
    let len = std::fs::metadata(&seg).unwrap().len();
    let data = std::fs::read(&seg).unwrap();
    let end = data.iter().rposition(|&b| b != 0).unwrap() as u64 + 1;
    assert!(end <= len);
    let mut f = OpenOptions::new().write(true).open(&seg).unwrap();
    use std::io::Seek;
    f.seek(std::io::SeekFrom::Start(end - 4)).unwrap();
    f.write_all(&[0, 0, 0, 0]).unwrap();
    drop(f);
    let store = Store::open(dir.path()).unwrap();
    let r = store.queue("q").unwrap().reader("").unwrap();
    let first = r.take().unwrap().unwrap();
    assert_eq!(
        (first.job.map(|j| j.id), &first.data[..]),
        (Some(1), &b"first"[..])
    );
    assert!(
        r.take().unwrap().is_none(),
        "the torn job is cut, not misread"
    );
}

#[test]
fn discard_drops_one_pending_item_out_of_order_and_never_a_leased_one() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let q = store.queue("q").unwrap();
        let r = q.reader("").unwrap();
        for i in 1..=5u8 {
            q.append(&[i; 10], AppendOptions::default()).unwrap();
        }
        let leased = r.take_leased().unwrap().unwrap(); // 1
        let released = r.take_leased().unwrap().unwrap(); // 2
        assert!(r.release(released.id).unwrap());
        assert_eq!(r.discard(1).unwrap(), None, "leased: its holder's");
        assert_eq!(
            r.discard(2).unwrap().map(|i| i.data[0]),
            Some(2),
            "released"
        );
        assert_eq!(
            r.discard(4).unwrap().map(|i| i.data[0]),
            Some(4),
            "ahead of the cursor"
        );
        assert_eq!(r.discard(4).unwrap(), None, "once");
        assert_eq!(r.discard(99).unwrap(), None, "never stored");
        assert!(r.confirm(leased.id).unwrap());
        assert_eq!(q.stats().items, 2);
        drop((q, r));
        store.close().unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    let q = store.queue("q").unwrap();
    let r = q.reader("").unwrap();
    let left: Vec<u8> = std::iter::from_fn(|| r.take().unwrap().map(|i| i.data[0])).collect();
    assert_eq!(left, vec![3, 5], "the discarded stay gone after a reopen");
    assert_eq!((q.stats().items, q.stats().bytes), (0, 0));
    assert_eq!(r.discard(3).unwrap(), None, "confirmed by a take");
}
