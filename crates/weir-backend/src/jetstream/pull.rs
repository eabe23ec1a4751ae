//! Waiting for an item: a long poll on the reader's consumer.
//!
//! A `get …/t=MS` becomes pull requests (`{"batch":1,"expires":…}` to
//! `CONSUMER.MSG.NEXT`, replies to an inbox of its own) of at most [`CHUNK_MAX`]
//! each, until an item comes or the wait is over. A pull of 10 s or more asks for
//! idle heartbeats, so a pull lost with a connection is noticed and made again
//! rather than waited out.
//!
//! Dropping the wait (the client went away, or a `monitor` ended) must take nothing.
//! The server may already have delivered to the inbox, or do so before the pull
//! expires; so an abandoned pull's subscription goes to a reaper task on the
//! backend's runtime, which gives back (`-NAK`) whatever arrives until the pull's
//! expiry, then unsubscribes. Reapers are as many as abandoned waits, each at most
//! [`CHUNK_MAX`] (plus a grace) long.

use std::time::Duration;

use async_nats::{Message, Subscriber};
use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::json;
use tokio::time::Instant;

use super::api::Api;
use super::errors::{not_found, unavailable};
use super::handles::Reader;
use super::layout::nanos;
use crate::error::Result;

/// The longest single pull.
const CHUNK_MAX: Duration = Duration::from_secs(30);
/// Pulls this long or longer ask for heartbeats, every [`HEARTBEAT`].
const HEARTBEAT_FROM: Duration = Duration::from_secs(10);
const HEARTBEAT: Duration = Duration::from_secs(5);
/// Beyond a pull's expiry, how long its reply may still take.
const GRACE: Duration = Duration::from_secs(1);
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// What a reply to a pull says.
pub(crate) enum Pulled {
    Item,
    /// None now (404), or the pull expired (408).
    Nothing,
    /// The consumer was deleted.
    Gone,
    Heartbeat,
    /// The pull ended without an item for a reason of the moment (a leader change,
    /// too many waiting pulls, no responders).
    Retry(String),
}

pub(crate) fn classify(m: &Message) -> Pulled {
    let description = m.description.as_deref().unwrap_or("");
    match m.status.map(|s| s.as_u16()) {
        None if m
            .reply
            .as_ref()
            .is_some_and(|r| r.as_str().starts_with("$JS.ACK.")) =>
        {
            Pulled::Item
        }
        None => Pulled::Retry("a reply that is not a delivery".to_owned()),
        Some(100) => Pulled::Heartbeat,
        Some(404 | 408) => Pulled::Nothing,
        Some(409) if description.contains("Consumer Deleted") => Pulled::Gone,
        Some(status) => Pulled::Retry(format!("status {status} {description}")),
    }
}

/// What one pull came to.
enum Step {
    Item(Message),
    Expired,
    Failed(String),
}

/// The next message, waiting until `until` at most.
pub(crate) async fn next_until(reader: &Reader, until: Instant) -> Result<Option<Message>> {
    let api = &reader.inner.api;
    let mut failing_since: Option<Instant> = None;
    let mut delay = BACKOFF_FIRST;
    let mut checked = false;
    loop {
        let now = Instant::now();
        if now >= until {
            return Ok(None);
        }
        let why = match one_pull(reader, (until - now).min(CHUNK_MAX)).await? {
            Step::Item(m) => return Ok(Some(m)),
            Step::Expired => {
                failing_since = None;
                continue;
            }
            Step::Failed(why) => why,
        };
        if why.starts_with("status 503") && !checked {
            checked = true;
            let deadline = api.deadline();
            if reader
                .inner
                .consumer_gone(&reader.entry.consumer, deadline)
                .await?
            {
                return Err(not_found(format!("reader {}", reader.entry.consumer)));
            }
        }
        let since = *failing_since.get_or_insert(now);
        if since.elapsed() >= api.retry_for {
            return Err(unavailable(format!(
                "waiting on {}: {why}",
                reader.entry.consumer
            )));
        }
        tokio::time::sleep(delay.min(until.saturating_duration_since(Instant::now()))).await;
        delay = (delay * 2).min(BACKOFF_MAX);
        api.metrics.retried();
    }
}

/// One pull request of `chunk`, and its outcome.
async fn one_pull(reader: &Reader, chunk: Duration) -> Result<Step> {
    let api = &reader.inner.api;
    let inbox = api.client.new_inbox();
    let sub = match tokio::time::timeout(api.request_timeout, api.client.subscribe(inbox.clone()))
        .await
    {
        Ok(Ok(sub)) => sub,
        Ok(Err(e)) => return Ok(Step::Failed(e.to_string())),
        Err(_) => return Ok(Step::Failed("subscribing timed out".to_owned())),
    };
    let mut pull = Abandoned {
        sub: Some(sub),
        until: Instant::now() + chunk + GRACE,
        api: api.clone(),
        runtime: reader.inner.runtime.clone(),
    };
    let heartbeat = (chunk >= HEARTBEAT_FROM).then_some(HEARTBEAT);
    let mut body = json!({"batch": 1, "expires": nanos(chunk)});
    if let Some(hb) = heartbeat {
        body["idle_heartbeat"] = json!(nanos(hb));
    }
    let request = api.client.publish_with_reply(
        reader.entry.next_subject.to_string(),
        inbox,
        Bytes::from(body.to_string()),
    );
    match tokio::time::timeout(api.request_timeout, request).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Ok(Step::Failed(e.to_string())),
        Err(_) => return Ok(Step::Failed("sending the pull timed out".to_owned())),
    }
    let silence = heartbeat.map_or(chunk, |hb| hb * 2) + GRACE;
    loop {
        let Some(sub) = pull.sub.as_mut() else {
            return Ok(Step::Failed("no subscription".to_owned()));
        };
        let message = match tokio::time::timeout(silence, sub.next()).await {
            Ok(Some(message)) => message,
            Ok(None) => return Ok(Step::Failed("the subscription ended".to_owned())),
            Err(_) => return Ok(Step::Failed("the pull went silent".to_owned())),
        };
        let step = match classify(&message) {
            Pulled::Heartbeat => continue,
            Pulled::Item => Step::Item(message),
            Pulled::Nothing => Step::Expired,
            Pulled::Retry(why) => Step::Failed(why),
            Pulled::Gone => {
                pull.finish();
                return Err(not_found(format!("reader {}", reader.entry.consumer)));
            }
        };
        pull.finish();
        return Ok(step);
    }
}

/// A pull's subscription: handed to a reaper when dropped before the pull finished.
struct Abandoned {
    sub: Option<Subscriber>,
    until: Instant,
    api: Api,
    runtime: tokio::runtime::Handle,
}

impl Abandoned {
    /// The pull is over: nothing more can arrive for it.
    fn finish(&mut self) {
        self.sub = None;
    }
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        if let Some(sub) = self.sub.take() {
            self.runtime.spawn(reap(sub, self.until, self.api.clone()));
        }
    }
}

/// Gives back what an abandoned pull receives, until it expires.
async fn reap(mut sub: Subscriber, until: Instant, api: Api) {
    while let Ok(Some(message)) = tokio::time::timeout_at(until, sub.next()).await {
        match classify(&message) {
            Pulled::Item => {
                if let Some(reply) = &message.reply {
                    api.publish(reply.to_string(), b"-NAK").await;
                }
            }
            Pulled::Heartbeat => {}
            _ => return,
        }
    }
}
