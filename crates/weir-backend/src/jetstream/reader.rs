//! Taking, leasing, peeking and confirming.
//!
//! - A take or a lease is a pull of one message from the reader's consumer: with no
//!   wait, one request (`{"batch":1,"no_wait":true}` to `CONSUMER.MSG.NEXT`); with a
//!   wait, a long poll ([`super::pull`]). The pull and the double ack use an inbox of
//!   their own per request, not the client's shared reply subscription: with
//!   nats-server 2.15.2 the first reply of a consumer leader on another node to a
//!   client's shared subscription was lost (a pulled message then waited out its
//!   AckWait), reproducibly; an inbox of its own did not lose it.
//! - A plain take then acknowledges with a double ack (`+ACK` as a request: the reply
//!   says the consumer recorded it) before it answers, so a `get` the client saw is
//!   not delivered again unless the cluster lost the ack's quorum.
//! - An item whose `Weir-Expires` has passed is acknowledged and skipped (the server's
//!   own TTL deletion is lazy, by up to a few seconds): expiry is exact at delivery.
//!   So is an item this instance purged (`flush`) that a replica behind the purge
//!   still delivers.
//! - A lease keeps the message's ack subject; it is kept alive by [`super::leases`]
//!   unless the queue sets `open_timeout`.
//! - `peek` reads the reader's ack floor (`CONSUMER.INFO`) and the queue's kept items
//!   after it by Direct Get, skipping what this instance has leased: the oldest item the
//!   reader has not confirmed, given-back ones included. It does not see leases held
//!   at other instances (it may show such an item), and with several readers an item this
//!   reader confirmed out of order may show while others still need it. It changes
//!   nothing: giving a pulled item back would reorder JetStream's redeliveries, which
//!   go in the order they were given back.

use async_nats::{HeaderMap, Message, Request};
use bytes::Bytes;
use tokio::time::Instant;
use weir_types::{Item, TakeMode};

use super::api::{Backoff, Sent};
use super::errors::{not_found, unavailable, unexpected};
use super::handles::Reader;
use super::layout::Delivery;
use super::lease::Lease;
use super::pull::{self, Pulled};
use super::queue::{now_ms, EXPIRES_HEADER, FLAGS_HEADER};
use crate::error::Result;
use crate::taken::{self, Taken};

/// Expired items one take (or peek) skips before it answers "nothing": a bound on the
/// work one request can cause.
const SKIPS_MAX: usize = 10_000;

/// How long a take waits for this instance's queued releases to be confirmed first.
const RELEASES_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// A PubAck says a quorum stored the item, but the consumer's leader may be on a
/// replica that applies it a moment later, and a no-wait pull there finds nothing.
/// So a no-wait take that finds nothing on a queue this instance appended to within
/// [`RECENT_APPEND_MS`], and whose consumer has not yet delivered this instance's latest
/// append to it, waits up to this long for it: an instance reads its own writes, as with
/// the engine (`set` then `get`). The wait is at the server (a pull with `expires`)
/// and ends as soon as the replica has the item. Replication on a healthy cluster
/// takes well under a millisecond. (Waiting 100 ms on every empty get after a write,
/// without the consumer check, cost the flood benchmark a fivefold slowdown.) A
/// replica slower than that (a loaded machine, a node catching up) is waited for in
/// such steps, the consumer checked before each, up to [`REPLICA_LAG_MAX`].
const REPLICA_LAG: std::time::Duration = std::time::Duration::from_millis(10);
const REPLICA_LAG_MAX: std::time::Duration = std::time::Duration::from_millis(200);
const RECENT_APPEND_MS: u64 = 2_000;

const NO_WAIT: &[u8] = br#"{"batch":1,"no_wait":true}"#;

impl Reader {
    pub(super) async fn take_or_lease(
        &self,
        mode: TakeMode,
        wait: std::time::Duration,
    ) -> Result<Option<Taken>> {
        let inner = &self.inner;
        inner.ready(inner.api.deadline()).await?;
        inner.leases.released(RELEASES_WAIT).await;
        let until = Instant::now() + wait;
        for _ in 0..SKIPS_MAX {
            let message = if wait.is_zero() {
                match self.next_now().await? {
                    None if self.appended_lately() => self.own_write().await?,
                    found => found,
                }
            } else {
                pull::next_until(self, until).await?
            };
            let Some(message) = message else {
                return Ok(None);
            };
            let probe = super::probe::is_probe(&message);
            let (item, reply, deliveries) = delivered(message)?;
            if probe || item.expires_at_ms != 0 {
                inner.sweeper.mark(&self.queue.name);
            }
            if probe {
                inner.api.publish(reply.to_string(), b"+ACK").await;
                continue;
            }
            if item.expires_at_ms != 0 && item.expires_at_ms <= now_ms() {
                self.entry
                    .expired
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                inner.api.publish(reply.to_string(), b"+ACK").await;
                continue;
            }
            if self.queue.purged(item.seq) {
                // Flushed through this instance; its replica had not applied the purge.
                inner.api.publish(reply.to_string(), b"+ACK").await;
                continue;
            }
            if self.queue.delivered_enough(deliveries) {
                self.dead_letter(item, &reply).await;
                continue;
            }
            if mode == TakeMode::Take {
                match self.ack(&reply).await {
                    Ok(true) => {}
                    Ok(false) => return Err(not_found(format!("reader {}", self.entry.consumer))),
                    // Unconfirmed (an election outlasted the retries): the ack may
                    // have been recorded with its reply lost. Hand the item out
                    // anyway: if the ack was not recorded, the item comes back after
                    // AckWait (delivered twice), where refusing it could lose it.
                    Err(e) => {
                        tracing::warn!(error = %e, seq = item.seq, "jetstream: a take's ack is unconfirmed; the item may be delivered again");
                    }
                }
                return Ok(Some(Taken {
                    item,
                    lease: None,
                    deliveries,
                }));
            }
            return Ok(Some(self.leased(item, reply, deliveries).await));
        }
        Ok(None)
    }

    /// A pulled item handed out under a lease: kept alive (unless the queue sets
    /// `open_timeout`), and recorded first so that another instance gives it back at once
    /// if this one is killed ([`super::instances`]).
    async fn leased(&self, item: Item, reply: std::sync::Arc<str>, deliveries: u32) -> Taken {
        let inner = &self.inner;
        // Its AckWait runs from its delivery, before the record's write.
        let taken = tokio::time::Instant::now();
        let renew = self.queue.open_timeout().is_none();
        let ack_wait = self.entry.ack_wait();
        let expires_at_ms = if renew {
            0
        } else {
            now_ms().saturating_add(u64::try_from(ack_wait.as_millis()).unwrap_or(u64::MAX))
        };
        // A lease kept alive has no end of its own; one with a fixed AckWait has.
        debug_assert!(
            renew || expires_at_ms != 0,
            "a lease with neither renewals nor an end"
        );
        // The lease names its item by the delivery's stream sequence.
        debug_assert_eq!(
            Delivery::parse(&reply).map(|d| d.stream_seq),
            Some(item.seq),
            "a lease whose ack subject names another item"
        );
        let record = inner.instances.record(&reply, expires_at_ms).await;
        inner
            .leases
            .keep(reply.clone(), ack_wait, renew, record, taken);
        let lease = Lease {
            reply,
            seq: item.seq,
        };
        Taken {
            item,
            lease: Some(taken::Lease::JetStream(lease)),
            deliveries,
        }
    }

    /// Whether the reader's consumer has gone past this instance's latest append to the
    /// queue: then an empty pull means an empty queue, with no replica to wait for
    /// (one request, where waiting costs up to [`REPLICA_LAG`]).
    async fn caught_up(&self) -> Result<bool> {
        let last = self
            .queue
            .appended_seq
            .load(std::sync::atomic::Ordering::Relaxed);
        let deadline = self.inner.api.deadline();
        let info = self
            .inner
            .consumer_info(&self.entry.consumer, deadline)
            .await?;
        Ok(info.delivered.stream_seq >= last)
    }

    /// After a no-wait pull found nothing: this instance's latest append to the queue,
    /// once the reader's consumer has it (see [`REPLICA_LAG`]); nothing once the
    /// consumer delivered it (to anyone) or [`REPLICA_LAG_MAX`] passed.
    async fn own_write(&self) -> Result<Option<Message>> {
        let until = Instant::now() + REPLICA_LAG_MAX;
        while Instant::now() < until {
            if self.caught_up().await? {
                return Ok(None);
            }
            let step = (Instant::now() + REPLICA_LAG).min(until);
            if let Some(message) = pull::next_until(self, step).await? {
                return Ok(Some(message));
            }
        }
        Ok(None)
    }

    /// Whether this instance appended to the queue within [`RECENT_APPEND_MS`].
    fn appended_lately(&self) -> bool {
        let at = self
            .queue
            .appended_at_ms
            .load(std::sync::atomic::Ordering::Relaxed);
        now_ms().saturating_sub(at) < RECENT_APPEND_MS
    }

    /// One message if there is one now.
    async fn next_now(&self) -> Result<Option<Message>> {
        let api = &self.inner.api;
        let deadline = api.deadline();
        let mut backoff = Backoff::new(deadline);
        let mut checked = false;
        loop {
            let request = Request::new()
                .payload(Bytes::from_static(NO_WAIT))
                .inbox(api.client.new_inbox());
            let subject = self.entry.next_subject.to_string();
            let why = match api.send(subject, request, deadline).await {
                Sent::Reply(m) => match pull::classify(&m) {
                    Pulled::Item => return Ok(Some(m)),
                    Pulled::Nothing => return Ok(None),
                    Pulled::Gone => {
                        return Err(not_found(format!("reader {}", self.entry.consumer)))
                    }
                    Pulled::Heartbeat => "a heartbeat".to_owned(),
                    Pulled::Retry(why) => why,
                },
                Sent::NoResponders => {
                    if self.gone_at_first_silence(&mut checked, deadline).await? {
                        return Err(not_found(format!("reader {}", self.entry.consumer)));
                    }
                    "no responders (consumer leader election?)".to_owned()
                }
                Sent::Failed(why) => why,
                Sent::Refused(e) => return Err(e),
            };
            if !backoff.pause(&api.metrics).await {
                return Err(unavailable(format!(
                    "pulling from {}: {why}",
                    self.entry.consumer
                )));
            }
        }
    }

    /// At a call's first "no responders": whether the consumer is gone, rather than
    /// electing a leader (asked once per call; later silences are retried).
    async fn gone_at_first_silence(&self, checked: &mut bool, deadline: Instant) -> Result<bool> {
        if std::mem::replace(checked, true) {
            return Ok(false);
        }
        self.inner
            .consumer_gone(&self.entry.consumer, deadline)
            .await
    }

    /// Double ack: true once the consumer recorded it, false when the consumer is gone.
    pub(super) async fn ack(&self, reply: &str) -> Result<bool> {
        self.inner.sweeper.mark(&self.queue.name);
        self.acknowledge(reply, b"+ACK").await
    }

    /// Sends `kind` (`+ACK`, `+WPI`) to a delivery's ack subject as a request: true
    /// once the consumer recorded it, false when the consumer is gone.
    pub(super) async fn acknowledge(&self, reply: &str, kind: &'static [u8]) -> Result<bool> {
        let api = &self.inner.api;
        let deadline = api.deadline();
        let mut backoff = Backoff::new(deadline);
        let mut checked = false;
        loop {
            let request = Request::new()
                .payload(Bytes::from_static(kind))
                .inbox(api.client.new_inbox());
            let why = match api.send(reply.to_owned(), request, deadline).await {
                Sent::Reply(_) => return Ok(true),
                Sent::NoResponders => {
                    if self.gone_at_first_silence(&mut checked, deadline).await? {
                        return Ok(false);
                    }
                    "no responders (consumer leader election?)".to_owned()
                }
                Sent::Failed(why) => why,
                Sent::Refused(e) => return Err(e),
            };
            if !backoff.pause(&api.metrics).await {
                return Err(unavailable(format!("acknowledging: {why}")));
            }
        }
    }

    pub(super) async fn peek(&self) -> Result<Option<Taken>> {
        let inner = &self.inner;
        let deadline = inner.api.deadline();
        inner.ready(deadline).await?;
        inner.leases.released(RELEASES_WAIT).await;
        let info = inner.consumer_info(&self.entry.consumer, deadline).await?;
        let leased = inner.leases.leased_seqs(&self.entry.consumer);
        let mut seq = info.ack_floor.stream_seq + 1;
        for _ in 0..SKIPS_MAX {
            let Some(message) = self.direct_get(seq, deadline).await? else {
                return Ok(None);
            };
            let probe = super::probe::is_probe(&message);
            let item = stored(message)?;
            seq = item.seq + 1;
            let expired = item.expires_at_ms != 0 && item.expires_at_ms <= now_ms();
            let flushed = self.queue.purged(item.seq);
            if probe || expired || flushed || leased.contains(&item.seq) {
                continue;
            }
            // A peek hands nothing out: the consumer's count is not known here.
            return Ok(Some(Taken {
                item,
                lease: None,
                deliveries: 0,
            }));
        }
        Ok(None)
    }

    /// The queue's first kept message at or after `seq` (Direct Get `next_by_subj`;
    /// any replica may answer).
    async fn direct_get(&self, seq: u64, deadline: Instant) -> Result<Option<Message>> {
        let query = serde_json::json!({"seq": seq, "next_by_subj": &*self.queue.subject});
        self.inner
            .api
            .direct_get(&self.inner.layout.stream, &query, deadline)
            .await
    }
}

pub(super) fn header_u64(headers: Option<&HeaderMap>, name: &str) -> u64 {
    headers
        .and_then(|h| h.get(name))
        .and_then(|v| v.as_str().trim().parse().ok())
        .unwrap_or(0)
}

/// A pulled message as an item, its ack subject and its delivery count.
fn delivered(message: Message) -> Result<(Item, std::sync::Arc<str>, u32)> {
    let reply = message
        .reply
        .as_ref()
        .map(|r| r.as_str())
        .ok_or_else(|| unexpected("a pulled message without its ack subject"))?;
    let delivery =
        Delivery::parse(reply).ok_or_else(|| unexpected(format!("ack subject {reply:?}")))?;
    let reply: std::sync::Arc<str> = reply.into();
    let headers = message.headers.as_ref();
    let item = Item {
        seq: delivery.stream_seq,
        flags: u32::try_from(header_u64(headers, FLAGS_HEADER)).unwrap_or(0),
        enqueued_at_ms: delivery.timestamp_ns / 1_000_000,
        expires_at_ms: header_u64(headers, EXPIRES_HEADER),
        job: super::queue::job_of(headers),
        data: message.payload,
    };
    Ok((item, reply, delivery.delivered))
}

/// A Direct Get reply as an item (`Nats-Sequence` header; the enqueue time is not
/// read, a peek does not show it).
fn stored(message: Message) -> Result<Item> {
    let headers = message.headers.as_ref();
    let seq = header_u64(headers, "Nats-Sequence");
    if seq == 0 {
        return Err(unexpected("a direct get reply without Nats-Sequence"));
    }
    Ok(Item {
        seq,
        flags: u32::try_from(header_u64(headers, FLAGS_HEADER)).unwrap_or(0),
        enqueued_at_ms: 0,
        expires_at_ms: header_u64(headers, EXPIRES_HEADER),
        job: super::queue::job_of(headers),
        data: message.payload,
    })
}
