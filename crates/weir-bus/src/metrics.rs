//! Per-subscriber lag and delivery figures on `/metrics` (encoded by
//! `weir_backend::exposition`, the page's one encoder): queued events and the oldest
//! one's age (read from the backend's reader stats, which the page gathers once per
//! scrape for every queue), and counters the workers keep: events sent, failed
//! attempts, events dead-lettered, and a histogram of delivery latency (confirmation
//! time minus publish time, per event; `prometheus-client`'s own histogram).
//!
//! Subscribers are labelled by their token's owner name and their random id
//! (`subscriber_id`), never by the token, which is a credential.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use prometheus_client::encoding::EncodeMetric;
use weir_backend::exposition::{self, Collector, DescriptorEncoder};
use weir_backend::QueueStats;

use crate::bus::Bus;
use crate::counters::SubscriberCounters;
use crate::names::{dead_queue, topic_queue};

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

/// The bus's figures at one scrape; `stats` are the queues' figures the page
/// gathered (the topic and dead-letter queues among them). A subscriber's backlog and
/// dead letters are left out when its queues are not in `stats` (the gathering did
/// not finish in time), rather than shown as 0.
pub fn snapshot(bus: &Bus, stats: &[QueueStats]) -> Snapshot {
    Snapshot {
        topics: bus.meta().topics.len() as u64,
        evicted: bus.api_connections_evicted.load(Relaxed),
        rows: rows(bus, &index(stats)),
    }
}

/// What [`snapshot`] read: the series, ready to encode.
#[derive(Debug)]
pub struct Snapshot {
    topics: u64,
    evicted: u64,
    rows: Vec<Row>,
}

impl Snapshot {
    /// Encodes the bus's series onto a `/metrics` page.
    pub fn encode(&self, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
        exposition::gauge(
            enc,
            "weir_bus_topics",
            "Topics of the event bus.",
            self.topics,
        )?;
        exposition::counter(
            enc,
            "weir_bus_api_connections_evicted_total",
            "Idle API connections closed at connections_max for a new one.",
            self.evicted,
        )?;
        for (metric, help, counter, value) in SERIES {
            // A figure not known this scrape (the queues' figures did not come in
            // time) is left out, never shown as 0: a backlog must not read as none.
            let samples = self
                .rows
                .iter()
                .filter_map(|r| value(r).map(|v| (r.labels(), v)));
            match counter {
                true => exposition::counters(enc, metric, help, samples)?,
                false => exposition::gauges(enc, metric, help, samples)?,
            }
        }
        exposition::histograms(
            enc,
            "weir_bus_delivery_latency_ms",
            "Publish to confirmed delivery, per event, in milliseconds.",
            |h| {
                for r in &self.rows {
                    r.counters.latency.encode(h.encode_family(&r.labels())?)?;
                }
                Ok(())
            },
        )
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        Snapshot::encode(self, &mut enc)
    }
}

/// A metric's name, help, whether it is a counter (else a gauge), and how to read it
/// from a row.
type Series = (&'static str, &'static str, bool, fn(&Row) -> Option<u64>);

const SERIES: [Series; 6] = [
    (
        "weir_bus_subscriber_queued",
        "Events waiting for the subscriber, over its topics.",
        false,
        |r| r.queued,
    ),
    (
        "weir_bus_subscriber_oldest_age_ms",
        "Age of the oldest event waiting for the subscriber.",
        false,
        |r| r.oldest,
    ),
    (
        "weir_bus_subscriber_dead_letters",
        "Events in the subscriber's dead-letter queue.",
        false,
        |r| r.dead,
    ),
    (
        "weir_bus_subscriber_sent_total",
        "Events delivered and confirmed by a 2xx.",
        true,
        |r| Some(r.counters.sent.load(Relaxed)),
    ),
    (
        "weir_bus_subscriber_failed_attempts_total",
        "Delivery attempts that failed.",
        true,
        |r| Some(r.counters.failed_attempts.load(Relaxed)),
    ),
    (
        "weir_bus_subscriber_dead_lettered_total",
        "Events moved to the dead-letter queue.",
        true,
        |r| Some(r.counters.dead_lettered.load(Relaxed)),
    ),
];

/// One subscriber's figures (`None`: no figures for its queues this scrape).
#[derive(Debug)]
struct Row {
    /// The owner name of its token.
    name: String,
    id: String,
    queued: Option<u64>,
    oldest: Option<u64>,
    dead: Option<u64>,
    counters: Arc<SubscriberCounters>,
}

impl Row {
    fn labels(&self) -> [(&str, &str); 2] {
        [("subscriber", &self.name), ("subscriber_id", &self.id)]
    }
}

/// One row per subscriber.
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
        rows.push(Row {
            name,
            id: s.id.clone(),
            queued,
            oldest,
            dead,
            counters,
        });
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_fall_in_cumulative_buckets_and_names_are_escaped() {
        let counters = Arc::new(SubscriberCounters::default());
        for ms in [0, 3, 3, 700_000] {
            counters.observe_latency_ms(ms);
        }
        let row = Row {
            name: "team \"a\" \\ b".into(),
            id: "s1".into(),
            queued: None,
            oldest: None,
            dead: None,
            counters,
        };
        let page = exposition::text(Snapshot {
            topics: 1,
            evicted: 0,
            rows: vec![row],
        });
        let labels = r#"subscriber="team \"a\" \\ b",subscriber_id="s1""#;
        for line in [
            format!("weir_bus_delivery_latency_ms_bucket{{{labels},le=\"1\"}} 1"),
            format!("weir_bus_delivery_latency_ms_bucket{{{labels},le=\"5\"}} 3"),
            format!("weir_bus_delivery_latency_ms_bucket{{{labels},le=\"600000\"}} 3"),
            format!("weir_bus_delivery_latency_ms_bucket{{{labels},le=\"+Inf\"}} 4"),
            format!("weir_bus_delivery_latency_ms_count{{{labels}}} 4"),
            format!("weir_bus_subscriber_sent_total{{{labels}}} 0"),
        ] {
            assert!(page.lines().any(|l| l == line), "{line} not in\n{page}");
        }
        // Unknown figures are left out, not shown as 0.
        assert!(!page.contains("weir_bus_subscriber_queued{"), "{page}");
    }
}
