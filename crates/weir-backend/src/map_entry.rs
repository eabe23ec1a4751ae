//! What every backend's map holds and accepts: its entries, the expectation a write
//! states, and the bounds of names, keys and values.
//!
//! A leaf of the crate: the map the callers see (`shared_map.rs`) and the maps behind
//! it (`local_map.rs`, `jetstream/map.rs`) all name these, so that the rules are one
//! and no map file has to reach another for them.

use bytes::Bytes;

/// A key: 1 to [`KEY_BYTES_MAX`] of `[A-Za-z0-9_=-]` (a subject token).
pub const KEY_BYTES_MAX: usize = 200;

/// The largest value a key takes: 1 MiB (the cluster's map has the same bound by
/// default, NATS's `max_payload`).
pub const VALUE_BYTES_MAX: usize = 1024 * 1024;

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

/// 1 to [`KEY_BYTES_MAX`] of `[A-Za-z0-9_=-]`.
pub(crate) fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= KEY_BYTES_MAX
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'=' | b'-'))
}

/// 1 to 32 of `[a-z0-9_]`: a map's name, on either backend.
pub(crate) fn valid_map_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}
