//! A walk over the items one queue keeps, without consuming anything: what
//! [`crate::Scan`] is on JetStream (capture exports read a capture queue with it).
//!
//! It needs no consumer: each step is a Direct Get of the queue's subject's next
//! message (`{"seq", "next_by_subj"}`; a walk from a time starts with
//! `{"start_time", "next_by_subj"}`), which any replica may answer. The walk ends at
//! the queue's last message when it began (a Direct Get `last_by_subj`), so a queue
//! appended to as fast as it is read still ends. It starts after what every reader
//! of the queue had confirmed when it began (their lowest ack floor: a sweep removes
//! that at any moment, `sweep.rs`); probes and expired items are left out. An item
//! confirmed by a reader out of order, while the items before it are not, is still
//! walked (it is kept, as it is on the engine), and so may be one confirmed by every
//! reader while the walk runs. Likewise the newest message, which ends the walk, is as a replica
//! knows it: one appended a moment before the walk began may be left out.
//! One request per item: an export of n items costs n round trips, fine for the
//! walks it serves (an operator's export), not for a hot path.

use std::sync::Arc;

use async_nats::{HeaderMap, Message};
use serde_json::json;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use weir_types::Item;

use super::errors::unexpected;
use super::handles::JetStream;
use super::inner::Inner;
use super::queue::{now_ms, EXPIRES_HEADER, FLAGS_HEADER};
use super::reader::header_u64;
use crate::error::Result;
use crate::position::ScanFrom;

/// Where a walk's next step starts.
#[derive(Clone, Copy)]
enum Next {
    /// The first step of a walk from a time: the first item appended at this Unix ms
    /// or later.
    Time(u64),
    Seq(u64),
    End,
}

/// A walk over one queue's kept items.
pub struct Scan {
    inner: Arc<Inner>,
    subject: String,
    next: Next,
    /// The last seq of the walk (0: nothing to walk).
    last: u64,
    /// Where what some reader keeps begins (see `Inner::kept_from`).
    kept_from: u64,
}

impl JetStream {
    /// Starts a walk over what `queue` keeps. A queue with nothing kept (or that does
    /// not exist: its subject has no message) gives an empty walk.
    pub async fn scan(&self, queue: &str, from: ScanFrom) -> Result<Scan> {
        weir_types::validate_queue_name(queue)?;
        let inner = &self.inner;
        let deadline = inner.api.deadline();
        inner.ready(deadline).await?;
        let subject = inner.layout.subject(queue);
        let query = json!({ "last_by_subj": &subject });
        let last = match inner
            .api
            .direct_get(&inner.layout.stream, &query, deadline)
            .await?
        {
            Some(message) => sequence(message.headers.as_ref())?,
            None => 0,
        };
        // What every reader confirmed is not kept, though a sweep may not have
        // removed it yet: the walk starts after it.
        let kept_from = inner.kept_from(queue, deadline).await?;
        let next = match (from, last) {
            (_, 0) => Next::End,
            (ScanFrom::Oldest, _) => Next::Seq(kept_from),
            // A time past what RFC 3339 writes (the year 9999): every item is older.
            (ScanFrom::Time(ms), _) if rfc3339(ms).is_err() => Next::End,
            (ScanFrom::Time(ms), _) => Next::Time(ms),
        };
        Ok(Scan {
            inner: Arc::clone(inner),
            subject,
            next,
            last,
            kept_from,
        })
    }
}

impl Scan {
    /// Up to `max` more items; empty once the walk has ended.
    pub async fn next_page(&mut self, max: usize) -> Result<Vec<Item>> {
        let mut page = Vec::new();
        while page.len() < max {
            // A deadline per item: one slow reply has the whole retry window.
            let deadline = self.inner.api.deadline();
            let subject = &self.subject;
            let query = match self.next {
                Next::End => break,
                Next::Seq(seq) if seq > self.last => break,
                Next::Seq(seq) => {
                    json!({"seq": seq.max(self.kept_from), "next_by_subj": subject})
                }
                Next::Time(ms) => {
                    json!({"start_time": rfc3339(ms)?, "next_by_subj": subject})
                }
            };
            let api = &self.inner.api;
            let Some(message) = api
                .direct_get(&self.inner.layout.stream, &query, deadline)
                .await?
            else {
                self.next = Next::End;
                break;
            };
            let probe = super::probe::is_probe(&message);
            let item = kept(message)?;
            self.next = Next::Seq(item.seq.saturating_add(1));
            let expired = item.expires_at_ms != 0 && item.expires_at_ms <= now_ms();
            if item.seq > self.last || item.seq < self.kept_from || probe || expired {
                continue;
            }
            page.push(item);
        }
        Ok(page)
    }
}

/// A Direct Get reply as an item, with its enqueue time (`Nats-Time-Stamp`).
fn kept(message: Message) -> Result<Item> {
    let headers = message.headers.as_ref();
    let seq = sequence(headers)?;
    let enqueued_at_ms = headers
        .and_then(|h| h.get("Nats-Time-Stamp"))
        .and_then(|v| OffsetDateTime::parse(v.as_str(), &Rfc3339).ok())
        .map_or(0, |t| {
            u64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(0)
        });
    Ok(Item {
        seq,
        flags: u32::try_from(header_u64(headers, FLAGS_HEADER)).unwrap_or(0),
        enqueued_at_ms,
        expires_at_ms: header_u64(headers, EXPIRES_HEADER),
        job: super::queue::job_of(headers),
        data: message.payload,
    })
}

/// A Direct Get reply's stream sequence (`Nats-Sequence`).
fn sequence(headers: Option<&HeaderMap>) -> Result<u64> {
    match header_u64(headers, "Nats-Sequence") {
        0 => Err(unexpected("a direct get reply without Nats-Sequence")),
        seq => Ok(seq),
    }
}

/// Unix ms as the RFC 3339 time a Direct Get's `start_time` wants.
pub(super) fn rfc3339(ms: u64) -> Result<String> {
    let nanos = i128::from(ms) * 1_000_000;
    OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .ok_or_else(|| unexpected(format!("time {ms} ms out of range")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_go_out_as_rfc3339_and_come_back() {
        assert_eq!(rfc3339(0).ok().as_deref(), Some("1970-01-01T00:00:00Z"));
        let text = rfc3339(1_764_169_200_123).unwrap_or_default();
        assert_eq!(text, "2025-11-26T15:00:00.123Z");
        let back = OffsetDateTime::parse(&text, &Rfc3339).map(|t| t.unix_timestamp_nanos());
        assert_eq!(back.ok(), Some(1_764_169_200_123_000_000));
    }
}
