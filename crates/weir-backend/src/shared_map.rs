//! The small map of [`crate::Backend::shared_map`], for a front door's own metadata
//! (the event bus's tokens, topics and subscriptions) and for choosing one door among
//! several: what a caller writes and reads, whichever backend holds it.
//!
//! On the embedded engine the map is a file of the data directory (`local_map.rs`),
//! written by this process alone; on JetStream it lives in the cluster
//! (`jetstream/map.rs`), shared by every door. Both answer alike: compare-and-set
//! writes against a key's revision ([`Expect`]), [`crate::Kind::Conflict`] when the
//! key is not as expected, deletes by revision that never remove a newer value, and
//! revisions that only grow within a map.

use bytes::Bytes;

use crate::error::{Error, Kind, Result};
use crate::local_map::LocalMap;

pub use crate::map_entry::{Entry, Expect, KEY_BYTES_MAX, VALUE_BYTES_MAX};

/// A map of the backend; cheap to clone.
#[derive(Clone)]
pub enum SharedMap {
    /// In the embedded engine's data directory: this process's alone.
    Local(LocalMap),
    /// In the JetStream cluster, shared by every door.
    #[cfg(feature = "jetstream")]
    Cluster(Box<crate::jetstream::map::SharedMap>),
}

impl SharedMap {
    /// The key's value.
    pub async fn get(&self, key: &str) -> Result<Option<Entry>> {
        match self {
            SharedMap::Local(m) => m.get(key),
            #[cfg(feature = "jetstream")]
            SharedMap::Cluster(m) => m.get(key).await,
        }
    }

    /// Every key and value, in the order they were last written.
    pub async fn list(&self) -> Result<Vec<Entry>> {
        match self {
            SharedMap::Local(m) => m.list(),
            #[cfg(feature = "jetstream")]
            SharedMap::Cluster(m) => m.list().await,
        }
    }

    /// Writes `value` under `key` if the key is as `expect` says, durably; answers
    /// the new revision, or [`Kind::Conflict`] when the key was not as expected
    /// (unless it holds this very value: a retried write is done at its revision).
    /// A value is at most [`VALUE_BYTES_MAX`] bytes ([`Kind::TooLarge`]).
    pub async fn put(&self, key: &str, value: Bytes, expect: Expect) -> Result<u64> {
        match self {
            SharedMap::Local(m) => {
                let (m, key) = (m.clone(), key.to_owned());
                blocking(move || m.put(&key, value, expect)).await
            }
            #[cfg(feature = "jetstream")]
            SharedMap::Cluster(m) => Box::pin(m.put(key, value, expect)).await,
        }
    }

    /// Removes `key` if its value is at `revision` (a newer value stays: then
    /// [`Kind::Conflict`]), durably; false when it had no value.
    pub async fn delete(&self, key: &str, revision: u64) -> Result<bool> {
        match self {
            SharedMap::Local(m) => {
                let (m, key) = (m.clone(), key.to_owned());
                blocking(move || m.delete(&key, revision)).await
            }
            #[cfg(feature = "jetstream")]
            SharedMap::Cluster(m) => m.delete(key, revision).await,
        }
    }
}

/// File work (a write and its fsync) on the blocking pool.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(e) => Err(Error::new(Kind::Other, format!("a map's write: {e}"))),
    }
}
