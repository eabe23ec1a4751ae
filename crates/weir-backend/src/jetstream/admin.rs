//! `delete`, `flush` and `flush_all` on the cluster.
//!
//! - `delete q` never loses an item an instance acknowledged. Another instance may still hold a
//!   handle on `q` and `set` into it after the delete; had `q~` gone, the next sweep
//!   would remove that item, kept for no reader. So the named readers'
//!   consumers are deleted, the subject is purged, and `q~` stays: the queue starts
//!   again, empty, and still shows in `stats` (with 0 items).
//!   A queue kept for its readers (no `q~`, see `open_queue_for_readers`) keeps its
//!   readers for the same reason, and loses its items.
//! - `delete q.r` deletes the consumer `q~r` (what only it kept goes at the next
//!   sweep).
//! - `flush q` purges the subject (for every reader); `flush q.r` moves `q~r` past the
//!   queue's newest item with CONSUMER.RESET (nats-server 2.14+), in place: there is
//!   no moment without the consumer, when an item only it would keep (a queue kept
//!   for one reader) would not be stored. On an older server, or for a consumer an
//!   earlier build made with `deliver_policy` `new` (which cannot be reset), it is
//!   deleted and made again after the newest item, with that moment.
//! - `flush_all` purges each queue's subject; queues and readers stay.
//! - After a purge a take through this instance skips the items it covered that a
//!   replica not yet past the purge still delivers (`QueueEntry::purged_below`).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use serde::Deserialize;
use serde_json::json;

use super::errors::unavailable;
use super::inner::Inner;
use super::layout::{consumer_name, ConsumerInfo, Start};
use crate::error::{Error, Kind, Result};

/// A `STREAM.PURGE` answer.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct Purged {
    pub purged: u64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Deleted {
    success: bool,
}

impl Inner {
    pub(super) async fn delete_queue(&self, queue: &str) -> Result<bool> {
        weir_types::validate_queue_name(queue)?;
        let deadline = self.api.deadline();
        self.ready(deadline).await?;
        let prefix = consumer_name(queue, "");
        let names = self.consumer_names(deadline).await?;
        if !names.contains(&prefix) && names.iter().any(|n| n.starts_with(&prefix)) {
            // A queue kept for its readers: their consumers are what keeps its next
            // items (it has no `q~`), so they stay and only the items go.
            self.purge(queue, deadline).await?;
            self.stats_cache.invalidate();
            return Ok(true);
        }
        let existed = names.contains(&prefix);
        for name in names
            .iter()
            .filter(|n| n.starts_with(&prefix) && **n != prefix)
        {
            self.delete_consumer(name, deadline).await?;
        }
        if let Some(q) = self.registry.get(queue) {
            q.forget_named_readers();
        }
        self.purge(queue, deadline).await?;
        self.stats_cache.invalidate();
        Ok(existed)
    }

    pub(super) async fn delete_reader(&self, queue: &str, reader: &str) -> Result<bool> {
        weir_types::validate_queue_name(queue)?;
        weir_types::validate_reader_name(reader)?;
        if reader.is_empty() {
            return Err(Error::new(
                Kind::InvalidArgument,
                "the default reader goes with its queue: delete the queue",
            ));
        }
        let deadline = self.api.deadline();
        self.ready(deadline).await?;
        let deleted = self
            .delete_consumer(&consumer_name(queue, reader), deadline)
            .await?;
        if let Some(q) = self.registry.get(queue) {
            q.forget_reader(reader);
        }
        self.sweeper.mark(queue);
        self.stats_cache.invalidate();
        Ok(deleted)
    }

    pub(super) async fn flush(&self, queue: &str, reader: Option<&str>) -> Result<u64> {
        weir_types::validate_queue_name(queue)?;
        let deadline = self.api.deadline();
        self.ready(deadline).await?;
        let flushed = match reader {
            None => self.purge(queue, deadline).await?,
            Some(reader) => {
                weir_types::validate_reader_name(reader)?;
                let moved = self.restart_reader(queue, reader, deadline).await?;
                self.sweeper.mark(queue);
                moved
            }
        };
        self.stats_cache.invalidate();
        Ok(flushed)
    }

    /// Purges each queue's subject that holds items, but those `keep` names (never
    /// the whole stream at once: a kept queue empty when the subjects were counted
    /// could have an item stored before the purge). Each purge has a deadline of
    /// its own. The queues this instance appended to since it last purged them are
    /// purged too, counted or not: the stream's counts come from whichever replica
    /// answers, which can trail a write just acknowledged (read your writes).
    pub(super) async fn flush_all(&self, keep: fn(&str) -> bool) -> Result<()> {
        let deadline = self.api.deadline();
        self.ready(deadline).await?;
        let counts = self.subject_counts(deadline).await?;
        let prefix = format!("{}.", self.layout.prefix);
        let mut queues: BTreeSet<String> = counts
            .keys()
            .filter_map(|subject| subject.strip_prefix(&prefix))
            .map(str::to_owned)
            .collect();
        queues.extend(
            self.registry
                .all()
                .iter()
                .filter(|q| q.appended_since_purge())
                .map(|q| q.name.to_string()),
        );
        for queue in queues.iter().filter(|queue| !keep(queue)) {
            self.purge(queue, self.api.deadline()).await?;
        }
        self.stats_cache.invalidate();
        Ok(())
    }

    /// `flush q.r`: the reader starts again after the newest item; how many items it
    /// had not confirmed. 0 when it does not exist (it is not created).
    async fn restart_reader(
        &self,
        queue: &str,
        reader: &str,
        deadline: tokio::time::Instant,
    ) -> Result<u64> {
        let name = consumer_name(queue, reader);
        let info = match self.consumer_info(&name, deadline).await {
            Ok(info) => info,
            Err(e) if e.kind() == Kind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        // Placed first if its maker did not finish (see `Inner::place`).
        let info = self.place(&name, info, deadline).await?;
        let flushed = info.num_pending + info.num_ack_pending;
        // Its leases through this instance end, as on the engine: after the move a
        // confirm of one could acknowledge a later delivery of the same item.
        self.end_leases(&name).await;
        self.refresh_records(deadline).await;
        let resettable = matches!(
            info.config.deliver_policy.as_str(),
            "all" | "by_start_sequence"
        );
        let connected = self.api.client.server_info().version;
        if resettable && resets_consumers(&info, &connected) {
            if let Start::At(seq) = self.start_after_newest(deadline).await? {
                let api = format!("CONSUMER.RESET.{}.{name}", self.layout.stream);
                // Its answer (the consumer's info) matters only by not being an error.
                self.api
                    .json::<serde::de::IgnoredAny>(&api, &json!({ "seq": seq }), deadline)
                    .await?;
            }
            return Ok(flushed);
        }
        self.delete_consumer(&name, deadline).await?;
        let open_timeout = self.queue_config(queue).open_timeout;
        let ack_wait = open_timeout.unwrap_or(self.lease_timeout());
        self.create_consumer(queue, reader, ack_wait, true, deadline)
            .await?;
        Ok(flushed)
    }

    /// Deletes a consumer; false when it did not exist.
    pub(super) async fn delete_consumer(
        &self,
        name: &str,
        deadline: tokio::time::Instant,
    ) -> Result<bool> {
        let api = format!("CONSUMER.DELETE.{}.{name}", self.layout.stream);
        match self.api.json::<Deleted>(&api, &json!({}), deadline).await {
            Ok(d) => Ok(d.success),
            Err(e) if e.kind() == Kind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Purges one queue's subject, or the whole stream; how many items went.
    async fn purge(&self, queue: &str, deadline: tokio::time::Instant) -> Result<u64> {
        let api = format!("STREAM.PURGE.{}", self.layout.stream);
        let body = json!({ "filter": self.layout.subject(queue) });
        // Read before the purge is sent: each append it covers was stored before.
        let entry = self.registry.get(queue);
        let below = entry
            .as_ref()
            .map(|q| q.appended_seq.load(Ordering::Relaxed).saturating_add(1));
        match self.api.json::<Purged>(&api, &body, deadline).await {
            Ok(p) => {
                if let (Some(q), Some(below)) = (entry, below) {
                    q.purged_below.fetch_max(below, Ordering::Relaxed);
                }
                Ok(p.purged)
            }
            Err(e) if e.kind() == Kind::NotFound => {
                self.stream_lost();
                Err(unavailable(format!(
                    "stream {} is gone: {e}",
                    self.layout.stream
                )))
            }
            Err(e) => Err(e),
        }
    }
}

/// Whether the consumer's leader has CONSUMER.RESET (nats-server 2.14 and later): the
/// version its info carries (`_nats.ver`, set by the server that answered), else the
/// version of the server this instance is connected to.
pub(super) fn resets_consumers(info: &ConsumerInfo, connected: &str) -> bool {
    let version = info
        .config
        .metadata
        .get("_nats.ver")
        .map_or(connected, String::as_str);
    has_reset(version)
}

/// Whether nats-server `version` has CONSUMER.RESET (2.14 and later).
pub(super) fn has_reset(version: &str) -> bool {
    let mut parts = version
        .trim_start_matches('v')
        .split(['.', '-'])
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (2, 14)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reset_is_asked_of_a_leader_that_has_it() {
        let info = |ver: Option<&str>| {
            let mut info = ConsumerInfo::default();
            if let Some(v) = ver {
                info.config.metadata.insert("_nats.ver".into(), v.into());
            }
            info
        };
        assert!(resets_consumers(&info(Some("2.15.2")), "2.12.0"));
        assert!(resets_consumers(&info(Some("2.14.0-beta.1")), "2.12.0"));
        assert!(!resets_consumers(&info(Some("2.13.9")), "2.15.2"));
        assert!(resets_consumers(&info(None), "v2.14.1"));
        assert!(!resets_consumers(&info(None), "2.12.3"));
        assert!(!resets_consumers(&info(None), "unknown"));
        assert!(resets_consumers(&info(None), "3.0.0"));
    }
}
