//! A new queue's default reader must be known to the stream before its first item.
//!
//! The stream uses interest retention: its leader skips (never stores) a message on a
//! subject no consumer of its own list matches, and still acknowledges it. Creating a
//! consumer is acknowledged by the meta layer, and the stream's leader registers the
//! consumer a moment later. A `set` in that moment would be `STORED` and gone: seen
//! as the first items of a new queue lost when several connections created it at once.
//!
//! So when this door creates (or first meets) a queue's default reader, it publishes a
//! probe (an empty message with the `Weir-Probe` header and a short TTL) to the queue's
//! subject and asks the stream's leader for it by sequence. Found: the stream has the
//! interest, and appends may go; the probe is deleted. Not found: it was skipped, or a reader already took
//! it; the consumer's delivered position tells which (a delivered probe was stored).
//! Skipped: wait a moment and probe again, until the call's deadline. Readers
//! acknowledge and skip probes as they meet them. Cost: one publish and one or two
//! lookups per queue and door, once.
//!
//! Every replica of the stream decides for itself, when it applies a message, whether
//! any of *its* consumers is interested, and skips it if not; a consumer reads from
//! its own node's copy. So the stream leader storing the probe is not enough: a
//! replica that has not yet set up the new consumer drops the first items, and the
//! consumer, led from that node, never delivers them (seen once in CI: the first four
//! `STORED` items of a new queue were never read). So the probe goes only once every
//! online replica of the consumer has caught up with its leader (`CONSUMER.INFO`'s
//! `cluster.replicas`), and it must be seen by the consumer itself (pending or
//! delivered), not only by the stream leader.
//!
//! The cost: under a steady write load to the queue, the replicas of a just-created
//! consumer can take seconds to be reported current, and a first `set` waits for it.
//! Connections of one door creating a queue at once do not all wait: once one of them
//! has proven it and registered the queue, the others go on (before that, three of
//! four such connections, one of them already writing, waited over 3 s in 2 of 8
//! local runs). A consumer that kept every replica interested in every
//! queue from the stream's creation on (the "interest keeper", starting at sequence
//! 2^62) made the probe unnecessary, but was withdrawn: with its ack floor past the
//! stream's last sequence, a purge and a restart made nats-server purge that node's
//! whole copy of the stream ([`super::layout::INTEREST_KEEPER`]).

use std::time::Duration;

use async_nats::HeaderMap;
use bytes::Bytes;
use serde_json::json;
use tokio::time::Instant;

use super::errors::{code, unavailable};
use super::registry::QueueEntry;
use super::Inner;
use crate::Result;

/// Marks a probe: readers acknowledge and skip it.
pub(crate) const PROBE_HEADER: &str = "Weir-Probe";
/// How long an unread probe stays in the stream.
const PROBE_TTL: &str = "60s";
const PROBE_PAUSE: Duration = Duration::from_millis(20);

/// Whether a delivered message is a probe.
pub(crate) fn is_probe(message: &async_nats::Message) -> bool {
    message
        .headers
        .as_ref()
        .is_some_and(|h| h.get(PROBE_HEADER).is_some())
}

/// Returns once a message published to `queue` is stored (see the module doc), or
/// once another connection of this door has registered the queue.
pub(super) async fn await_interest(
    inner: &Inner,
    queue: &QueueEntry,
    consumer: &str,
    deadline: Instant,
) -> Result<()> {
    probe(inner, queue, consumer, deadline, Shortcut::Registered).await
}

/// Returns once `consumer`, a named reader of a queue kept for its readers, has
/// every online replica current and sees what is published to the queue. Every such
/// reader is proven, whether or not the queue is registered: with no default reader,
/// a replica that has not set up reader `b` yet drops an item as soon as the other
/// readers confirmed it, and `b`, led from there, would never get it.
pub(super) async fn prove_reader(
    inner: &Inner,
    queue: &QueueEntry,
    consumer: &str,
    deadline: Instant,
) -> Result<()> {
    probe(inner, queue, consumer, deadline, Shortcut::None).await
}

/// Whether a probe may stop early.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shortcut {
    /// Once the queue is in the registry with its default reader: another connection
    /// proved that reader.
    Registered,
    None,
}

async fn probe(
    inner: &Inner,
    queue: &QueueEntry,
    consumer: &str,
    deadline: Instant,
    shortcut: Shortcut,
) -> Result<()> {
    let registered = || {
        shortcut == Shortcut::Registered
            && inner
                .registry
                .get(&queue.name)
                .is_some_and(|q| q.reader("").is_some())
    };
    await_replicas(inner, consumer, deadline, &registered).await?;
    loop {
        if registered() {
            return Ok(());
        }
        let mut headers = HeaderMap::new();
        let n = inner
            .published
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        headers.insert("Nats-Msg-Id", format!("{}.{n}", inner.door_id));
        headers.insert(PROBE_HEADER, "1");
        headers.insert("Nats-TTL", PROBE_TTL);
        let seq = super::queue::publish(inner, queue, headers, Bytes::new(), deadline).await?;
        if stored(inner, seq, deadline).await? && seen_by(inner, consumer, seq, deadline).await? {
            // Seen: removed again, so no reader and no count ever meets it (one that
            // is not removed is skipped by readers and goes with its TTL).
            let api = format!("STREAM.MSG.DELETE.{}", inner.layout.stream);
            let body = json!({ "seq": seq, "no_erase": true });
            let _ = inner
                .api
                .json_or_api_error::<serde_json::Value>(&api, &body, deadline)
                .await;
            return Ok(());
        }
        let info = inner.consumer_info(consumer, deadline).await?;
        if info.delivered.stream_seq >= seq {
            return Ok(());
        }
        if Instant::now() + PROBE_PAUSE >= deadline {
            return Err(unavailable(format!(
                "the stream does not register the reader {consumer} of queue {}",
                queue.name
            )));
        }
        tokio::time::sleep(PROBE_PAUSE).await;
    }
}

/// Waits until every online replica of `consumer` has caught up with its leader.
/// Another of this door's connections may have proven it first, for the same queue
/// (`registered` then): that is as good, the replicas stay set up.
async fn await_replicas(
    inner: &Inner,
    consumer: &str,
    deadline: Instant,
    registered: &impl Fn() -> bool,
) -> Result<()> {
    loop {
        if registered() {
            return Ok(());
        }
        let info = inner.consumer_info(consumer, deadline).await?;
        if info.replicas_current() {
            return Ok(());
        }
        if Instant::now() + PROBE_PAUSE >= deadline {
            return Err(unavailable(format!(
                "the replicas of reader {consumer} do not catch up"
            )));
        }
        tokio::time::sleep(PROBE_PAUSE).await;
    }
}

/// Whether the consumer (on its leader's node) has message `seq` pending or delivered.
async fn seen_by(inner: &Inner, consumer: &str, seq: u64, deadline: Instant) -> Result<bool> {
    let info = inner.consumer_info(consumer, deadline).await?;
    Ok(info.num_pending > 0 || info.delivered.stream_seq >= seq)
}

/// Whether the stream's leader has message `seq`.
async fn stored(inner: &Inner, seq: u64, deadline: Instant) -> Result<bool> {
    let api = format!("STREAM.MSG.GET.{}", inner.layout.stream);
    match inner
        .api
        .json_or_api_error::<serde_json::Value>(&api, &json!({ "seq": seq }), deadline)
        .await?
    {
        Ok(_) => Ok(true),
        Err(e) if e.err_code == code::NO_MESSAGE_FOUND => Ok(false),
        Err(e) => Err(e.to_error()),
    }
}
