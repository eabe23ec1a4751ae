//! The root's own series on `/metrics`: the HTTP port's evictions and the figures of
//! every queue and reader (the backend's `stats`, read when `/metrics` is scraped, so
//! they can never drift from what `stats` shows). The doors encode their own
//! counters (`weir_memcache::metrics`, the bus's, the proxy's); `http.rs` puts the
//! page together, all of it through one encoder (`weir_backend::exposition`).

use std::fmt;

use weir_backend::exposition::{self, DescriptorEncoder};

/// `weir_http_connections_evicted_total`: idle HTTP-port connections closed at
/// `http_connections_max` for a new one.
pub fn encode_http_evicted(evicted: u64, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
    exposition::counter(
        enc,
        "weir_http_connections_evicted_total",
        "Idle HTTP-port connections closed at http_connections_max for a new one.",
        evicted,
    )
}

/// The figures of every queue and reader.
pub fn encode_queues(
    stats: &[weir_backend::QueueStats],
    enc: &mut DescriptorEncoder<'_>,
) -> fmt::Result {
    for (name, kind, help, get) in QUEUE_FIELDS {
        let samples = stats.iter().map(|s| ([("queue", s.name.as_str())], get(s)));
        match kind {
            "counter" => exposition::counters(enc, name, help, samples)?,
            _ => exposition::gauges(enc, name, help, samples)?,
        }
    }
    for (name, kind, help, get) in READER_FIELDS {
        let samples = stats.iter().flat_map(|s| {
            s.readers.iter().map(|r| {
                (
                    [("queue", s.name.as_str()), ("reader", r.name.as_str())],
                    get(r),
                )
            })
        });
        match kind {
            "counter" => exposition::counters(enc, name, help, samples)?,
            _ => exposition::gauges(enc, name, help, samples)?,
        }
    }
    Ok(())
}

/// A per-queue metric: name, type, help, and how to read it from the stats.
type QueueField = (
    &'static str,
    &'static str,
    &'static str,
    fn(&weir_backend::QueueStats) -> u64,
);
const QUEUE_FIELDS: [QueueField; 10] = [
    (
        "weir_queue_items",
        "gauge",
        "Items kept for the most-behind reader.",
        |s| s.items,
    ),
    (
        "weir_queue_bytes",
        "gauge",
        "Payload bytes of those items.",
        |s| s.bytes,
    ),
    (
        "weir_queue_appended_total",
        "counter",
        "Items appended since start.",
        |s| s.total_items,
    ),
    (
        "weir_queue_expired_total",
        "counter",
        "Items expired since start.",
        |s| s.expired,
    ),
    (
        "weir_queue_discarded_total",
        "counter",
        "Items discarded to make room since start.",
        |s| s.discarded,
    ),
    (
        "weir_queue_dead_lettered_total",
        "counter",
        "Items moved to dead_letter_to (or dropped) after deliveries_max since start.",
        |s| s.dead_lettered,
    ),
    ("weir_queue_open_leases", "gauge", "Leases open now.", |s| {
        s.open_leases
    }),
    (
        "weir_queue_waiters",
        "gauge",
        "Readers waiting for an item now.",
        |s| s.waiters,
    ),
    (
        "weir_queue_oldest_age_ms",
        "gauge",
        "Age of the oldest kept item in ms.",
        |s| s.age_ms,
    ),
    (
        "weir_queue_disk_bytes",
        "gauge",
        "Bytes of the queue's files on disk.",
        |s| s.disk_bytes,
    ),
];

/// A per-reader metric, as [`QueueField`].
type ReaderField = (
    &'static str,
    &'static str,
    &'static str,
    fn(&weir_backend::ReaderStats) -> u64,
);
const READER_FIELDS: [ReaderField; 10] = [
    (
        "weir_reader_items",
        "gauge",
        "Items not yet confirmed by the reader.",
        |r| r.items,
    ),
    (
        "weir_reader_bytes",
        "gauge",
        "Payload bytes of those items.",
        |r| r.bytes,
    ),
    (
        "weir_reader_taken_total",
        "counter",
        "Items handed out since start.",
        |r| r.taken,
    ),
    (
        "weir_reader_confirmed_total",
        "counter",
        "Items confirmed since start.",
        |r| r.confirmed,
    ),
    (
        "weir_reader_expired_total",
        "counter",
        "Items expired for the reader since start.",
        |r| r.expired,
    ),
    (
        "weir_reader_discarded_total",
        "counter",
        "Items discarded for the reader since start.",
        |r| r.discarded,
    ),
    (
        "weir_reader_dead_lettered_total",
        "counter",
        "Items the reader dead-lettered after deliveries_max since start.",
        |r| r.dead_lettered,
    ),
    (
        "weir_reader_open_leases",
        "gauge",
        "Leases open now.",
        |r| r.open_leases,
    ),
    (
        "weir_reader_waiters",
        "gauge",
        "Callers waiting now.",
        |r| r.waiters,
    ),
    (
        "weir_reader_oldest_age_ms",
        "gauge",
        "Age of the oldest unconfirmed item in ms.",
        |r| r.age_ms,
    ),
];
