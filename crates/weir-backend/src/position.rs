//! Points in a queue that a call starts from or moves a reader to: where a
//! [`Backend::scan`](crate::Backend::scan) begins ([`ScanFrom`]) and where
//! [`Queue::seek_reader`](crate::Queue::seek_reader) moves a reader ([`SeekTo`]).
//!
//! A leaf of its own so that both backends (`embedded.rs`, `jetstream/`) name them
//! without reaching the crate root, which composes those backends.

/// Where a [`Backend::scan`](crate::Backend::scan) starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanFrom {
    /// The oldest item kept.
    Oldest,
    /// The first item appended at this time (Unix ms) or later.
    Time(u64),
}

/// Where [`Queue::seek_reader`](crate::Queue::seek_reader) moves a reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeekTo {
    /// This sequence number: the next item the reader takes is the first kept at or
    /// after it.
    Seq(u64),
    /// The first item appended at this time (Unix ms) or later.
    Time(u64),
    /// After the newest item: the reader skips everything kept.
    End,
}
