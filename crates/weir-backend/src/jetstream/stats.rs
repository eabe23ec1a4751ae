//! `stats`, `dump_stats` and the `/metrics` queue series from the cluster's figures.
//!
//! One paged request makes a snapshot of every queue: every consumer's state
//! (`CONSUMER.LIST`). A queue is there while one of its readers' consumers is (`q~`,
//! or a named reader of a queue kept for its readers); its `items` are what its
//! most-behind reader has yet to confirm (pending + leased), as on the engine (the
//! stream keeps confirmed items until a sweep, `sweep.rs`, so its message count is
//! not used). Per reader: `items` = pending + leased, `open_leases` = leased,
//! `waiters` = waiting pulls (all instances), `taken` = the consumer's delivered sequence,
//! `confirmed` = its ack floor (both since the consumer was made). `total_items` and
//! `expired` are this instance's own counters; `bytes`, `disk_bytes`, `age_ms`,
//! `discarded` and `corrupt_records` are 0: JetStream does not give them per subject
//! (or not cheaply).
//!
//! The snapshot is reused for `stats_cache_ms` unless this instance changed something
//! since (an append, a take, a confirm, a release, a delete or flush: asked again
//! then; the answering replica can still trail that write by a Raft round), and one
//! instance makes at most one at a time, so a storm of `stats` or scrapes cannot hammer
//! the meta leader: they wait for the one in flight.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;
use tokio::time::Instant;
use weir_types::{QueueStats, ReaderStats};

use super::inner::Inner;
use super::layout::{split_consumer, ConsumerInfo, StreamInfo};
use crate::error::Result;

#[derive(Deserialize, Default)]
#[serde(default)]
struct ConsumerPage {
    total: usize,
    consumers: Vec<ConsumerInfo>,
}

impl Inner {
    pub(super) async fn stats(&self, names: Option<Vec<String>>) -> Result<Vec<QueueStats>> {
        let all = self.snapshot().await?;
        Ok(match names {
            None => all.as_ref().clone(),
            Some(names) => all
                .iter()
                .filter(|q| names.contains(&q.name))
                .cloned()
                .collect(),
        })
    }

    async fn snapshot(&self) -> Result<Arc<Vec<QueueStats>>> {
        let deadline = self.api.deadline();
        self.ready(deadline).await?;
        let max_age = Duration::from_millis(self.config.stats_cache_ms);
        let mut cached = self.stats_cache.snapshot.lock().await;
        let stale = self.stats_cache.stale.swap(false, Ordering::AcqRel);
        if let Some((at, snapshot)) = cached.as_ref() {
            if !stale && at.elapsed() < max_age {
                return Ok(snapshot.clone());
            }
        }
        let fresh = Arc::new(self.gather(deadline).await?);
        *cached = Some((Instant::now(), fresh.clone()));
        Ok(fresh)
    }

    async fn gather(&self, deadline: Instant) -> Result<Vec<QueueStats>> {
        let consumers = self.consumer_list(deadline).await?;
        let mut queues: BTreeMap<String, QueueStats> = BTreeMap::new();
        // A queue is there while any of its readers is: the default one (`q~`) for
        // the memcache door's queues, named ones only for a queue kept for its
        // readers (`queue_for_readers`).
        for (queue, _) in consumers.iter().filter_map(|c| split_consumer(&c.name)) {
            if queues.contains_key(queue) {
                continue;
            }
            queues.insert(
                queue.to_owned(),
                QueueStats {
                    name: queue.to_owned(),
                    ..QueueStats::default()
                },
            );
        }
        for c in &consumers {
            let Some((queue, reader)) = split_consumer(&c.name) else {
                continue;
            };
            if let Some(q) = queues.get_mut(queue) {
                // What the most-behind reader has yet to confirm, as on the engine.
                q.items = q.items.max(c.num_pending + c.num_ack_pending);
                q.open_leases += c.num_ack_pending;
                q.waiters += c.num_waiting;
                q.readers.push(reader_stats(reader, c));
            }
        }
        let learnable: HashSet<&str> = consumers
            .iter()
            .filter(|c| c.learnable())
            .filter_map(|c| split_consumer(&c.name).map(|(queue, _)| queue))
            .collect();
        for q in queues.values_mut() {
            let learn = learnable.contains(q.name.as_str());
            self.add_instance_counters(q, learn);
        }
        Ok(queues.into_values().collect())
    }

    /// This instance's counters, and the queue in its registry (learnt from the listing)
    /// when `learn`: it has a default reader ([`ConsumerInfo::learnable`]). A queue
    /// kept for its readers is registered when first used.
    fn add_instance_counters(&self, q: &mut QueueStats, learn: bool) {
        q.readers.sort_by(|a, b| a.name.cmp(&b.name));
        let entry = if learn {
            self.registry
                .add(&q.name, &self.layout, || self.queue_config(&q.name))
        } else {
            match self.registry.get(&q.name) {
                Some(entry) => entry,
                None => return,
            }
        };
        q.total_items = entry.appended.load(Ordering::Relaxed);
        for (reader, expired) in entry.expired_counts() {
            if let Some(r) = q.readers.iter_mut().find(|r| *r.name == *reader) {
                r.expired = expired;
                q.expired += expired;
            }
        }
        for (reader, dead) in entry.dead_letter_counts() {
            if let Some(r) = q.readers.iter_mut().find(|r| *r.name == *reader) {
                r.dead_lettered = dead;
                q.dead_lettered += dead;
            }
        }
    }

    /// Messages per subject of the stream.
    pub(super) async fn subject_counts(&self, deadline: Instant) -> Result<HashMap<String, u64>> {
        let api = format!("STREAM.INFO.{}", self.layout.stream);
        let filter = format!("{}.>", self.layout.prefix);
        let mut counts = HashMap::new();
        loop {
            let body = json!({"subjects_filter": filter, "offset": counts.len()});
            let page: StreamInfo = self.api.json(&api, &body, deadline).await?;
            let got = page.state.subjects.len();
            counts.extend(page.state.subjects);
            if got == 0 || counts.len() >= page.total {
                return Ok(counts);
            }
        }
    }

    /// Every consumer's state.
    pub(super) async fn consumer_list(&self, deadline: Instant) -> Result<Vec<ConsumerInfo>> {
        let api = format!("CONSUMER.LIST.{}", self.layout.stream);
        let mut all = Vec::new();
        loop {
            let page: ConsumerPage = self
                .api
                .json(&api, &json!({"offset": all.len()}), deadline)
                .await?;
            let got = page.consumers.len();
            all.extend(page.consumers);
            if got == 0 || all.len() >= page.total {
                return Ok(all);
            }
        }
    }
}

fn reader_stats(name: &str, c: &ConsumerInfo) -> ReaderStats {
    ReaderStats {
        name: name.to_owned(),
        items: c.num_pending + c.num_ack_pending,
        taken: c.delivered.consumer_seq,
        confirmed: c.ack_floor.consumer_seq,
        open_leases: c.num_ack_pending,
        waiters: c.num_waiting,
        ..ReaderStats::default()
    }
}
