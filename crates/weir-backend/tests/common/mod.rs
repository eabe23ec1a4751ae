//! What every backend must do alike, run on each home: the engine (`tests/seek.rs`)
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
