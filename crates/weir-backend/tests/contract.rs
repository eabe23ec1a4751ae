//! What every backend must do alike (`common`), on the engine; `tests/jetstream.rs`
//! runs the same scenarios on a JetStream cluster.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

mod common;

use weir_backend::{Backend, Embedded};

async fn on_the_engine(
    scenario: impl AsyncFnOnce(&Backend) -> common::TestResult,
) -> common::TestResult {
    let dir = tempfile::tempdir()?;
    let store = weir::Store::open(dir.path())?;
    let backend = Backend::Embedded(Embedded::new(store));
    scenario(&backend).await?;
    backend.close().await?;
    Ok(())
}

#[tokio::test]
async fn a_map_writes_compare_and_set() -> common::TestResult {
    on_the_engine(common::a_map_writes_compare_and_set).await
}

#[tokio::test]
async fn a_reader_made_at_the_end_is_never_moved_again() -> common::TestResult {
    on_the_engine(common::a_reader_made_at_the_end_is_never_moved_again).await
}

#[tokio::test]
async fn readers_not_kept_are_forgotten() -> common::TestResult {
    on_the_engine(common::readers_not_kept_are_forgotten).await
}

#[tokio::test]
async fn leases_and_deleted_readers() -> common::TestResult {
    on_the_engine(common::leases_and_deleted_readers).await
}

#[tokio::test]
async fn readers_move_back_and_forward() -> common::TestResult {
    on_the_engine(common::readers_move_back_and_forward).await
}

#[tokio::test]
async fn deliveries_and_dead_letters() -> common::TestResult {
    on_the_engine(common::deliveries_and_dead_letters).await
}

#[tokio::test]
async fn redrive_moves_dead_letters_back() -> common::TestResult {
    on_the_engine(common::redrive_moves_dead_letters_back).await
}

#[tokio::test]
async fn pending_leases() -> common::TestResult {
    on_the_engine(common::pending_leases).await
}

#[tokio::test]
async fn tubes_of_jobs() -> common::TestResult {
    on_the_engine(common::tubes_of_jobs).await
}
