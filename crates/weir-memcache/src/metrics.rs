//! Counters of the memcache door, and their `/metrics` series (encoded by
//! `weir_backend::exposition`, the page's one encoder).
//!
//! Per-request counters live in one [`LoopMetrics`] per event loop, each on its own
//! cache lines, and are summed when read (`stats`, `/metrics`): counters shared by the
//! loops would bounce their cache lines between cores on every request, which measured
//! as several percent of the server's CPU at 1000 connections. A connection lives on
//! one loop and a loop is one thread, so each [`LoopMetrics`] has a single writer, and
//! its counters are bumped with a plain load and store (no locked instruction).
//! Connection counts change once per connection and stay plain shared atomics.
//!
//! Queue and reader numbers are not counted here at all; the root reads them from the
//! backend when `/metrics` is scraped, so they can never drift from what `stats`
//! shows.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use prometheus_client::encoding::NoLabelSet;
use weir_backend::exposition::{self, DescriptorEncoder};

use crate::parse::CommandKind;

/// Upper bounds of the latency histogram's buckets, in microseconds.
pub const LATENCY_BUCKETS_US: [u64; 14] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 50_000, 250_000, 1_000_000, 10_000_000,
];

/// A counter with one writing thread and any number of readers.
#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`. Only the owning loop's thread calls this (see the module docs): a
    /// load and a store, which another writer could interleave with and lose, but no
    /// reader ever sees a torn value.
    pub fn add(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// The counters one event loop writes; aligned so two loops never share a line.
#[derive(Default)]
#[repr(align(128))]
pub struct LoopMetrics {
    pub bytes_read: Counter,
    pub bytes_written: Counter,
    pub get_hits: Counter,
    pub get_misses: Counter,
    pub peeks: Counter,
    commands: [Counter; CommandKind::ALL.len()],
    /// Cumulative counts are computed at render time; each slot counts only its own
    /// bucket (the last one is +Inf).
    latency_buckets: [Counter; LATENCY_BUCKETS_US.len() + 1],
    latency_sum_us: Counter,
}

impl LoopMetrics {
    /// Counts one request of `kind` that took `elapsed`.
    pub fn record(&self, kind: CommandKind, elapsed: Duration) {
        self.commands[kind.index()].add(1);
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let slot = LATENCY_BUCKETS_US
            .iter()
            .position(|&bound| us <= bound)
            .unwrap_or(LATENCY_BUCKETS_US.len());
        self.latency_buckets[slot].add(1);
        self.latency_sum_us.add(us);
    }
}

pub struct Metrics {
    pub connections_current: AtomicU64,
    pub connections_total: AtomicU64,
    pub connections_refused: AtomicU64,
    loops: Box<[LoopMetrics]>,
    /// What `stats reset` subtracts from the counters `stats` shows.
    stats_baseline: std::sync::Mutex<StatsBaseline>,
}

/// The counters `stats` shows (and `stats reset` resets), at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsBaseline {
    pub total_connections: u64,
    pub cmd_get: u64,
    pub cmd_set: u64,
    pub cmd_peek: u64,
    pub get_hits: u64,
    pub get_misses: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

impl StatsBaseline {
    fn zip(&self, other: &StatsBaseline, f: impl Fn(u64, u64) -> u64) -> StatsBaseline {
        StatsBaseline {
            total_connections: f(self.total_connections, other.total_connections),
            cmd_get: f(self.cmd_get, other.cmd_get),
            cmd_set: f(self.cmd_set, other.cmd_set),
            cmd_peek: f(self.cmd_peek, other.cmd_peek),
            get_hits: f(self.get_hits, other.get_hits),
            get_misses: f(self.get_misses, other.get_misses),
            bytes_read: f(self.bytes_read, other.bytes_read),
            bytes_written: f(self.bytes_written, other.bytes_written),
        }
    }

    /// These counters less `base`.
    pub fn since(&self, base: &StatsBaseline) -> StatsBaseline {
        self.zip(base, u64::saturating_sub)
    }

    /// These counters plus `base`.
    pub fn plus(&self, base: &StatsBaseline) -> StatsBaseline {
        self.zip(base, u64::saturating_add)
    }
}

impl Metrics {
    /// Counters for `loops` event loops (at least one).
    pub fn new(loops: usize) -> Metrics {
        Metrics {
            connections_current: AtomicU64::new(0),
            connections_total: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            loops: (0..loops.max(1)).map(|_| LoopMetrics::default()).collect(),
            stats_baseline: std::sync::Mutex::new(StatsBaseline::default()),
        }
    }

    /// The counters of event loop `index`; only that loop's thread may write them.
    pub fn for_loop(&self, index: usize) -> &LoopMetrics {
        assert!(
            index < self.loops.len(),
            "event loop {index} has no counters"
        );
        &self.loops[index]
    }

    fn sum(&self, counter: impl Fn(&LoopMetrics) -> &Counter) -> u64 {
        self.loops
            .iter()
            .fold(0u64, |total, l| total.wrapping_add(counter(l).get()))
    }

    pub fn command_count(&self, kind: CommandKind) -> u64 {
        self.sum(|l| &l.commands[kind.index()])
    }

    pub fn bytes_read(&self) -> u64 {
        self.sum(|l| &l.bytes_read)
    }

    pub fn bytes_written(&self) -> u64 {
        self.sum(|l| &l.bytes_written)
    }

    pub fn get_hits(&self) -> u64 {
        self.sum(|l| &l.get_hits)
    }

    pub fn get_misses(&self) -> u64 {
        self.sum(|l| &l.get_misses)
    }

    pub fn peeks(&self) -> u64 {
        self.sum(|l| &l.peeks)
    }

    /// What `stats` subtracts (set by `stats reset`).
    pub fn stats_baseline(&self) -> StatsBaseline {
        *self
            .stats_baseline
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn set_stats_baseline(&self, base: StatsBaseline) {
        *self
            .stats_baseline
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = base;
    }

    /// Encodes every counter of the door onto a `/metrics` page (the root adds the
    /// queues' and the other doors' figures). `after_connections` encodes what the
    /// page has always shown right after the connection counters (the HTTP port's
    /// evictions), so the page keeps its order.
    pub fn encode(
        &self,
        enc: &mut DescriptorEncoder<'_>,
        after_connections: impl FnOnce(&mut DescriptorEncoder<'_>) -> fmt::Result,
    ) -> fmt::Result {
        let connections = self.connections_current.load(Relaxed);
        exposition::gauge(
            enc,
            "weir_connections",
            "Open memcache connections.",
            connections,
        )?;
        let counters = [
            (
                "weir_connections_total",
                "Memcache connections accepted.",
                self.connections_total.load(Relaxed),
            ),
            (
                "weir_connections_refused_total",
                "Connections refused over connections_max.",
                self.connections_refused.load(Relaxed),
            ),
        ];
        for (name, help, value) in counters {
            exposition::counter(enc, name, help, value)?;
        }
        after_connections(enc)?;
        let counters = [
            (
                "weir_bytes_read_total",
                "Bytes read from memcache clients.",
                self.bytes_read(),
            ),
            (
                "weir_bytes_written_total",
                "Bytes written to memcache clients.",
                self.bytes_written(),
            ),
            (
                "weir_get_hits_total",
                "Reads that returned an item.",
                self.get_hits(),
            ),
            (
                "weir_get_misses_total",
                "Reads that returned no item.",
                self.get_misses(),
            ),
        ];
        for (name, help, value) in counters {
            exposition::counter(enc, name, help, value)?;
        }
        let commands = CommandKind::ALL
            .into_iter()
            .map(|kind| ([("command", kind.name())], self.command_count(kind)));
        exposition::counters(enc, "weir_commands_total", "Requests by command.", commands)?;
        self.encode_latency(enc)
    }

    /// The request-duration histogram, in seconds: the loops' own buckets, summed.
    fn encode_latency(&self, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let bounds = LATENCY_BUCKETS_US.map(|us| us as f64 / 1e6);
        let counts = (0..LATENCY_BUCKETS_US.len()).map(|i| self.sum(|l| &l.latency_buckets[i]));
        let buckets = exposition::buckets(&bounds, counts);
        let count = (0..=LATENCY_BUCKETS_US.len())
            .map(|i| self.sum(|l| &l.latency_buckets[i]))
            .fold(0u64, u64::wrapping_add);
        let sum = self.sum(|l| &l.latency_sum_us) as f64 / 1e6;
        exposition::histograms(
            enc,
            "weir_request_duration_seconds",
            "Time to execute one request.",
            |h| h.encode_histogram::<NoLabelSet>(sum, count, &buckets, None),
        )
    }
}
