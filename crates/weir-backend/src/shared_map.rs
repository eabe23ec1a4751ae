//! The small replicated map of [`crate::Backend::shared_map`]: what a caller writes and
//! reads, whichever build it is.
//!
//! The map itself lives in a JetStream cluster (`jetstream/map.rs`). A build without
//! the cargo feature `jetstream` has no cluster, so [`SharedMap`] is there a type
//! with no value: `shared_map` answers `None` and a door's code for the map compiles
//! unchanged, without one `cfg`, and is never reached.

use bytes::Bytes;

/// A key: 1 to [`KEY_BYTES_MAX`] of `[A-Za-z0-9_=-]` (a subject token).
pub const KEY_BYTES_MAX: usize = 200;

/// What a write expects of the key first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// That it has no value.
    Absent,
    /// That its value is at this revision.
    Revision(u64),
}

/// A key's value and revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub value: Bytes,
    pub revision: u64,
}

#[cfg(feature = "jetstream")]
pub use crate::jetstream::map::SharedMap;

/// A map of the cluster, in a build without JetStream: no value of it exists
/// ([`crate::Backend::shared_map`] answers `None`), so none of its methods runs.
#[cfg(not(feature = "jetstream"))]
#[derive(Clone)]
pub enum SharedMap {}

#[cfg(not(feature = "jetstream"))]
impl SharedMap {
    /// The key's value (see the JetStream build's `SharedMap::get`).
    pub async fn get(&self, _key: &str) -> crate::Result<Option<Entry>> {
        match *self {}
    }

    /// Every key and value (see the JetStream build's `SharedMap::list`).
    pub async fn list(&self) -> crate::Result<Vec<Entry>> {
        match *self {}
    }

    /// A compare-and-set write (see the JetStream build's `SharedMap::put`).
    pub async fn put(&self, _key: &str, _value: Bytes, _expect: Expect) -> crate::Result<u64> {
        match *self {}
    }

    /// A compare-and-set delete (see the JetStream build's `SharedMap::delete`).
    pub async fn delete(&self, _key: &str, _revision: u64) -> crate::Result<bool> {
        match *self {}
    }
}
