//! Moving readers on the engine: the contract in `common` (also run on JetStream by
//! `tests/jetstream.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

mod common;

use weir_backend::{Backend, Embedded};

#[tokio::test]
async fn readers_move_back_and_forward_on_the_engine() -> common::TestResult {
    let dir = tempfile::tempdir()?;
    let store = weir::Store::open(dir.path())?;
    let backend = Backend::Embedded(Embedded::new(store));
    common::readers_move_back_and_forward(&backend).await?;
    backend.close().await?;
    Ok(())
}
