//! Removing from the stream what every reader of a queue has confirmed.
//!
//! The stream keeps every item (limits retention, no limit set) until an instance purges
//! it; confirmations alone remove nothing. Interest retention, which removed an item
//! at its last reader's ack, let each replica decide alone: a replica that was down
//! while a reader (or a queue) was made came back, applied the other readers' acks
//! before it had the new consumer, and dropped the items the new reader still
//! needed; with the reader's leader moved there, the leader moved past them and the
//! other replicas deleted them too (nats-server's own behaviour, reproduced without
//! weir). A purge is one replicated operation, applied the same on every replica.
//!
//! Each instance marks the queues it confirmed, released or deleted on ([`Sweeper::mark`](super::sweeper::Sweeper::mark))
//! and, every `sweep_ms`, sweeps them:
//!
//! 1. `last`: the stream's last sequence (`STREAM.INFO`);
//! 2. `before`: the stream's consumer names;
//! 3. the ack floor of every consumer of a marked queue in `before` (`CONSUMER.INFO`
//!    from its leader; one found deleted meanwhile keeps nothing);
//! 4. `after`: the consumer names again.
//!
//! A queue is then purged (`STREAM.PURGE` filtered on its subject) below the lowest
//! ack floor + 1 of its readers and below `last + 1`; one with no reader in either
//! listing, below `last + 1`. A queue with a reader in `after` that was not in
//! `before`, or one whose floor could not be read, is left marked for the next sweep.
//!
//! Why that loses nothing: every message at or below a reader's ack floor is confirmed
//! by it, and floors only rise, but for a reader moved back (`seek`), which goes no
//! lower than the lowest floor + 1 read just before the move ([`Inner::kept_from`]),
//! so not below a sweep's bound (the floors it read were no higher; the one narrow
//! case, a move back to items the last other reader confirms in that very moment, is
//! in `docs/cluster.md`). A reader made after step 4 was made after every floor was
//! read in step 3 and after `last` (step 1), so whatever is appended after its
//! creation has a sequence above every floor and above `last`, and stays. What it
//! gets of what came before is what the stream still kept when it was made, as on the
//! engine. And every replica purges the same messages, in the same place of the
//! stream's log.
//!
//! Every `FULL_EVERY` sweeps, every queue with items in the stream is swept as well, so
//! what an instance confirmed just before it died goes too. A queue is purged again only
//! when its bound has risen since its last purge here (a purge is a Raft round on the
//! stream). Cost per marked queue and sweep: one `CONSUMER.INFO` per reader and at
//! most one purge; per sweep, one `STREAM.INFO` and two `CONSUMER.NAMES` listings.

use std::collections::{HashMap, HashSet};
use std::sync::Weak;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::admin::Purged;
use super::errors::unavailable;
use super::inner::Inner;
use super::layout::split_consumer;
use super::sweeper::lock;
use crate::error::{Kind, Result};

/// Every this many sweeps, every queue with items is swept, marked or not.
const FULL_EVERY: u64 = 30;

/// Queues one sweep takes on; the others stay marked for the next.
const QUEUES_PER_SWEEP: usize = 1_000;

/// Sweeps every `sweep_ms` while the backend lives (0: never).
pub(super) async fn pump(inner: Weak<Inner>, every: Duration) {
    if every.is_zero() {
        return;
    }
    let mut round: u64 = 0;
    loop {
        tokio::time::sleep(every).await;
        let Some(inner) = inner.upgrade() else { return };
        if !inner.ready.load(std::sync::atomic::Ordering::Acquire) {
            continue;
        }
        round = round.wrapping_add(1);
        let full = round % FULL_EVERY == 1;
        if let Err(e) = inner.sweep(full).await {
            tracing::debug!(error = %e, "jetstream: a sweep of confirmed items failed; the next one tries again");
        }
    }
}

/// What step 3 found of one queue.
#[derive(Default)]
struct Floors {
    /// The lowest ack floor of its readers; `None` while it has none.
    lowest: Option<u64>,
    /// A floor could not be read: leave the queue for the next sweep.
    unread: bool,
}

impl Inner {
    /// One sweep (see the module doc); `full` adds every queue with items.
    pub(super) async fn sweep(&self, full: bool) -> Result<()> {
        let mut queues = self.sweeper.take_marked();
        if queues.is_empty() && !full {
            return Ok(());
        }
        if queues.len() > QUEUES_PER_SWEEP {
            let later: Vec<String> = queues.iter().skip(QUEUES_PER_SWEEP).cloned().collect();
            for q in &later {
                queues.remove(q);
            }
            self.sweeper.mark_all(later);
        }
        let result = self.sweep_queues(&mut queues, full, None).await;
        // What was not swept (all of it, after an error) waits for the next sweep.
        self.sweeper.mark_all(queues);
        result
    }

    /// Sweeps one queue now, within `deadline` (a new reader is about to be made).
    pub(super) async fn sweep_queue(&self, queue: &str, deadline: Instant) -> Result<()> {
        let mut queues = HashSet::from([queue.to_owned()]);
        self.sweep_queues(&mut queues, false, Some(deadline))
            .await?;
        if !queues.is_empty() {
            self.sweeper.mark_all(queues);
        }
        Ok(())
    }

    /// Sweeps `queues`, removing each one that is done from it; every request within
    /// `within`, or each with a retry window of its own.
    async fn sweep_queues(
        &self,
        queues: &mut HashSet<String>,
        full: bool,
        within: Option<Instant>,
    ) -> Result<()> {
        let deadline = within.unwrap_or_else(|| self.api.deadline());
        let end = match self.start_after_newest(deadline).await? {
            super::layout::Start::At(seq) => seq,
            _ => return Ok(()),
        };
        let before = self.consumer_names(deadline).await?;
        if full {
            let room = QUEUES_PER_SWEEP.saturating_sub(queues.len());
            queues.extend(
                self.queues_with_items(deadline)
                    .await?
                    .into_iter()
                    .take(room),
            );
        }
        let floors = self.floors(queues, &before, within).await;
        let after = self.consumer_names(deadline).await?;
        let before: HashSet<&str> = before.iter().map(String::as_str).collect();
        // The queues that gained a reader between the two listings.
        let grew: HashSet<&str> = after
            .iter()
            .filter(|c| !before.contains(c.as_str()))
            .filter_map(|c| split_consumer(c).map(|(q, _)| q))
            .collect();
        let mut done = Vec::new();
        for queue in queues.iter() {
            let newcomer = grew.contains(queue.as_str());
            let f = floors.get(queue.as_str());
            if newcomer || f.is_some_and(|f| f.unread) {
                continue;
            }
            let bound = f
                .and_then(|f| f.lowest)
                .map_or(end, |floor| floor.saturating_add(1).min(end));
            let deadline = within.unwrap_or_else(|| self.api.deadline());
            self.purge_below(queue, bound, deadline).await?;
            done.push(queue.clone());
        }
        for queue in done {
            queues.remove(&queue);
        }
        Ok(())
    }

    /// Step 3: the lowest ack floor of each queue's readers in `names`; each read
    /// within `deadline`, or a retry window of its own.
    async fn floors(
        &self,
        queues: &HashSet<String>,
        names: &[String],
        deadline: Option<Instant>,
    ) -> HashMap<String, Floors> {
        let mut floors: HashMap<String, Floors> = HashMap::new();
        for name in names {
            let Some((queue, _)) = split_consumer(name) else {
                continue;
            };
            if !queues.contains(queue) {
                continue;
            }
            let f = floors.entry(queue.to_owned()).or_default();
            let deadline = deadline.unwrap_or_else(|| self.api.deadline());
            match self.consumer_info(name, deadline).await {
                Ok(info) => {
                    let floor = info.ack_floor.stream_seq;
                    f.lowest = Some(f.lowest.map_or(floor, |l| l.min(floor)));
                }
                // Deleted since the listing: it keeps nothing.
                Err(e) if e.kind() == Kind::NotFound => {}
                Err(_) => f.unread = true,
            }
        }
        floors
    }

    /// The first stream sequence some reader of `queue` still keeps: its readers'
    /// lowest ack floor + 1 (1 when it has none). What is below it every reader
    /// confirmed, and a sweep may remove at any moment.
    pub(super) async fn kept_from(&self, queue: &str, deadline: Instant) -> Result<u64> {
        let names = self.consumer_names(deadline).await?;
        let queues = HashSet::from([queue.to_owned()]);
        let floors = self.floors(&queues, &names, Some(deadline)).await;
        match floors.get(queue) {
            Some(f) if f.unread => Err(unavailable(format!(
                "the positions of the readers of queue {queue} could not be read"
            ))),
            Some(Floors {
                lowest: Some(floor),
                ..
            }) => Ok(floor.saturating_add(1)),
            _ => Ok(1),
        }
    }

    /// The queues whose subjects hold messages.
    async fn queues_with_items(&self, deadline: Instant) -> Result<Vec<String>> {
        let prefix = format!("{}.", self.layout.prefix);
        let counts = self.subject_counts(deadline).await?;
        Ok(counts
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .filter_map(|(subject, _)| subject.strip_prefix(&prefix).map(str::to_owned))
            .filter(|queue| weir_types::validate_queue_name(queue).is_ok())
            .collect())
    }

    /// Purges `queue`'s messages below sequence `bound`, unless this instance already did.
    async fn purge_below(&self, queue: &str, bound: u64, deadline: Instant) -> Result<()> {
        // `seq` 0 would purge the whole subject, 1 nothing.
        if bound <= 1 {
            return Ok(());
        }
        if lock(&self.sweeper.purged)
            .get(queue)
            .is_some_and(|&done| done >= bound)
        {
            return Ok(());
        }
        let api = format!("STREAM.PURGE.{}", self.layout.stream);
        let body = json!({ "filter": self.layout.subject(queue), "seq": bound });
        let purged: Purged = self.api.json(&api, &body, deadline).await?;
        if purged.purged > 0 {
            self.stats_cache.invalidate();
        }
        let mut done = lock(&self.sweeper.purged);
        done.insert(queue.to_owned(), bound);
        // Bounded: cleared whole past `consumers_max` entries (a queue then purged
        // again costs one Raft round, nothing else).
        if done.len() > usize::try_from(self.config.consumers_max).unwrap_or(usize::MAX) {
            done.clear();
        }
        Ok(())
    }
}
