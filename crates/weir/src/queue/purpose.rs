//! What a take is for: one walk of a reader's position serves taking, leasing and
//! peeking items and dropping them (to make room, or because they expired); the
//! purpose says which. Its own file so that `take.rs` and `expire.rs`, which both
//! walk, do not import each other.

/// What a take is for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Purpose {
    Take,
    Lease,
    Peek,
    /// Drop the oldest item to make room.
    Discard,
    /// Drop the next item only if it has expired.
    ExpireHead,
}
