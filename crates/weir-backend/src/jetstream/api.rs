//! Requests to the cluster, with the retry rule the retried calls share.
//!
//! Everything weir asks JetStream is a core NATS request: the JetStream API
//! (`$JS.API.…`, JSON in and out), a publish awaiting its PubAck, a pull
//! (`CONSUMER.MSG.NEXT`), a double ack to a message's reply subject, a Direct Get.
//! [`Api::send`] makes one attempt, bounded in time as a whole (the client's own
//! request timeout does not cover a send that waits for room in its command channel
//! while it reconnects), and refuses at once, without sending, while the client is
//! not connected and the link has been down for `unavailable_retry_ms` or longer.
//! A call that retries spaces its attempts with [`Backoff`]: `BACKOFF_FIRST`
//! (50 ms), doubled after each pause up to `BACKOFF_MAX` (250 ms), until the
//! deadline its caller gives: most give [`Api::deadline`], `unavailable_retry_ms`
//! from the start of the call; the instances' upkeep gives one request timeout (what
//! fails is tried again on its next round) and a lease's record at most 500 ms
//! (`instances.rs`); a release's `-NAK` is retried while nobody receives it and the
//! lease surely lasts, at most 15 s (`leases.rs`). [`Api::json`] is the JetStream
//! API on top: it retries what failed for the moment and maps the rest through
//! [`super::errors`].
//!
//! The API is spoken directly (the request subjects and JSON bodies are NATS's
//! documented wire API) rather than through async-nats' typed helpers, so that every
//! call has the same retry loop and the same error mapping, and the replies are read
//! leniently (`#[serde(default)]` structs of only the fields weir uses).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::{Client, Message, Request, RequestErrorKind};
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use tokio::time::Instant;

use super::errors::{unavailable, unexpected, ApiError};
use super::metrics::Metrics;
use crate::error::{Error, Kind, Result};

/// The first pause between two attempts; it doubles up to [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
/// The longest pause: a request retried through a leader election reaches the new
/// leader at most this long after it is elected (attempts fail fast meanwhile, with
/// "no responders").
const BACKOFF_MAX: Duration = Duration::from_millis(250);

/// What one attempt got.
pub(crate) enum Sent {
    /// A reply (its status, if any, is the caller's to read).
    Reply(Message),
    /// Nobody listens on the subject: no leader (an election), no such consumer, no
    /// stream for the subject.
    NoResponders,
    /// Timed out or not sent (disconnected): nothing is known.
    Failed(String),
    /// Refused by the client itself (too large, a bad subject): retrying cannot help.
    Refused(Error),
}

/// Pauses between the attempts of one call, until its deadline.
pub(crate) struct Backoff {
    deadline: Instant,
    delay: Duration,
}

impl Backoff {
    pub fn new(deadline: Instant) -> Backoff {
        Backoff {
            deadline,
            delay: BACKOFF_FIRST,
        }
    }

    /// Sleeps before the next attempt; false when the deadline has passed.
    pub async fn pause(&mut self, metrics: &Metrics) -> bool {
        let now = Instant::now();
        if now >= self.deadline {
            return false;
        }
        tokio::time::sleep(self.delay.min(self.deadline - now)).await;
        self.delay = (self.delay * 2).min(BACKOFF_MAX);
        metrics.retried();
        true
    }
}

/// The client, with the timeouts of one attempt and of one call.
#[derive(Clone)]
pub(crate) struct Api {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    /// One attempt.
    pub request_timeout: Duration,
    /// One call, retries included.
    pub retry_for: Duration,
    /// Whether the server this instance is connected to still gets answers.
    pub health: Arc<Health>,
    /// `<subject_prefix>.`: publishes to queues count for [`Health`].
    pub queue_subjects: Arc<str>,
    /// `<stream>_`: the instances' stream and the maps' (`<stream>_DOORS`,
    /// `<stream>_MAP_*`), whose requests do not count for [`Health`].
    pub side_streams: Arc<str>,
}

/// How long the requests through the connected server have gone unanswered: a server
/// that answers pings but cannot reach the rest of the cluster (cut off from its
/// peers) keeps the client connected while every request fails. See
/// [`super::failover::failover_watch`].
pub(crate) struct Health {
    epoch: std::time::Instant,
    /// [`Health::now_ms`] at the first failure since the last answer; 0: answered.
    failing_since_ms: AtomicU64,
    /// [`Health::now_ms`] at the latest failure.
    failed_at_ms: AtomicU64,
    /// [`Health::now_ms`] since the link to NATS has been down; 0: connected.
    down_since_ms: AtomicU64,
    /// [`Health::now_ms`] when a stall was last logged, and stalls since not logged.
    stall_logged_ms: AtomicU64,
    stalls_unlogged: AtomicU64,
    /// The servers the failover watch left lately, which reconnections do not pick
    /// ([`super::left::Left`]).
    pub(super) left: std::sync::Mutex<super::left::Left>,
}

/// At most one stall line per this long (a partition stalls every call).
const STALL_LOG_EVERY_MS: u64 = 10_000;

impl Default for Health {
    fn default() -> Self {
        Health {
            epoch: std::time::Instant::now(),
            failing_since_ms: AtomicU64::new(0),
            failed_at_ms: AtomicU64::new(0),
            stall_logged_ms: AtomicU64::new(0),
            stalls_unlogged: AtomicU64::new(0),
            down_since_ms: AtomicU64::new(0),
            left: std::sync::Mutex::new(super::left::Left::default()),
        }
    }
}

impl Health {
    /// Ms since `epoch`, plus one (0 stands for "answered").
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }

    /// A request got an answer.
    pub fn answered(&self) {
        if self.failing_since_ms.load(Ordering::Relaxed) != 0 {
            self.failing_since_ms.store(0, Ordering::Relaxed);
        }
    }

    /// A request got no answer (a timeout, no responders, a JetStream error of the
    /// moment).
    pub fn failed(&self) {
        let now = self.now_ms();
        self.failed_at_ms.store(now, Ordering::Relaxed);
        let _ =
            self.failing_since_ms
                .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The client lost its connection, or failed to make one.
    pub fn link_down(&self) {
        let now = self.now_ms();
        let _ = self
            .down_since_ms
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The client is connected.
    pub fn link_up(&self) {
        self.down_since_ms.store(0, Ordering::Relaxed);
    }

    /// How long the link has been down, when it has for at least `known`: calls
    /// then fail at once instead of each waiting `unavailable_retry_ms` for a
    /// connection that did not come within the last one.
    pub fn known_down(&self, known: Duration) -> Option<Duration> {
        let since = self.down_since_ms.load(Ordering::Relaxed);
        if since == 0 {
            return None;
        }
        let down = Duration::from_millis(self.now_ms().saturating_sub(since));
        (down >= known).then_some(down)
    }

    /// A call waited a whole attempt for a reply that never came (a lost reply, a
    /// server or leader gone): logged, at most once every [`STALL_LOG_EVERY_MS`].
    pub fn stalled(&self, api: &str, waited: Duration) {
        let now = self.now_ms();
        let last = self.stall_logged_ms.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < STALL_LOG_EVERY_MS {
            self.stalls_unlogged.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if self
            .stall_logged_ms
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            self.stalls_unlogged.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let unlogged = self.stalls_unlogged.swap(0, Ordering::Relaxed);
        tracing::warn!(
            api,
            waited_ms = waited.as_millis(),
            others_since_last_line = unlogged,
            "jetstream: no reply within the request timeout; retrying"
        );
    }

    /// How long requests have failed with none answered, when one failed within
    /// `recent` (an instance that stopped asking is not stuck); zero otherwise.
    pub fn failing_for(&self, recent: Duration) -> Duration {
        let since = self.failing_since_ms.load(Ordering::Relaxed);
        let now = self.now_ms();
        let last = self.failed_at_ms.load(Ordering::Relaxed);
        let recent_ms = u64::try_from(recent.as_millis()).unwrap_or(u64::MAX);
        if since == 0 || now.saturating_sub(last) > recent_ms {
            return Duration::ZERO;
        }
        Duration::from_millis(now.saturating_sub(since))
    }
}

/// Whether a reply is a JetStream error of the moment (see
/// [`ApiError::is_transient`]): JetStream's own "temporarily unavailable", which a
/// server cut off from its peers answers to everything. A lasting refusal (the
/// stream full) is an answer. Only short JSON replies naming an error are parsed.
fn is_error_of_the_moment(payload: &[u8]) -> bool {
    const MARK: &[u8] = b"\"error\"";
    if payload.len() >= 1024
        || !payload.starts_with(b"{")
        || !payload.windows(MARK.len()).any(|w| w == MARK)
    {
        return false;
    }
    #[derive(Deserialize)]
    struct Refused {
        error: ApiError,
    }
    serde_json::from_slice::<Refused>(payload).is_ok_and(|r| r.error.is_transient())
}

/// `{"error": …}` or the reply proper.
#[derive(Deserialize)]
#[serde(untagged)]
enum Response<T> {
    Err { error: ApiError },
    Ok(T),
}

impl Api {
    /// The deadline of a call starting now.
    pub fn deadline(&self) -> Instant {
        Instant::now() + self.retry_for
    }

    /// One attempt, within the request timeout and the call's deadline.
    pub async fn send(&self, subject: String, request: Request, deadline: Instant) -> Sent {
        if let Some(down) = self.health.known_down(self.retry_for) {
            // The client's own state decides: an event that marked the link down
            // (a client error while connected) must not refuse calls that can go.
            if self.client.connection_state() == async_nats::connection::State::Connected {
                self.health.link_up();
            } else {
                return Sent::Refused(unavailable(format!(
                    "not connected to NATS for {} s",
                    down.as_secs()
                )));
            }
        }
        let budget = deadline
            .saturating_duration_since(Instant::now())
            .min(self.request_timeout)
            .max(Duration::from_millis(20));
        let request = request.timeout(Some(budget));
        let counted = self.tells_health(&subject);
        let sent = self.client.send_request(subject, request);
        let sent = match tokio::time::timeout(budget + Duration::from_millis(10), sent).await {
            Err(_) => Sent::Failed(format!("no reply within {budget:?}")),
            Ok(Ok(message)) => Sent::Reply(message),
            Ok(Err(e)) => match e.kind() {
                RequestErrorKind::NoResponders => Sent::NoResponders,
                RequestErrorKind::MaxPayloadExceeded => {
                    Sent::Refused(Error::new(Kind::TooLarge, format!("jetstream: {e}")))
                }
                RequestErrorKind::InvalidSubject => {
                    Sent::Refused(Error::new(Kind::InvalidArgument, format!("jetstream: {e}")))
                }
                RequestErrorKind::TimedOut | RequestErrorKind::Other => Sent::Failed(e.to_string()),
            },
        };
        if counted {
            match &sent {
                Sent::Reply(m) if !is_error_of_the_moment(&m.payload) => self.health.answered(),
                Sent::Refused(_) => {}
                _ => self.health.failed(),
            }
        }
        sent
    }

    /// Whether an attempt on `subject` says if the connected server can serve this
    /// instance: the JetStream API on the queues' stream, acks and publishes to queues do
    /// (they need the cluster); a Direct Get does not (any replica answers from its
    /// own copy, a server cut off from its peers too), nor do the instances' pings, their
    /// stream's and the maps' requests (an instance runs those on its own, every 250 ms,
    /// and a server cut off from its peers was seen to keep answering them).
    fn tells_health(&self, subject: &str) -> bool {
        let Some(api) = subject.strip_prefix("$JS.API.") else {
            return subject.starts_with("$JS.ACK.") || subject.starts_with(&*self.queue_subjects);
        };
        !api.starts_with("DIRECT.GET.") && !api.contains(&*self.side_streams)
    }

    /// Publishes without waiting for anything (acks, naks, progress), within a
    /// bound: while the client reconnects its command channel may be full.
    pub async fn publish(&self, subject: String, payload: &'static [u8]) -> bool {
        let sent = self.client.publish(subject, Bytes::from_static(payload));
        matches!(
            tokio::time::timeout(self.request_timeout, sent).await,
            Ok(Ok(()))
        )
    }

    /// A JetStream API call (`api` without the `$JS.API.` prefix), retried through
    /// failures of the moment until `deadline`.
    pub async fn json<T: DeserializeOwned>(
        &self,
        api: &str,
        body: &serde_json::Value,
        deadline: Instant,
    ) -> Result<T> {
        self.json_or_api_error(api, body, deadline)
            .await?
            .map_err(|e| e.to_error())
    }

    /// [`Api::json`], with the API's own refusal apart, for callers that answer some
    /// of its codes themselves.
    pub async fn json_or_api_error<T: DeserializeOwned>(
        &self,
        api: &str,
        body: &serde_json::Value,
        deadline: Instant,
    ) -> Result<std::result::Result<T, ApiError>> {
        let subject = format!("$JS.API.{api}");
        let payload = Bytes::from(body.to_string());
        let mut backoff = Backoff::new(deadline);
        loop {
            let request = Request::new().payload(payload.clone());
            let started = Instant::now();
            let why = match self.send(subject.clone(), request, deadline).await {
                Sent::Reply(message) => match parse::<T>(&message.payload)? {
                    Response::Ok(value) => return Ok(Ok(value)),
                    Response::Err { error } if error.is_transient() => error.description,
                    Response::Err { error } => return Ok(Err(error)),
                },
                Sent::NoResponders => "no responders (is JetStream up, with a leader?)".to_owned(),
                Sent::Failed(why) => {
                    // A lost reply while connected; not connected, every call
                    // waits (the link's own log line says why).
                    let waited = started.elapsed();
                    let connected =
                        self.client.connection_state() == async_nats::connection::State::Connected;
                    if waited >= self.request_timeout && connected {
                        self.health.stalled(api, waited);
                    }
                    why
                }
                Sent::Refused(e) => return Err(e),
            };
            if !backoff.pause(&self.metrics).await {
                return Err(unavailable(format!("{api}: {why}")));
            }
        }
    }

    /// Creates the stream `name` with `config`, or, when a stream of that name exists,
    /// updates it to `config`. True when it was created.
    pub async fn create_or_update_stream(
        &self,
        name: &str,
        config: &serde_json::Value,
        deadline: Instant,
    ) -> Result<bool> {
        let created = self
            .json_or_api_error::<serde_json::Value>(
                &format!("STREAM.CREATE.{name}"),
                config,
                deadline,
            )
            .await?;
        match created {
            Ok(_) => Ok(true),
            Err(e) if e.err_code == super::errors::code::STREAM_NAME_IN_USE => {
                let updated = self
                    .json::<serde_json::Value>(&format!("STREAM.UPDATE.{name}"), config, deadline)
                    .await;
                updated.map(|_| false).map_err(|e| {
                    let why =
                        format!("stream {name} exists and cannot be updated to weir's layout: {e}");
                    Error::new(e.kind(), why)
                })
            }
            Err(e) => {
                let e = e.to_error();
                Err(Error::new(e.kind(), format!("creating stream {name}: {e}")))
            }
        }
    }
}

/// What one Direct Get attempt got.
pub(crate) enum Got {
    Found(Message),
    /// No such message.
    Nothing,
    /// Failed for the moment (why): worth another attempt.
    Retry(String),
}

impl Api {
    /// One Direct Get on `stream` (any replica may answer) of the message `query`
    /// names (`{"seq", "next_by_subj"}`, `{"last_by_subj"}`).
    pub async fn direct_get_once(
        &self,
        stream: &str,
        query: &serde_json::Value,
        deadline: Instant,
    ) -> Result<Got> {
        let subject = format!("$JS.API.DIRECT.GET.{stream}");
        let request = Request::new().payload(Bytes::from(query.to_string()));
        Ok(match self.send(subject, request, deadline).await {
            Sent::Reply(m) => match m.status.map(|s| s.as_u16()) {
                None => Got::Found(m),
                Some(404) => Got::Nothing,
                Some(s) if s >= 500 => Got::Retry(format!("status {s}")),
                Some(s) => {
                    let why = format!("direct get on {stream}: status {s} {:?}", m.description);
                    return Err(unexpected(why));
                }
            },
            Sent::NoResponders => Got::Retry("no responders".to_owned()),
            Sent::Failed(why) => Got::Retry(why),
            Sent::Refused(e) => return Err(e),
        })
    }

    /// [`Api::direct_get_once`], retried through failures of the moment until
    /// `deadline`; `None` when there is no such message.
    pub async fn direct_get(
        &self,
        stream: &str,
        query: &serde_json::Value,
        deadline: Instant,
    ) -> Result<Option<Message>> {
        let mut backoff = Backoff::new(deadline);
        loop {
            let why = match self.direct_get_once(stream, query, deadline).await? {
                Got::Found(m) => return Ok(Some(m)),
                Got::Nothing => return Ok(None),
                Got::Retry(why) => why,
            };
            if !backoff.pause(&self.metrics).await {
                return Err(unavailable(format!("direct get on {stream}: {why}")));
            }
        }
    }
}

/// A JSON reply, or its `error`.
fn parse<T: DeserializeOwned>(payload: &[u8]) -> Result<Response<T>> {
    serde_json::from_slice(payload).map_err(|e| {
        let text = String::from_utf8_lossy(&payload[..payload.len().min(200)]).into_owned();
        unexpected(format!("{e}: {text}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_of_the_moment_are_told_from_answers() {
        let unavailable = br#"{"type":"io.nats.jetstream.api.v1.consumer_info_response","error":{"code":503,"err_code":10008,"description":"JetStream system temporarily unavailable"}}"#;
        assert!(is_error_of_the_moment(unavailable));
        // A lasting refusal (the stream full) is an answer.
        assert!(!is_error_of_the_moment(
            br#"{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}"#
        ));
        assert!(is_error_of_the_moment(
            br#"{"error":{"code":409,"err_code":10158,"description":"duplicate message id is in process"}}"#
        ));
        assert!(!is_error_of_the_moment(
            br#"{"error":{"code":404,"err_code":10014,"description":"consumer not found"}}"#
        ));
        assert!(!is_error_of_the_moment(br#"{"stream":"S","seq":4}"#));
        assert!(!is_error_of_the_moment(b""));
        let mut long = br#"{"error":{"code":503}"#.to_vec();
        long.resize(2048, b' ');
        assert!(!is_error_of_the_moment(&long), "long replies are answers");
    }

    #[test]
    fn health_counts_from_the_first_failure_since_an_answer() {
        let h = Health::default();
        let recent = Duration::from_secs(60);
        assert_eq!(h.failing_for(recent), Duration::ZERO);
        h.failed();
        std::thread::sleep(Duration::from_millis(30));
        h.failed();
        assert!(h.failing_for(recent) >= Duration::from_millis(30));
        // No failure within the last 10 ms: an instance that stopped asking is not stuck.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(h.failing_for(Duration::from_millis(10)), Duration::ZERO);
        h.answered();
        assert_eq!(h.failing_for(recent), Duration::ZERO);
    }
}
