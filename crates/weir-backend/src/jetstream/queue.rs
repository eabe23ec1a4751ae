//! Appending: one publish per item, answered once the cluster's PubAck says it is
//! stored on a quorum.
//!
//! Each publish carries a `Nats-Msg-Id` unique to this instance and append, so that a
//! retry after a lost PubAck (a timeout, a leader election, a reconnection) is stored
//! once: JetStream answers a duplicate within the stream's duplicate window with the
//! first one's sequence. Retries go on until `unavailable_retry_ms`, then the instance
//! answers `backend unavailable` (the item may or may not be stored, as any timed-out
//! write). Item flags and expiry travel as headers (`Weir-Flags`, `Weir-Expires` in
//! Unix ms); an expiring item also gets a `Nats-TTL` so the server reclaims it.

use std::sync::atomic::Ordering;

use async_nats::{HeaderMap, Request};
use bytes::Bytes;
use weir_types::AppendOptions;

use super::api::{Backoff, Sent};
use super::errors::{code, not_found, unavailable, unexpected};
use super::inner::Inner;
use super::pub_ack::PubAck;
use super::registry::QueueEntry;
use crate::error::{Error, Kind, Result};

pub(crate) const FLAGS_HEADER: &str = "Weir-Flags";
/// The longest one publish attempt waits for its PubAck before trying again.
const ATTEMPT_WAIT: std::time::Duration = std::time::Duration::from_millis(1_000);
pub(crate) const EXPIRES_HEADER: &str = "Weir-Expires";
/// A job's id, priority, ttr and due time (`AppendOptions::job`): `ID PRIORITY TTR DUE`.
pub(crate) const JOB_HEADER: &str = "Weir-Job";

/// The job a message's headers carry, if any (a malformed header reads as none).
pub(crate) fn job_of(headers: Option<&async_nats::HeaderMap>) -> Option<weir_types::JobMeta> {
    let value = headers?.get(JOB_HEADER)?;
    let mut parts = value.as_str().split(' ').map(str::parse::<u64>);
    let (id, priority, ttr) = (
        parts.next()?.ok()?,
        parts.next()?.ok()?,
        parts.next()?.ok()?,
    );
    let due_ms = parts.next()?.ok()?;
    if parts.next().is_some() {
        return None;
    }
    Some(weir_types::JobMeta {
        id,
        priority: u32::try_from(priority).ok()?,
        ttr_s: u32::try_from(ttr).ok()?,
        due_ms,
    })
}

pub(crate) fn now_ms() -> u64 {
    weir_types::now_ms()
}

/// The expiry an item is stored with (Unix ms; 0 for never, as in every item): the
/// one rule of expiry (`weir_types::expiry_ms`, the engine's) for an item enqueued
/// `now` in a queue whose `max_age` is `max_age_ms` (0 for none).
fn expiry_ms(own: u64, max_age_ms: u64, now: u64) -> u64 {
    let max_age = (max_age_ms != 0).then(|| std::time::Duration::from_millis(max_age_ms));
    match weir_types::expiry_ms(own, now, max_age) {
        weir_types::NEVER => 0,
        at => at,
    }
}

pub(super) async fn append(
    inner: &Inner,
    queue: &QueueEntry,
    data: Bytes,
    options: AppendOptions,
) -> Result<u64> {
    if data.len() as u64 > queue.max_item_size() {
        return Err(too_large(data.len(), queue.max_item_size()));
    }
    let deadline = inner.api.deadline();
    inner.ready(deadline).await?;
    let now = now_ms();
    let expires = expiry_ms(options.expires_at_ms, queue.max_age_ms(), now);
    if expires != 0 && expires <= now {
        // Already expired: the engine stores it and never delivers it; here it is
        // not published at all.
        queue.appended.fetch_add(1, Ordering::Relaxed);
        return Ok(0);
    }
    let mut headers = headers(inner, options.flags, expires, now);
    if let Some(job) = options.job {
        headers.insert(
            JOB_HEADER,
            format!("{} {} {} {}", job.id, job.priority, job.ttr_s, job.due_ms),
        );
    }
    let wire = data.len() + header_bytes(&headers);
    let max_payload = inner.api.client.max_payload();
    if wire > max_payload {
        return Err(too_large(wire, max_payload as u64));
    }
    let seq = publish(inner, queue, headers, data, deadline).await?;
    queue.appended.fetch_add(1, Ordering::Relaxed);
    queue.appended_at_ms.store(now_ms(), Ordering::Relaxed);
    queue.appended_seq.fetch_max(seq, Ordering::Relaxed);
    Ok(seq)
}

fn too_large(size: usize, max: u64) -> Error {
    Error::new(
        Kind::TooLarge,
        format!(
            "item of {size} bytes, larger than the {max} the queue (or the NATS server) accepts"
        ),
    )
}

fn headers(inner: &Inner, flags: u32, expires: u64, now: u64) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("Nats-Msg-Id", msg_id(inner));
    if flags != 0 {
        headers.insert(FLAGS_HEADER, flags.to_string());
    }
    if expires != 0 {
        headers.insert(EXPIRES_HEADER, expires.to_string());
        let ttl_s = (expires - now).div_ceil(1000).max(1);
        headers.insert("Nats-TTL", format!("{ttl_s}s"));
    }
    headers
}

/// A message id no other publish of any instance has: this instance's id and a counter.
fn msg_id(inner: &Inner) -> String {
    let n = inner.published.fetch_add(1, Ordering::Relaxed);
    format!("{}.{n}", inner.instance_id)
}

/// The headers' size on the wire, about (`NATS/1.0\r\n`, `k: v\r\n` each, `\r\n`).
fn header_bytes(headers: &HeaderMap) -> usize {
    12 + headers
        .iter()
        .map(|(k, vs)| {
            let name: &str = k.as_ref();
            vs.iter()
                .map(|v| name.len() + v.as_str().len() + 4)
                .sum::<usize>()
        })
        .sum::<usize>()
}

/// Publishes until a PubAck, retrying with the same headers (so the same Msg-Id). A
/// retry answered "duplicate message id is in process" is retried too: the stream's
/// leader proposed the first attempt and has not applied it yet (it may still commit,
/// once a quorum answers; a change of leader clears the mark), so a new id could store
/// the item twice; past the deadline the outcome is unknown (`backend unavailable`).
pub(super) async fn publish(
    inner: &Inner,
    queue: &QueueEntry,
    headers: HeaderMap,
    data: Bytes,
    deadline: tokio::time::Instant,
) -> Result<u64> {
    let mut backoff = Backoff::new(deadline);
    let mut checked_stream = false;
    loop {
        let request = Request::new()
            .headers(headers.clone())
            .payload(data.clone());
        // One attempt waits at most ATTEMPT_WAIT: a PubAck lost in a leader change or
        // a reconnection would otherwise hold the set for a whole request timeout.
        // Retrying sooner is safe (the same Msg-Id is stored once).
        let attempt = deadline.min(tokio::time::Instant::now() + ATTEMPT_WAIT);
        let why = match inner
            .api
            .send(queue.subject.to_string(), request, attempt)
            .await
        {
            Sent::Reply(m) => match serde_json::from_slice::<PubAck>(&m.payload) {
                Ok(PubAck { error: None, seq }) if seq > 0 => return Ok(seq),
                Ok(PubAck { error: Some(e), .. }) if e.is_transient() => e.description,
                Ok(PubAck { error: Some(e), .. }) => return Err(e.to_error()),
                _ => return Err(unexpected(String::from_utf8_lossy(&m.payload))),
            },
            Sent::NoResponders => {
                // No stream leader (an election), or no stream at all (deleted by
                // hand): the latter is answered at once, so the instance makes the queue
                // again (and with it the stream) rather than lose the item.
                if !checked_stream {
                    checked_stream = true;
                    stream_exists(inner, deadline).await?;
                }
                "no responders (stream leader election?)".to_owned()
            }
            Sent::Failed(why) => why,
            Sent::Refused(e) => return Err(e),
        };
        if !backoff.pause(&inner.api.metrics).await {
            return Err(unavailable(format!(
                "publishing to {}: {why}",
                queue.subject
            )));
        }
    }
}

/// Ok when the stream exists or cannot be asked now; NotFound when it is gone.
async fn stream_exists(inner: &Inner, deadline: tokio::time::Instant) -> Result<()> {
    let api = format!("STREAM.INFO.{}", inner.layout.stream);
    let info = inner
        .api
        .json_or_api_error::<serde_json::Value>(&api, &serde_json::json!({}), deadline)
        .await;
    match info {
        Ok(Err(e)) if e.err_code == code::STREAM_NOT_FOUND => {
            inner.stream_lost();
            inner.registry.forget_all();
            Err(not_found(format!("stream {}", inner.layout.stream)))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_the_earlier() {
        assert_eq!(expiry_ms(0, 0, 1000), 0);
        assert_eq!(expiry_ms(5000, 0, 1000), 5000);
        assert_eq!(expiry_ms(0, 2000, 1000), 3000);
        assert_eq!(expiry_ms(5000, 2000, 1000), 3000);
        assert_eq!(expiry_ms(2500, 2000, 1000), 2500);
    }
}
