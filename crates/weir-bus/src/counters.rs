//! What a subscriber's delivery worker counts as it goes (events sent, failed
//! attempts, events dead-lettered, delivery latency), read by `/metrics`
//! (`metrics.rs`).
//!
//! A leaf: the worker that counts, the bus that keeps each worker's counters and the
//! page that shows them all name it, and it names none of them.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::histogram::Histogram;

/// Upper bounds of the latency buckets, in milliseconds.
const LATENCY_BUCKETS_MS: [u64; 14] = [
    1, 2, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 10_000, 60_000, 600_000,
];

#[derive(Debug)]
pub struct SubscriberCounters {
    pub sent: AtomicU64,
    pub failed_attempts: AtomicU64,
    pub dead_lettered: AtomicU64,
    pub(crate) latency: Histogram,
}

impl Default for SubscriberCounters {
    fn default() -> SubscriberCounters {
        SubscriberCounters {
            sent: AtomicU64::new(0),
            failed_attempts: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            latency: Histogram::new(LATENCY_BUCKETS_MS.map(|ms| ms as f64)),
        }
    }
}

impl SubscriberCounters {
    pub fn observe_latency_ms(&self, ms: u64) {
        self.latency.observe(ms as f64);
    }
}
