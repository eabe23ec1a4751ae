//! Per-subscriber lag and delivery figures on `/metrics` (Prometheus text format):
//! queued events and the oldest one's age (read from the backend's reader stats,
//! which the page gathers once per scrape for every queue), and counters the workers
//! keep: events sent, failed attempts, events dead-lettered, and a histogram of
//! delivery latency (confirmation time minus publish time, per event).
//!
//! Subscribers are labelled by their token's owner name and their random id
//! (`subscriber_id`), never by the token, which is a credential.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use weir_backend::QueueStats;

use crate::bus::Bus;
use crate::names::{dead_queue, topic_queue};

/// Upper bounds of the latency buckets, in milliseconds.
const LATENCY_BUCKETS_MS: [u64; 14] = [
    1, 2, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 10_000, 60_000, 600_000,
];

#[derive(Default)]
pub struct SubscriberCounters {
    pub sent: AtomicU64,
    pub failed_attempts: AtomicU64,
    pub dead_lettered: AtomicU64,
    latency_buckets: [AtomicU64; LATENCY_BUCKETS_MS.len()],
    latency_count: AtomicU64,
    latency_sum_ms: AtomicU64,
}

impl SubscriberCounters {
    pub fn observe_latency_ms(&self, ms: u64) {
        if let Some(i) = LATENCY_BUCKETS_MS.iter().position(|&b| ms <= b) {
            self.latency_buckets[i].fetch_add(1, Relaxed);
        }
        self.latency_count.fetch_add(1, Relaxed);
        self.latency_sum_ms.fetch_add(ms, Relaxed);
    }
}

/// Queues' figures by queue name.
pub type StatsIndex<'a> = HashMap<&'a str, &'a QueueStats>;

/// `stats` by queue name, for [`lag`].
pub fn index(stats: &[QueueStats]) -> StatsIndex<'_> {
    stats.iter().map(|q| (q.name.as_str(), q)).collect()
}

/// Queued events and the oldest one's age in ms for a subscriber (by its id), over
/// its topics, from the topic queues' figures in `stats` (a topic without figures
/// counts nothing).
pub fn lag(stats: &StatsIndex<'_>, id: &str, topics: &[String]) -> (u64, Option<u64>) {
    let mut queued = 0;
    let mut oldest: Option<u64> = None;
    for topic in topics {
        let Some(q) = stats.get(topic_queue(topic).as_str()) else {
            continue;
        };
        if let Some(r) = q.readers.iter().find(|r| r.name == id) {
            queued += r.items;
            if r.items > 0 {
                oldest = Some(oldest.unwrap_or(0).max(r.age_ms));
            }
        }
    }
    (queued, oldest)
}

/// Appends the bus's figures to a `/metrics` body; `stats` are the queues' figures
/// the page gathered (the topic and dead-letter queues among them). A subscriber's
/// backlog and dead letters are left out when its queues are not in `stats` (the
/// gathering did not finish in time), rather than shown as 0.
pub fn render(bus: &Bus, stats: &[QueueStats], out: &mut String) {
    let rows = rows(bus, &index(stats));
    let gauge = |out: &mut String, metric: &str, help: &str, kind: &str| {
        let _ = writeln!(out, "# HELP {metric} {help}\n# TYPE {metric} {kind}");
    };
    gauge(out, "weir_bus_topics", "Topics of the event bus.", "gauge");
    let _ = writeln!(out, "weir_bus_topics {}", bus.meta().topics.len());
    let evicted = "weir_bus_api_connections_evicted_total";
    let help = "Idle API connections closed at connections_max for a new one.";
    gauge(out, evicted, help, "counter");
    let n = bus.api_connections_evicted.load(Relaxed);
    let _ = writeln!(out, "{evicted} {n}");
    let series: [Series; 6] = [
        (
            "weir_bus_subscriber_queued",
            "Events waiting for the subscriber, over its topics.",
            "gauge",
            |r| r.1,
        ),
        (
            "weir_bus_subscriber_oldest_age_ms",
            "Age of the oldest event waiting for the subscriber.",
            "gauge",
            |r| r.2,
        ),
        (
            "weir_bus_subscriber_dead_letters",
            "Events in the subscriber's dead-letter queue.",
            "gauge",
            |r| r.3,
        ),
        (
            "weir_bus_subscriber_sent_total",
            "Events delivered and confirmed by a 2xx.",
            "counter",
            |r| Some(r.4.sent.load(Relaxed)),
        ),
        (
            "weir_bus_subscriber_failed_attempts_total",
            "Delivery attempts that failed.",
            "counter",
            |r| Some(r.4.failed_attempts.load(Relaxed)),
        ),
        (
            "weir_bus_subscriber_dead_lettered_total",
            "Events moved to the dead-letter queue.",
            "counter",
            |r| Some(r.4.dead_lettered.load(Relaxed)),
        ),
    ];
    for (metric, help, kind, value) in series {
        gauge(out, metric, help, kind);
        // A figure not known this scrape (the queues' figures did not come in
        // time) is left out, never shown as 0: a backlog must not read as none.
        for (row, v) in rows.iter().filter_map(|r| value(r).map(|v| (r, v))) {
            let _ = writeln!(out, "{metric}{{{}}} {v}", row.0);
        }
    }
    let metric = "weir_bus_delivery_latency_ms";
    gauge(
        out,
        metric,
        "Publish to confirmed delivery, per event, in milliseconds.",
        "histogram",
    );
    for (labels, .., c) in &rows {
        render_histogram(out, metric, labels, c);
    }
}

/// One row per subscriber: labels, queued, oldest age, dead letters, counters.
fn rows(bus: &Bus, stats: &StatsIndex<'_>) -> Vec<Row> {
    let meta = bus.meta();
    let mut rows = Vec::new();
    for (token, name, counters) in bus.counters() {
        let Some(s) = meta.subscribers.get(&token) else {
            continue;
        };
        // Every topic has a queue, and every subscriber a dead-letter queue: one
        // missing from the figures means the page has none for it.
        let known = s
            .topics
            .iter()
            .all(|t| stats.contains_key(topic_queue(t).as_str()));
        let (queued, oldest) = lag(stats, &s.id, &s.topics);
        let (queued, oldest) = match known {
            true => (Some(queued), Some(oldest.unwrap_or(0))),
            false => (None, None),
        };
        let dead = stats.get(dead_queue(&s.id).as_str()).map(|q| q.items);
        let labels = format!(
            "subscriber=\"{}\",subscriber_id=\"{}\"",
            escape(&name),
            s.id
        );
        rows.push((labels, queued, oldest, dead, counters));
    }
    rows
}

fn render_histogram(out: &mut String, metric: &str, labels: &str, c: &SubscriberCounters) {
    let mut cumulative = 0;
    for (i, bound) in LATENCY_BUCKETS_MS.iter().enumerate() {
        cumulative += c.latency_buckets[i].load(Relaxed);
        let _ = writeln!(
            out,
            "{metric}_bucket{{{labels},le=\"{bound}\"}} {cumulative}"
        );
    }
    let count = c.latency_count.load(Relaxed);
    let _ = writeln!(out, "{metric}_bucket{{{labels},le=\"+Inf\"}} {count}");
    let _ = writeln!(
        out,
        "{metric}_sum{{{labels}}} {}",
        c.latency_sum_ms.load(Relaxed)
    );
    let _ = writeln!(out, "{metric}_count{{{labels}}} {count}");
}

/// Labels, queued, oldest age, dead letters (`None`: no figures for the queues this
/// scrape), counters.
type Row = (
    String,
    Option<u64>,
    Option<u64>,
    Option<u64>,
    std::sync::Arc<SubscriberCounters>,
);
/// A metric's name, help, type, and how to read it from a row.
type Series = (
    &'static str,
    &'static str,
    &'static str,
    fn(&Row) -> Option<u64>,
);

/// A label value with `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_fall_in_cumulative_buckets() {
        let c = SubscriberCounters::default();
        for ms in [0, 3, 3, 700_000] {
            c.observe_latency_ms(ms);
        }
        assert_eq!(c.latency_buckets[0].load(Relaxed), 1);
        assert_eq!(c.latency_buckets[2].load(Relaxed), 2);
        assert_eq!(c.latency_count.load(Relaxed), 4);
        assert_eq!(escape("a\"b"), "a\\\"b");
    }
}
