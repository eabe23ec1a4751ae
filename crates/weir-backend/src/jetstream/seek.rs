//! Moving a reader, and what it may be moved to: [`crate::Queue::seek_reader`],
//! [`crate::Queue::bounds`], [`crate::Queue::seq_at_time`], [`crate::Queue::has_reader`] and
//! [`crate::Queue::append_batch`] on JetStream (the event bus's replay, retention
//! and dead letters need them).
//!
//! A reader is moved in place with `CONSUMER.RESET` (nats-server 2.14 and later),
//! which sets the consumer's next stream sequence and drops its pending leases; a
//! move forward lets the next sweep (`sweep.rs`) remove what it skipped, if no
//! other reader keeps it. The server lets an `all` consumer go anywhere (readers made at the end
//! are made `all` and then moved to the end: `Start::Placed`), a `by_start_sequence`
//! one (a reader made at the end by builds before 2026-11-27, or on servers before
//! 2.14) not below its start, and a `new` one (made by earlier builds) nowhere: the
//! target is clamped to the start, and a `new` reader is refused with a clear
//! error.
//!
//! The leases this instance holds on the reader end with the move (as on the engine):
//! confirming one answers false and acknowledges nothing, since its item may be
//! pending again under a new delivery, which the stale acknowledgement would
//! confirm. Leases other instances hold are not known here: their confirm of an item
//! delivered again confirms the new delivery (the item was delivered once; at
//! least once holds), and a release of one gives it back early.

use serde::Deserialize;
use serde_json::json;

use super::errors::{code, unexpected};
use super::handles::Queue;
use super::inner::Inner;
use super::layout::{consumer_name, Start};
use super::map::MsgGet;
use super::scan::rfc3339;
use crate::error::{Error, Kind, Result};
use crate::position::SeekTo;
use weir_types::AppendOptions;

#[derive(Deserialize, Default)]
#[serde(default)]
struct ResetReply {
    reset_seq: u64,
}

impl Queue {
    /// One publish per item, in order; the first one's sequence number. A failure
    /// part-way leaves the items before it stored, and says how many.
    pub async fn append_batch(&self, items: &[&[u8]], options: AppendOptions) -> Result<u64> {
        if items.is_empty() {
            return Err(Error::new(Kind::InvalidArgument, "an empty batch"));
        }
        let mut first = 0;
        for (i, item) in items.iter().enumerate() {
            let seq = match self
                .append(bytes::Bytes::copy_from_slice(item), options)
                .await
            {
                Ok(seq) => seq,
                Err(e) if i == 0 => return Err(e),
                Err(e) => {
                    return Err(Error::new(
                        e.kind(),
                        format!("{e} (the batch's first {i} items are stored)"),
                    ))
                }
            };
            if first == 0 {
                first = seq;
            }
        }
        Ok(first)
    }

    /// `(oldest, next)`: the first message on the queue's subject (`next` when it
    /// has none), and one past the stream's last sequence, as its leader answers.
    pub async fn bounds(&self) -> Result<(u64, u64)> {
        let inner = &self.inner;
        let deadline = inner.api.deadline();
        inner.ready(deadline).await?;
        bounds(inner, &self.entry.name, deadline).await
    }

    /// The first message on the queue's subject stored at `ms` or later, within
    /// [`Queue::bounds`].
    pub async fn seq_at_time(&self, ms: u64) -> Result<u64> {
        let inner = &self.inner;
        let deadline = inner.api.deadline();
        inner.ready(deadline).await?;
        target(inner, &self.entry.name, SeekTo::Time(ms), deadline).await
    }

    /// Whether the reader's consumer exists (this instance's registry, else the cluster).
    pub async fn has_reader(&self, reader: &str) -> Result<bool> {
        weir_types::validate_reader_name(reader)?;
        if self.entry.reader(reader).is_some() {
            return Ok(true);
        }
        let inner = &self.inner;
        let deadline = inner.api.deadline();
        inner.ready(deadline).await?;
        let name = consumer_name(&self.entry.name, reader);
        match inner.consumer_info(&name, deadline).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == Kind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Moves the reader with `CONSUMER.RESET`; where it stands, `None` when it does
    /// not exist. See the module doc for what may be moved where.
    pub async fn seek_reader(&self, reader: &str, to: SeekTo) -> Result<Option<u64>> {
        weir_types::validate_reader_name(reader)?;
        let inner = &self.inner;
        let deadline = inner.api.deadline();
        inner.ready(deadline).await?;
        let name = consumer_name(&self.entry.name, reader);
        let info = match inner.consumer_info(&name, deadline).await {
            Ok(info) => info,
            Err(e) if e.kind() == Kind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        // A reader its maker did not finish placing is placed first, so that the
        // placing is not done again, over this move, by an instance that finds it later.
        let info = inner.place(&name, info, deadline).await?;
        let floor = match info.config.deliver_policy.as_str() {
            "all" => 0,
            "by_start_sequence" => info.config.opt_start_seq,
            other => {
                return Err(Error::new(
                    Kind::Unsupported,
                    format!("reader {name} was made with deliver_policy {other:?}, which JetStream cannot move; delete it and make it again"),
                ))
            }
        };
        if !super::admin::resets_consumers(&info, &inner.api.client.server_info().version) {
            return Err(Error::new(
                Kind::Unsupported,
                format!("moving reader {name} needs nats-server 2.14 or later (CONSUMER.RESET)"),
            ));
        }
        // This instance's leases end first: a confirm racing the move must not
        // acknowledge an item the move makes pending again.
        inner.end_leases(&name).await;
        inner.refresh_records(deadline).await;
        // Where to, read last, just before the move: what some reader keeps
        // (`Inner::kept_from`) can only have risen meanwhile.
        let target = target(inner, &self.entry.name, to, deadline)
            .await?
            .max(floor)
            .max(1);
        let api = format!("CONSUMER.RESET.{}.{name}", inner.layout.stream);
        let reply: ResetReply = inner
            .api
            .json(&api, &json!({ "seq": target }), deadline)
            .await?;
        // And again: a lease this instance took while the reset was on its way was
        // delivered before it, and may be pending again now.
        inner.end_leases(&name).await;
        // Moved forward, it no longer keeps what it skipped.
        inner.sweeper.mark(&self.entry.name);
        inner.stats_cache.invalidate();
        Ok(Some(if reply.reset_seq == 0 {
            target
        } else {
            reply.reset_seq
        }))
    }
}

impl Inner {
    /// The leases this instance holds on `consumer` end (see [`super::leases::Leases::end_consumer`]);
    /// their records in the instances' stream lose them.
    pub(super) async fn end_leases(&self, consumer: &str) {
        for (record, reply) in self.leases.end_consumer(consumer) {
            record.ended(&self.api, &[&reply]).await;
        }
    }

    /// Before a reader is moved: the instance's records that still list leases no
    /// longer open (confirmed ones) are written again without them
    /// (`Record::refresh`: after a move such a line's -NAK could land on a new
    /// delivery). Concurrently, and no longer than `deadline`.
    pub(super) async fn refresh_records(&self, deadline: tokio::time::Instant) {
        let stale = self.leases.stale_records();
        let refreshes = stale.iter().map(|r| r.refresh(&self.api));
        let _ = tokio::time::timeout_at(deadline, futures_util::future::join_all(refreshes)).await;
    }
}

/// The sequence `to` names on one subject, within its [`bounds`].
async fn target(
    inner: &Inner,
    queue: &str,
    to: SeekTo,
    deadline: tokio::time::Instant,
) -> Result<u64> {
    let subject = inner.layout.subject(queue);
    let subject = subject.as_str();
    let (oldest, next) = bounds(inner, queue, deadline).await?;
    let seq = match to {
        SeekTo::Seq(seq) => seq,
        SeekTo::Time(ms) => first_at(inner, subject, ms, deadline)
            .await?
            .unwrap_or(next),
        SeekTo::End => next,
    };
    Ok(seq.clamp(oldest, next))
}

/// `(oldest, next)` of one queue; see [`Queue::bounds`]. The oldest is the first
/// message some reader still keeps (after the lowest ack floor of its readers): below
/// it every reader confirmed, and a sweep may remove it at any moment, so a reader
/// moved there could be promised items that are gone a moment later.
async fn bounds(inner: &Inner, queue: &str, deadline: tokio::time::Instant) -> Result<(u64, u64)> {
    let Start::At(next) = inner.start_after_newest(deadline).await? else {
        return Err(unexpected("the stream's last sequence is unknown"));
    };
    let kept_from = inner.kept_from(queue, deadline).await?;
    let subject = inner.layout.subject(queue);
    let query = json!({ "seq": kept_from, "next_by_subj": subject });
    let oldest = leader_get(inner, &query, deadline).await?.unwrap_or(next);
    Ok((oldest, next.max(oldest)))
}

/// The sequence of the subject's first message stored at `ms` or later.
async fn first_at(
    inner: &Inner,
    subject: &str,
    ms: u64,
    deadline: tokio::time::Instant,
) -> Result<Option<u64>> {
    // A time past what RFC 3339 writes (the year 9999): every message is older.
    let Ok(start_time) = rfc3339(ms) else {
        return Ok(None);
    };
    let query = json!({ "start_time": start_time, "next_by_subj": subject });
    leader_get(inner, &query, deadline).await
}

/// The sequence of the message `query` names, as the stream's leader has it
/// (`STREAM.MSG.GET`, not a Direct Get, which a replica behind could answer with
/// "none" for a message just stored: a move to a time would then skip it).
async fn leader_get(
    inner: &Inner,
    query: &serde_json::Value,
    deadline: tokio::time::Instant,
) -> Result<Option<u64>> {
    let api = format!("STREAM.MSG.GET.{}", inner.layout.stream);
    match inner
        .api
        .json_or_api_error::<MsgGet>(&api, query, deadline)
        .await?
    {
        Ok(got) if got.message.seq > 0 => Ok(Some(got.message.seq)),
        Ok(_) => Err(unexpected("a message get without a sequence")),
        Err(e) if e.err_code == code::NO_MESSAGE_FOUND => Ok(None),
        Err(e) => Err(e.to_error()),
    }
}
