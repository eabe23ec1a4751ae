//! `max_deliveries` and lease extension on the cluster.
//!
//! - A delivery whose count (the consumer's own, from the ack subject) passes the
//!   queue's `max_deliveries` is not handed out: the take appends it to the queue's
//!   `dead_letter_to` (or drops it, with none), then acknowledges it, and looks
//!   further. Where JetStream's own MaxDeliver would stop delivering and keep the
//!   message pending for ever, this moves it, as the engine does. An append that
//!   fails leaves it pending: it is given back with a delay ([`RETRY_NAK`]) and moved
//!   by a later take. A process killed between the append and the acknowledgement
//!   leaves the item in both queues (a duplicate, never a loss).
//! - Unlike the engine's count, the consumer's also counts a delivery whose weir
//!   instance was killed before it gave the item back.
//! - `touch`: a lease kept alive by this instance (no `open_timeout`) needs nothing;
//!   one with a fixed AckWait gets `+WPI` (AckWait starts again). The extension is
//!   always one AckWait: a chosen one is refused.

use std::sync::atomic::Ordering;
use std::time::Duration;

use weir_types::{AppendOptions, Item};

use super::handles::Reader;
use super::lease::Lease;
use super::queue;
use crate::error::{Error, Kind, Result};

/// What an item that could not be dead-lettered gets: delivered again in five seconds.
const RETRY_NAK: &[u8] = br#"-NAK {"delay":5000000000}"#;

impl Reader {
    /// Moves a delivery past `max_deliveries` to `dead_letter_to`, then acknowledges it.
    pub(super) async fn dead_letter(&self, item: Item, reply: &str) {
        let inner = &self.inner;
        let moved = match self.queue.dead_letter_to() {
            None => {
                tracing::warn!(queue = %self.queue.name, seq = item.seq, "jetstream: an item reached max_deliveries and the queue has no dead_letter_to: dropped");
                Ok(())
            }
            Some(target) => {
                let options = AppendOptions {
                    flags: item.flags,
                    ..AppendOptions::default()
                };
                match inner.open_queue(&target).await {
                    Ok(entry) => queue::append(inner, &entry, item.data, options)
                        .await
                        .map(|_| ()),
                    Err(e) => Err(e),
                }
            }
        };
        if let Err(e) = moved {
            tracing::warn!(queue = %self.queue.name, seq = item.seq, error = %e, "jetstream: could not move an item to dead_letter_to; it is given back and moved later");
            inner.api.publish(reply.to_string(), RETRY_NAK).await;
            return;
        }
        match self.ack(reply).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::warn!(queue = %self.queue.name, seq = item.seq, error = %e, "jetstream: a dead letter's ack is unconfirmed; it may be moved twice");
            }
        }
        self.entry.dead_lettered.fetch_add(1, Ordering::Relaxed);
    }

    /// Extends a lease (see the module docs): false when this instance no longer
    /// holds it.
    pub async fn touch(&self, lease: &Lease, extend: Option<Duration>) -> Result<bool> {
        if extend.is_some() {
            return Err(Error::new(
                Kind::Unsupported,
                "extending a lease by a chosen time is not supported on the jetstream backend (it extends by the reader's AckWait: touch without a time)",
            ));
        }
        let Some(renewed) = self.inner.leases.renewed(&lease.reply) else {
            return Ok(false);
        };
        if renewed {
            return Ok(true);
        }
        let sent_at = tokio::time::Instant::now();
        if !self.acknowledge(&lease.reply, b"+WPI").await? {
            return Ok(false);
        }
        self.inner.leases.touched(&lease.reply, sent_at);
        Ok(true)
    }
}
