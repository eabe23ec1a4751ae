//! Counters and gauges of a queue and its readers, as `stats` and `/metrics` show them.

/// One reader's numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReaderStats {
    /// The reader's name ("" for the default reader).
    pub name: String,
    /// Items not yet confirmed by this reader (leased ones included).
    pub items: u64,
    /// Payload bytes of those items.
    pub bytes: u64,
    /// Items handed out (taken or leased) since the store opened.
    pub taken: u64,
    /// Items confirmed (plain takes included) since the store opened.
    pub confirmed: u64,
    /// Items this reader skipped or moved because they expired, since the store opened.
    pub expired: u64,
    /// Items dropped for this reader by `discard_old_when_full`, since the store opened.
    pub discarded: u64,
    /// Items this reader moved to `dead_letter_to` (or dropped, with none) after
    /// `max_deliveries`, since the store opened.
    pub dead_lettered: u64,
    /// Leases open now.
    pub open_leases: u64,
    /// Callers waiting for an item now.
    pub waiters: u64,
    /// Age in milliseconds of the oldest item not yet confirmed; 0 when none.
    pub age_ms: u64,
}

/// A queue's numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub name: String,
    /// Items kept for the most-behind reader (all kept items when there is no reader).
    pub items: u64,
    /// Payload bytes of those items.
    pub bytes: u64,
    /// Items appended since the store opened.
    pub total_items: u64,
    /// Items expired, summed over readers, since the store opened.
    pub expired: u64,
    /// Items discarded to make room, since the store opened.
    pub discarded: u64,
    /// Items dead-lettered after `max_deliveries`, summed over readers, since the
    /// store opened.
    pub dead_lettered: u64,
    /// Leases open now, summed over readers.
    pub open_leases: u64,
    /// Callers waiting now, summed over readers.
    pub waiters: u64,
    /// Age in milliseconds of the oldest kept item; 0 when none.
    pub age_ms: u64,
    /// Bytes of the queue's files on disk.
    pub disk_bytes: u64,
    /// Records skipped because they failed their checksum, since the store opened.
    pub corrupt_records: u64,
    pub readers: Vec<ReaderStats>,
}
