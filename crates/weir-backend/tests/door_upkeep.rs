//! What a door that names every reader of its queues asks of the engine besides
//! items (`door_upkeep.rs`): queue options, forgetting readers, a scratch directory,
//! and whether the store may be out of reach. (On JetStream, `forget_readers` only
//! lists, and the lease option already holds: see the method docs.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

use std::time::Duration;

use weir_backend::{
    AppendOptions, Backend, Embedded, LeaseTimeout, QueueOptions, StoreOptions, TakeMode,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// An engine whose queues' leases time out after `open_timeout`.
fn engine_with_open_timeout(
    dir: &std::path::Path,
    open_timeout: Duration,
) -> weir::Result<Backend> {
    let mut options = StoreOptions::default();
    options.defaults.open_timeout = Some(open_timeout);
    let store = weir::Store::open_with(dir, options)?;
    Ok(Backend::Embedded(Embedded::new(store)))
}

fn open_timeout(backend: &Backend, queue: &str) -> Option<Duration> {
    let store = backend.engine_store_for_tests()?;
    let q = store.existing_queue(queue).ok()??;
    q.config().open_timeout
}

#[tokio::test]
async fn a_queue_opened_with_no_lease_timeout_keeps_its_leases() -> TestResult {
    let dir = tempfile::tempdir()?;
    let backend = engine_with_open_timeout(dir.path(), Duration::from_millis(100))?;
    // As configured: the store's timeout.
    let (plain, plain_readers) = backend
        .queue_for_readers_with("plain", &["r"], false, QueueOptions::default())
        .await?;
    assert_eq!(
        open_timeout(&backend, "plain"),
        Some(Duration::from_millis(100))
    );
    let (q, readers) = backend
        .queue_for_readers_with("held", &["r"], false, QueueOptions::NO_LEASE_TIMEOUT)
        .await?;
    assert_eq!(
        QueueOptions::NO_LEASE_TIMEOUT.lease_timeout,
        LeaseTimeout::Never
    );
    assert_eq!(open_timeout(&backend, "held"), None);
    q.append(b"1", AppendOptions::default()).await?;
    plain.append(b"1", AppendOptions::default()).await?;
    let plain_leased = plain_readers[0]
        .take(TakeMode::Lease, Duration::ZERO)
        .await?;
    assert!(plain_leased.is_some());
    let leased = readers[0].take(TakeMode::Lease, Duration::ZERO).await?;
    let lease = leased.and_then(|t| t.lease).ok_or("no lease")?;
    // Well past the store's timeout the lease still holds the item, and confirms.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = readers[0].take(TakeMode::Lease, Duration::ZERO).await?;
    assert!(again.is_none(), "the lease timed out");
    let back = plain_readers[0]
        .take(TakeMode::Lease, Duration::from_secs(3))
        .await?;
    assert!(back.is_some(), "a configured timeout ends a lease");
    assert!(readers[0].confirm(&lease).await?);
    // The rules of `queue_for_readers` still hold.
    let none = backend
        .queue_for_readers_with("bad", &[], false, QueueOptions::NO_LEASE_TIMEOUT)
        .await
        .err();
    assert_eq!(
        none.map(|e| e.kind()),
        Some(weir_backend::Kind::InvalidArgument)
    );
    backend.close().await?;
    Ok(())
}

#[tokio::test]
async fn readers_not_kept_are_deleted_on_the_engine() -> TestResult {
    let dir = tempfile::tempdir()?;
    let backend = Backend::Embedded(Embedded::new(weir::Store::open(dir.path())?));
    let (q, _) = backend
        .queue_for_readers("cap", &["a", "b", "record"], false)
        .await?;
    q.append(b"1", AppendOptions::default()).await?;
    let forgotten = backend.forget_readers("cap", |r| r == "a").await?;
    assert_eq!(forgotten.deleted, ["b", "record"]);
    assert!(forgotten.left.is_empty());
    assert!(q.has_reader("a").await?);
    assert!(!q.has_reader("b").await? && !q.has_reader("record").await?);
    // Nothing left to forget; the reader kept still has its item.
    let again = backend.forget_readers("cap", |r| r == "a").await?;
    assert_eq!(again, Default::default());
    let (_, readers) = backend.queue_for_readers("cap", &["a"], false).await?;
    let item = readers[0].take(TakeMode::Take, Duration::ZERO).await?;
    assert_eq!(item.map(|t| t.item.data), Some("1".into()));
    // A queue that does not exist has none, and is not made.
    let nothing = backend.forget_readers("missing", |_| false).await?;
    assert_eq!(nothing, Default::default());
    assert!(backend.existing_queue("missing")?.is_none());
    backend.close().await?;
    Ok(())
}

#[tokio::test]
async fn scratch_files_go_to_the_data_directory_of_a_store_in_reach() -> TestResult {
    let dir = tempfile::tempdir()?;
    let backend = Backend::Embedded(Embedded::new(weir::Store::open(dir.path())?));
    assert_eq!(
        backend.scratch_dir().canonicalize()?,
        dir.path().canonicalize()?
    );
    assert!(!backend.may_be_unreachable());
    backend.close().await?;
    Ok(())
}
