//! What every backend must do alike, run on each home: the engine (`tests/contract.rs`)
//! and a JetStream cluster (`tests/jetstream.rs`).

use std::error::Error as StdError;
use std::time::Duration;

use weir_backend::{AppendOptions, Backend, Reader, SeekTo, TakeMode};

pub type TestResult = std::result::Result<(), Box<dyn StdError>>;

async fn next(r: &Reader) -> std::result::Result<Option<String>, weir_backend::Error> {
    let taken = r.take(TakeMode::Take, Duration::from_millis(200)).await?;
    Ok(taken.map(|t| String::from_utf8_lossy(&t.item.data).into_owned()))
}

async fn all(r: &Reader) -> std::result::Result<Vec<String>, weir_backend::Error> {
    let mut got = Vec::new();
    while let Some(item) = next(r).await? {
        got.push(item);
    }
    Ok(got)
}

/// A reader moves back to a seq or a time and forward to the end; a lease it held
/// ends with the move; a reader that does not exist is not made by a move; the
/// bounds and the search by time agree with what was appended.
pub async fn readers_move_back_and_forward(backend: &Backend) -> TestResult {
    let q = backend.queue("moving").await?;
    // The default reader never takes here: it keeps every item.
    backend.reader(&q, "").await?;
    let r = backend.reader(&q, "r").await?;
    let opts = AppendOptions::default();
    let mut seqs = Vec::new();
    for item in ["1", "2", "3"] {
        seqs.push(q.append(item.as_bytes(), opts).await?);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let middle_ms = backend.now_ms();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let four = q.append_batch(&[b"4", b"5"], opts).await?;
    let (oldest, end) = q.bounds().await?;
    assert!(oldest <= seqs[0] && seqs[0] < seqs[1] && seqs[2] < four && four < end);
    assert_eq!(q.seq_at_time(middle_ms).await?, four);
    assert_eq!(q.seq_at_time(0).await?, oldest);
    assert_eq!(q.seq_at_time(backend.now_ms() + 3_600_000).await?, end);

    assert!(q.has_reader("r").await?);
    assert!(!q.has_reader("nobody").await?);
    assert_eq!(q.seek_reader("nobody", SeekTo::End).await?, None);
    assert!(!q.has_reader("nobody").await?, "a move makes no reader");

    assert_eq!(next(&r).await?.as_deref(), Some("1"));
    let leased = r.take(TakeMode::Lease, Duration::ZERO).await?;
    let lease = leased.and_then(|t| t.lease).ok_or("a lease on 2")?;
    // Back to the start: the lease ends, and everything comes again, in order.
    assert_eq!(
        q.seek_reader("r", SeekTo::Seq(seqs[0])).await?,
        Some(seqs[0])
    );
    assert!(
        !r.confirm(&lease).await?,
        "a lease ends when its reader moves"
    );
    assert_eq!(all(&r).await?, ["1", "2", "3", "4", "5"]);
    // To a time: from the first item appended then.
    assert_eq!(
        q.seek_reader("r", SeekTo::Time(middle_ms)).await?,
        Some(four)
    );
    assert_eq!(all(&r).await?, ["4", "5"]);
    // To the end: nothing, then only what comes next.
    assert_eq!(
        q.seek_reader("r", SeekTo::Seq(seqs[1])).await?,
        Some(seqs[1])
    );
    assert_eq!(q.seek_reader("r", SeekTo::End).await?, Some(end));
    assert_eq!(next(&r).await?, None);
    q.append(b"6", opts).await?;
    assert_eq!(all(&r).await?, ["6"]);
    // Targets outside what is kept are clamped to it.
    let (oldest, end) = q.bounds().await?;
    assert_eq!(q.seek_reader("r", SeekTo::Seq(0)).await?, Some(oldest));
    assert_eq!(all(&r).await?, ["1", "2", "3", "4", "5", "6"]);
    assert_eq!(q.seek_reader("r", SeekTo::Seq(u64::MAX)).await?, Some(end));
    assert_eq!(next(&r).await?, None);
    // A lease ended by a move gives nothing back when released.
    q.append(b"7", opts).await?;
    let leased = r.take(TakeMode::Lease, Duration::from_secs(2)).await?;
    let lease = leased.and_then(|t| t.lease).ok_or("a lease on 7")?;
    assert_eq!(
        q.seek_reader("r", SeekTo::End).await?,
        Some(q.bounds().await?.1)
    );
    assert!(!r.release(&lease)?, "an ended lease is not given back");
    assert_eq!(next(&r).await?, None);
    // The other reader never moved: it has everything.
    let keeper = backend.reader(&q, "").await?;
    assert_eq!(all(&keeper).await?, ["1", "2", "3", "4", "5", "6", "7"]);
    assert_eq!(
        q.append_batch(&[], opts).await.err().map(|e| e.kind()),
        Some(weir_backend::Kind::InvalidArgument)
    );
    Ok(())
}

/// A reader made at the end gets only what follows, and is never moved to the end
/// again: a second caller asking for it at the end (a door starting up, a bus
/// subscriber made again) finds it made and leaves it; many callers at once make
/// one reader that skips nothing appended after the first of them returned.
pub async fn a_reader_made_at_the_end_is_never_moved_again(backend: &Backend) -> TestResult {
    let opts = AppendOptions::default();
    let q = backend.queue("at_end").await?;
    backend.reader(&q, "").await?;
    q.append(b"before", opts).await?;
    let (_, made) = backend.queue_for_readers("at_end", &["late"], true).await?;
    let late = made.into_iter().next().ok_or("the reader")?;
    q.append(b"after", opts).await?;
    // Asked for again at the end: left where it is, "after" still pending.
    backend.queue_for_readers("at_end", &["late"], true).await?;
    assert_eq!(all(&late).await?, ["after"]);
    // Many at once: one reader, and what follows the first answer is all there.
    let ask = || backend.queue_for_readers("at_end", &["many"], true);
    let asked = tokio::join!(ask(), ask(), ask(), ask(), ask(), ask());
    for made in [asked.0, asked.1, asked.2, asked.3, asked.4, asked.5] {
        made?;
    }
    q.append(b"next", opts).await?;
    let (_, again) = backend.queue_for_readers("at_end", &["many"], true).await?;
    let many = again.into_iter().next().ok_or("the reader")?;
    assert_eq!(all(&many).await?, ["next"]);
    Ok(())
}

/// `forget_readers` keeps what it is told to and nothing else: on the engine the rest
/// is deleted, on JetStream it is left in place and named; together, exactly the
/// readers not kept. A queue that does not exist is not made.
pub async fn readers_not_kept_are_forgotten(backend: &Backend) -> TestResult {
    let q = backend.queue("forgetting").await?;
    backend.reader(&q, "").await?;
    backend
        .queue_for_readers("forgetting", &["a", "b", "c"], false)
        .await?;
    let done = backend
        .forget_readers("forgetting", |n| n.is_empty() || n == "a")
        .await?;
    let mut named: Vec<String> = done.deleted.iter().chain(&done.left).cloned().collect();
    named.sort();
    assert_eq!(named, ["b", "c"]);
    assert!(q.has_reader("a").await? && q.has_reader("").await?);
    for gone in &done.deleted {
        assert!(!q.has_reader(gone).await?, "{gone} deleted");
    }
    for kept in &done.left {
        assert!(q.has_reader(kept).await?, "{kept} left in place");
    }
    let none = backend.forget_readers("never_made", |_| false).await?;
    assert!(none.deleted.is_empty() && none.left.is_empty());
    assert!(backend.existing_queue("never_made")?.is_none());
    Ok(())
}

/// A lease released comes back first; one confirmed never comes back; a reader
/// deleted is not made again by a move, and `delete` of it again says there was none.
pub async fn leases_and_deleted_readers(backend: &Backend) -> TestResult {
    let opts = AppendOptions::default();
    let (q, made) = backend.queue_for_readers("leasing", &["w"], false).await?;
    let w = made.into_iter().next().ok_or("the reader")?;
    q.append_batch(&[b"1", b"2", b"3"], opts).await?;
    let one = w.take(TakeMode::Lease, Duration::from_secs(2)).await?;
    let one = one.ok_or("a lease on 1")?;
    assert_eq!(&one.item.data[..], b"1");
    assert!(w.release(one.lease.as_ref().ok_or("a lease")?)?);
    let again = w.take(TakeMode::Lease, Duration::from_secs(2)).await?;
    let again = again.ok_or("1 again")?;
    assert_eq!(
        &again.item.data[..],
        b"1",
        "a released item comes back first"
    );
    assert!(w.confirm(again.lease.as_ref().ok_or("a lease")?).await?);
    assert_eq!(all(&w).await?, ["2", "3"]);
    assert!(backend.delete_reader("leasing", "w").await?);
    assert_eq!(q.seek_reader("w", SeekTo::Seq(1)).await?, None);
    assert!(!q.has_reader("w").await?, "a move makes no reader");
    assert!(!backend.delete_reader("leasing", "w").await?);
    Ok(())
}

/// The backend's map ([`Backend::shared_map`]): writes are compare-and-set, a delete
/// never removes a newer value, revisions only grow (a deleted key written again
/// gets a higher one), lists come in the order of the last writes, and bad keys and
/// map names are refused: the data directory's map and the cluster's alike.
pub async fn a_map_writes_compare_and_set(backend: &Backend) -> TestResult {
    use bytes::Bytes;
    use weir_backend::{Expect, Kind};
    let map = backend.shared_map("contract").await?;
    assert!(map.get("a").await?.is_none());
    let r1 = map.put("a", Bytes::from("one"), Expect::Absent).await?;
    let e = map
        .put("a", Bytes::from("two"), Expect::Absent)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), Kind::Conflict, "{e}");
    let r2 = map
        .put("a", Bytes::from("two"), Expect::Revision(r1))
        .await?;
    assert!(r2 > r1);
    let e = map
        .put("a", Bytes::from("three"), Expect::Revision(r1))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), Kind::Conflict, "a stale revision loses: {e}");
    // A write of the value the key already holds (a retry) is done, at that revision.
    let again = map.put("a", Bytes::from("two"), Expect::Revision(r1));
    assert_eq!(again.await?, r2);
    let got = map.get("a").await?.ok_or("a is gone")?;
    assert_eq!((got.value.as_ref(), got.revision), (&b"two"[..], r2));
    let rb = map.put("b-2_=", Bytes::from("bee"), Expect::Absent).await?;
    let listed: Vec<(String, Vec<u8>, u64)> = map
        .list()
        .await?
        .into_iter()
        .map(|e| (e.key, e.value.to_vec(), e.revision))
        .collect();
    let want = vec![
        ("a".into(), b"two".to_vec(), r2),
        ("b-2_=".into(), b"bee".to_vec(), rb),
    ];
    assert_eq!(listed, want);
    let e = map.delete("a", r1).await.unwrap_err();
    assert_eq!(e.kind(), Kind::Conflict, "a newer value stays: {e}");
    assert!(map.get("a").await?.is_some());
    assert!(map.delete("a", r2).await?);
    assert!(!map.delete("a", r2).await?, "already gone");
    assert!(map.get("a").await?.is_none());
    let e = map
        .put("a", Bytes::from("x"), Expect::Revision(r2))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), Kind::Conflict, "the key is gone: {e}");
    let r3 = map.put("a", Bytes::from("again"), Expect::Absent).await?;
    assert!(r3 > rb, "revisions only grow");
    for bad in ["", "a.b", "a b", "*", ">", &"k".repeat(201)] {
        let e = map
            .put(bad, Bytes::new(), Expect::Absent)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), Kind::InvalidArgument, "{bad:?}: {e}");
    }
    for bad in ["", "Upper", "a.b", &"m".repeat(33)] {
        let e = backend
            .shared_map(bad)
            .await
            .err()
            .ok_or("a bad name was taken")?;
        assert_eq!(e.kind(), Kind::InvalidName, "{bad:?}: {e}");
    }
    Ok(())
}

/// Delivery counts, `max_deliveries` with `dead_letter_to`, and `touch`: each return
/// of a leased item adds one to its count; once it came back `max_deliveries` times
/// the next take moves it to `dead_letter_to` (flags kept) and hands out the next
/// item; `touch` keeps a lease, and a chosen extension is the engine's only.
pub async fn deliveries_and_dead_letters(backend: &Backend) -> TestResult {
    let config_for: weir::ConfigFn = std::sync::Arc::new(|name: &str| weir::QueueConfig {
        max_deliveries: (name == "jobs").then_some(2),
        dead_letter_to: (name == "jobs").then(|| "jobs_dead".to_string()),
        ..weir::QueueConfig::default()
    });
    backend
        .set_options(weir_backend::StoreOptions {
            config_for: Some(config_for),
            ..weir_backend::StoreOptions::default()
        })
        .await?;
    let q = backend.queue("jobs").await?;
    let r = backend.reader(&q, "").await?;
    let flagged = AppendOptions {
        flags: 5,
        ..AppendOptions::default()
    };
    q.append(b"poison", flagged).await?;
    q.append(b"fine", AppendOptions::default()).await?;
    for expected in 1..=2 {
        let t = r.take(TakeMode::Lease, Duration::from_secs(5)).await?;
        let t = t.ok_or("the poison item")?;
        assert_eq!((&t.item.data[..], t.deliveries), (&b"poison"[..], expected));
        let lease = t.lease.ok_or("a lease")?;
        assert!(r.touch(&lease, None).await?, "an open lease is extended");
        let chosen = r.touch(&lease, Some(Duration::from_secs(60))).await;
        match backend.kind_name() {
            "embedded" => assert!(chosen?),
            _ => assert_eq!(
                chosen.err().map(|e| e.kind()),
                Some(weir_backend::Kind::Unsupported)
            ),
        }
        assert!(r.release(&lease)?);
    }
    let t = r.take(TakeMode::Take, Duration::from_secs(5)).await?;
    let t = t.ok_or("the next item")?;
    assert_eq!((&t.item.data[..], t.deliveries), (&b"fine"[..], 1));
    assert_eq!(
        next(&r).await?,
        None,
        "the poison item is not handed out again"
    );
    let dead = backend.queue("jobs_dead").await?;
    let dr = backend.reader(&dead, "").await?;
    let moved = dr.take(TakeMode::Take, Duration::from_secs(5)).await?;
    let moved = moved.ok_or("the dead letter")?;
    assert_eq!(
        (&moved.item.data[..], moved.item.flags),
        (&b"poison"[..], 5)
    );
    assert_eq!(next(&dr).await?, None, "moved once");
    let stats = backend.stats(Some(vec!["jobs".to_string()])).await?;
    assert_eq!(stats.first().map(|s| s.dead_lettered), Some(1));
    Ok(())
}

/// Re-drive (`Backend::redrive`): dead letters go back to their queue, oldest first,
/// with their data and flags, as new items there (delivered afresh); within `max`
/// a call; nothing from a missing queue; never a queue to itself.
pub async fn redrive_moves_dead_letters_back(backend: &Backend) -> TestResult {
    let config_for: weir::ConfigFn = std::sync::Arc::new(|name: &str| weir::QueueConfig {
        max_deliveries: (name == "redrive").then_some(1),
        dead_letter_to: (name == "redrive").then(|| "redrive_dead".to_string()),
        ..weir::QueueConfig::default()
    });
    backend
        .set_options(weir_backend::StoreOptions {
            config_for: Some(config_for),
            ..weir_backend::StoreOptions::default()
        })
        .await?;
    let q = backend.queue("redrive").await?;
    let r = backend.reader(&q, "").await?;
    for (data, flags) in [(&b"first"[..], 1), (b"second", 2), (b"third", 3)] {
        let options = AppendOptions {
            flags,
            ..AppendOptions::default()
        };
        q.append(data, options).await?;
    }
    // Each of the first two is handed out once and given back: the next take moves
    // it to the dead letters.
    for _ in 0..2 {
        let t = r.take(TakeMode::Lease, Duration::from_secs(5)).await?;
        let lease = t.ok_or("an item")?.lease.ok_or("a lease")?;
        assert!(r.release(&lease)?);
    }
    assert_eq!(next(&r).await?.as_deref(), Some("third"));
    assert_eq!(next(&r).await?, None, "the other two are dead letters");
    let refused = backend.redrive("redrive", "", "redrive", 10).await;
    assert_eq!(
        refused.err().map(|e| e.kind()),
        Some(weir_backend::Kind::InvalidArgument)
    );
    assert_eq!(
        backend.redrive("no_such_queue", "", "redrive", 10).await?,
        0
    );
    assert_eq!(backend.redrive("redrive_dead", "", "redrive", 1).await?, 1);
    assert_eq!(backend.redrive("redrive_dead", "", "redrive", 10).await?, 1);
    assert_eq!(backend.redrive("redrive_dead", "", "redrive", 10).await?, 0);
    let mut back = Vec::new();
    while let Some(t) = r.take(TakeMode::Take, Duration::from_millis(500)).await? {
        back.push((
            String::from_utf8_lossy(&t.item.data).into_owned(),
            t.item.flags,
            t.deliveries,
        ));
    }
    assert_eq!(
        back,
        [("first".to_string(), 1, 1), ("second".to_string(), 2, 1)],
        "back in order, with their flags, delivered afresh"
    );
    let dead = backend.queue("redrive_dead").await?;
    let dr = backend.reader(&dead, "").await?;
    assert_eq!(next(&dr).await?, None, "moved, not copied");
    Ok(())
}

/// A reader's open leases (`Reader::pending`): on the engine, lowest seq first, each
/// with the holder its handle was named with, its delivery count and length, within
/// the limit, and gone once confirmed; on JetStream, refused as unsupported, naming
/// the feature.
pub async fn pending_leases(backend: &Backend) -> TestResult {
    let q = backend.queue("pending").await?;
    let r = backend.reader(&q, "").await?;
    let named = r.with_holder(std::sync::Arc::from("memcache 127.0.0.1:5000"));
    if backend.kind_name() != "embedded" {
        let e = named.pending(10).await.err().ok_or("refused")?;
        assert_eq!(e.kind(), weir_backend::Kind::Unsupported);
        assert!(e.to_string().contains("pending"), "{e}");
        return Ok(());
    }
    q.append_batch(&[b"a", b"bb", b"ccc"], AppendOptions::default())
        .await?;
    let wait = Duration::from_secs(2);
    let first = named.take(TakeMode::Lease, wait).await?.ok_or("a")?;
    let second = r.take(TakeMode::Lease, wait).await?.ok_or("bb")?;
    assert!(r.release(first.lease.as_ref().ok_or("a lease")?)?);
    let again = named.take(TakeMode::Lease, wait).await?.ok_or("a again")?;
    assert_eq!((&again.item.data[..], again.deliveries), (&b"a"[..], 2));
    let listed = r.pending(10).await?;
    let summary: Vec<_> = listed
        .iter()
        .map(|p| (p.seq, p.holder.as_deref(), p.deliveries, p.len))
        .collect();
    let (a, bb) = (again.item.seq, second.item.seq);
    assert_eq!(
        summary,
        [(a, Some("memcache 127.0.0.1:5000"), 2, 1), (bb, None, 1, 2)]
    );
    assert_eq!(r.pending(1).await?.len(), 1, "the limit");
    for t in [&again, &second] {
        assert!(r.confirm(t.lease.as_ref().ok_or("a lease")?).await?);
    }
    assert!(r.pending(10).await?.is_empty(), "confirmed: gone");
    Ok(())
}

/// Tubes through the backend: put with priorities, reserve by urgency across tubes,
/// release, bury, kick, and jobs by id; on a backend without them, the refusal names
/// the feature.
pub async fn tubes_of_jobs(backend: &Backend) -> TestResult {
    let ttr = Duration::from_secs(30);
    let tube = match backend.tube("tube_a").await {
        Ok(t) => t,
        Err(e) => {
            assert_eq!(e.kind(), weir_backend::Kind::Unsupported);
            assert!(e.to_string().contains("tubes"), "{e}");
            assert_eq!(
                backend.find_job(1).await.err().map(|e| e.kind()),
                Some(weir_backend::Kind::Unsupported)
            );
            return Ok(());
        }
    };
    let other = backend.tube("tube_b").await?;
    let low = tube.put(b"low", 9000, ttr, Duration::ZERO).await?;
    let urgent = other.put(b"urgent", 1, ttr, Duration::ZERO).await?;
    let later = tube
        .put(b"later", 0, ttr, Duration::from_secs(3600))
        .await?;
    let both = [tube.clone(), other.clone()];
    let r = backend.reserve(&both, Duration::from_secs(1)).await?;
    let r = r.ok_or("a job")?;
    assert_eq!(
        (r.job.id, &r.job.data[..], r.deliveries),
        (urgent, &b"urgent"[..], 1)
    );
    assert!(other.release(&r, 1, Duration::ZERO).await?);
    let r = backend
        .reserve(&both, Duration::ZERO)
        .await?
        .ok_or("again")?;
    assert_eq!((r.job.id, r.deliveries), (urgent, 2));
    assert!(other.bury(&r).await?);
    let found = backend.find_job(urgent).await?.ok_or("the buried job")?;
    assert_eq!(
        (found.state, found.tube.as_str()),
        (weir_backend::jobs::JobState::Buried, "tube_b")
    );
    assert_eq!(other.stats().await?.buried, 1);
    assert_eq!(tube.stats().await?.delayed, 1);
    assert_eq!(tube.peek_delayed().await?.map(|j| j.id), Some(later));
    let state = backend.find_job(later).await?.map(|f| f.state);
    assert_eq!(state, Some(weir_backend::jobs::JobState::Delayed));
    assert_eq!(other.kick(5).await?, 1);
    assert!(backend.delete_job(urgent).await?, "ready, deleted by id");
    let r = backend.reserve(&both, Duration::ZERO).await?.ok_or("low")?;
    assert_eq!(r.job.id, low);
    assert!(tube.touch(&r)?);
    assert!(tube.time_left(&r).is_some_and(|t| t <= ttr));
    assert!(tube.delete(&r).await?);
    let none = backend.reserve(&both, Duration::from_millis(50)).await?;
    assert!(none.is_none(), "later is delayed");
    assert!(backend.find_job(low).await?.is_none());
    assert!(backend.kick_job(later).await?);
    let r = backend
        .reserve(&both, Duration::ZERO)
        .await?
        .ok_or("kicked")?;
    assert_eq!(r.job.id, later);
    assert!(tube.delete(&r).await?);
    Ok(())
}
