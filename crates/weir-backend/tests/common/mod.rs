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
