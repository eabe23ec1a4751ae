//! The weir instances (processes) sharing a stream know each other, so that the open
//! leases of an instance that was killed come back to the other instances' clients at
//! once, not after AckWait.
//!
//! JetStream knows no connections: a lease is a delivered message that nobody acked,
//! and only AckWait ends it. An instance that closes gives its leases back itself (a
//! `-NAK` each); an instance that is killed cannot. So each instance leaves enough
//! behind for another instance to do it:
//!
//! - **A small stream of its own**, `<stream>_DOORS` (memory storage, one message per
//!   subject, the stream's replicas): the instance's registration
//!   `_weir.<stream>.rec.door.<key>`, and records of its open leases,
//!   `_weir.<stream>.rec.lease.<key>.<n>`, holding the lease's ack subject. The record
//!   is stored (PubAck) before the item is handed to the client. The leases handed
//!   out at the same moment share a record (one write); a release rewrites it
//!   without its lease, and when its last lease ends a tombstone (empty, `Nats-TTL:
//!   1s`) replaces it and then goes by itself ([`super::records`]).
//! - **A ping subject**, `_weir.<stream>.ping.<key>`, that the instance answers. The
//!   NATS server drops a connection's subscriptions the moment the connection ends (a
//!   killed process's socket is closed by its kernel), and a request to a subject
//!   nobody subscribes to is answered "no responders" at once.
//!
//! The stream and the registrations' subjects keep the names they had when an
//! instance was called a "door" (`_DOORS`, `rec.door`): they are shared with the
//! instances of an older version during a rolling upgrade, which must find each
//! other's registrations and records where they always were.
//!
//! Every instance pings every registered instance every quarter of
//! `instance_timeout_ms` (50 ms to 1 s). One that has had no responders for
//! `instance_timeout_ms` is dead: the first instance to mark its registration dead (a
//! publish that expects the registration's sequence, so exactly one instance wins)
//! sends `-NAK` for each of its recorded leases, and purges its records. Only an
//! instance that saw the dead one answer within half the lease timeout sends the
//! Naks: a lease is renewed every third of its AckWait, so it is still the dead
//! instance's then, where a later `-NAK` could take back an item that AckWait already
//! gave to someone else (JetStream's acks name the stream sequence, not the
//! delivery).
//!
//! An instance cut off from NATS for longer than `instance_timeout_ms` is taken for
//! dead too. When it is back it finds its registration marked dead: its leases were
//! given to other instances, so it stops renewing them, does not give them back again
//! when its clients abort (a confirm is still sent; the item is then delivered twice,
//! never lost), and registers again under a new key (`<id>.<epoch>`). So does an
//! instance that was disconnected for longer than half the lease timeout (its leases
//! may have timed out and gone to others, marked dead or not).
//!
//! What this does not cover (AckWait does, as before): an item an instance had pulled
//! for a plain `get` and not yet acked; a lease whose record could not be stored in
//! time (the instances' stream unavailable); an instance killed while no other
//! instance runs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::{HeaderMap, Request};
use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::json;
use tokio::time::Instant;

use super::api::{Api, Got, Sent};
use super::layout::StreamInfo;
use super::leases::{self, Leases};
use super::pub_ack::PubAck;
use super::records::{self, Batcher, Record, Stored, RECORD_TTL};
use crate::error::{Error, Kind, Result};
use crate::jetstream_config::{JetStreamConfig, INSTANCES_STREAM_BYTES_MIN};
use weir_types::now_ms;

/// Instances one instance keeps track of; more are not pinged (with a warning).
const INSTANCES_MAX: usize = 256;
/// A dead instance's registration, marked dead, stays at least this long (and twice the
/// lease timeout), so every instance sees it was taken care of, and an instance that was only
/// cut off sees it when it is back; then it goes.
const DEAD_TTL_MIN_S: u64 = 60;
/// Failed looks at its own registration in a row after which the instance sets the
/// instances' stream up again (it may be gone: deleted, or a restarted single server).
const SELF_FAILURES_MAX: u32 = 8;
/// `instance_timeout_ms` is capped at this (an hour).
const INSTANCE_TIMEOUT_MAX_MS: u64 = 3_600_000;
/// The longest a lease's record may hold up the lease: past it the lease goes out
/// unrecorded (it then comes back after AckWait if its instance is killed).
const RECORD_WAIT_MAX: Duration = Duration::from_millis(500);
/// A lease that expires by itself (`open_timeout`) this soon is not given back by
/// another instance: AckWait is about to.
const EXPIRY_MARGIN_MS: u64 = 250;
/// How often the instance list is read, in pings.
const LIST_EVERY: u32 = 4;
/// Requests at once when a dead instance's leases are given back.
const NAKS_AT_ONCE: usize = 16;

/// Where one instance is with another.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
enum Watch {
    /// Alive, or not yet known to be dead.
    #[default]
    Watching,
    /// This instance marked it dead and gave its leases back; its records are still to
    /// be purged.
    Purging,
    /// Taken care of (by this instance or another), or gone.
    Done,
}

/// What one instance knows of another.
#[derive(Default)]
struct Known {
    /// When it last answered a ping.
    alive_at: Option<Instant>,
    /// Since when its pings have had no responders (without an answer since).
    silent_since: Option<Instant>,
    watch: Watch,
}

pub(crate) struct Instances {
    api: Api,
    leases: Arc<Leases>,
    /// `<stream>_DOORS`.
    stream: String,
    /// `_weir.<stream>`.
    prefix: String,
    /// Unique per process and start.
    id: String,
    /// Bumped when this instance finds itself taken for dead.
    epoch: AtomicU64,
    registered: AtomicBool,
    /// A graceful shutdown has begun: the watch ends.
    closing: AtomicBool,
    /// The ping subscription is up (it survives reconnections).
    answering: AtomicBool,
    /// Gathers the leases recorded at once into one record.
    batcher: Batcher,
    timeout: Duration,
    lease_timeout: Duration,
    replicas: usize,
    /// The stream's `max_bytes` (`instances_stream_bytes`).
    stream_bytes: u64,
    warned: AtomicBool,
}

impl Instances {
    pub fn new(
        api: Api,
        leases: Arc<Leases>,
        stream: &str,
        id: &str,
        config: &JetStreamConfig,
    ) -> Instances {
        Instances {
            api,
            leases,
            stream: format!("{stream}_DOORS"),
            prefix: format!("_weir.{stream}"),
            id: id.to_owned(),
            epoch: AtomicU64::new(0),
            registered: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            answering: AtomicBool::new(false),
            batcher: Batcher::default(),
            timeout: Duration::from_millis(config.instance_timeout_ms.min(INSTANCE_TIMEOUT_MAX_MS)),
            lease_timeout: Duration::from_millis(config.lease_timeout_ms.max(1)),
            replicas: config.replicas,
            stream_bytes: config
                .instances_stream_bytes
                .max(INSTANCES_STREAM_BYTES_MIN),
            warned: AtomicBool::new(false),
        }
    }

    fn enabled(&self) -> bool {
        !self.timeout.is_zero()
    }

    /// `<id>.<epoch>`: this instance's name in subjects.
    fn key(&self) -> String {
        format!("{}.{}", self.id, self.epoch.load(Ordering::Acquire))
    }

    fn registration_subject(&self, key: &str) -> String {
        format!("{}.rec.door.{key}", self.prefix)
    }

    fn leases_filter(&self, key: &str) -> String {
        format!("{}.rec.lease.{key}.>", self.prefix)
    }

    /// Records an open lease (its ack subject, and when it expires by itself, 0 for a
    /// lease kept alive) before it is handed out; the record's subject, or `None`
    /// when it could not be stored in time (the lease then comes back after AckWait
    /// if this instance is killed).
    pub async fn record(&self, reply: &str, expires_at_ms: u64) -> Option<Arc<Record>> {
        if !self.enabled() || !self.registered.load(Ordering::Acquire) {
            return None;
        }
        let wait = self.api.request_timeout.min(RECORD_WAIT_MAX);
        let deadline = Instant::now() + wait;
        let key = self.key();
        let subject = |n: u64| format!("{}.rec.lease.{key}.{n}", self.prefix);
        // Each write its own time (a waiter may write others' records).
        let write = |record: Arc<Record>, body: String| async move {
            let deadline = Instant::now() + wait;
            let mut headers = HeaderMap::new();
            headers.insert("Nats-TTL", RECORD_TTL);
            let request = Request::new().headers(headers).payload(Bytes::from(body));
            let sent = self
                .api
                .send(record.subject().to_owned(), request, deadline)
                .await;
            // No reply in time: it may be stored all the same, so it is tombstoned
            // when its leases end, like a stored one.
            Stored::from_sent(&sent)
        };
        let record = self
            .batcher
            .record(reply, expires_at_ms, subject, deadline, write)
            .await;
        if record.is_none() && !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                stream = %self.stream,
                "jetstream: a lease's record was not stored; such leases come back after AckWait if this instance is killed"
            );
        }
        record
    }

    /// Keeps the registration current and watches the other instances, until
    /// `instances` is dropped. Does nothing when `instance_timeout_ms` is 0.
    pub async fn run(instances: std::sync::Weak<Instances>) {
        let mut known: HashMap<String, Known> = HashMap::new();
        let mut round: u32 = 0;
        let mut warned = false;
        let mut failures: u32 = 0;
        let mut connected_at = Instant::now();
        loop {
            let Some(this) = instances.upgrade() else {
                return;
            };
            if !this.enabled() || this.closing.load(Ordering::Acquire) {
                return;
            }
            let every = (this.timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
            this.after_cut_off(&mut connected_at);
            if this.registered.load(Ordering::Acquire) {
                if this.check_self().await.is_ok() {
                    failures = 0;
                } else {
                    failures += 1;
                    if failures >= SELF_FAILURES_MAX {
                        // Set the instances' stream up again (it may be gone).
                        this.registered.store(false, Ordering::Release);
                        failures = 0;
                    }
                }
                if round.is_multiple_of(LIST_EVERY) {
                    this.list(&mut known).await;
                }
                this.ping_all(&mut known).await;
                round = round.wrapping_add(1);
            } else if let Err(e) = this.register().await {
                // Once at warn (retried every round; leases go out unrecorded meanwhile).
                if std::mem::replace(&mut warned, true) {
                    tracing::debug!("jetstream: instance registration: {e}");
                } else {
                    tracing::warn!(
                        stream = %this.stream,
                        error = %e,
                        "jetstream: registering this instance failed; until it does, a killed instance's leases wait for AckWait"
                    );
                }
            }
            drop(this);
            tokio::time::sleep(every).await;
        }
    }

    /// Sets the instances' stream up, starts answering pings, and registers.
    async fn register(&self) -> Result<()> {
        let deadline = Instant::now() + self.api.request_timeout;
        let config = json!({
            "name": self.stream,
            "subjects": [format!("{}.rec.>", self.prefix)],
            "retention": "limits",
            "storage": "memory",
            "num_replicas": self.replicas,
            "allow_direct": true,
            "allow_msg_ttl": true,
            "max_msgs_per_subject": 1,
            "max_bytes": self.stream_bytes,
            "discard": "old",
        });
        self.api
            .create_or_update_stream(&self.stream, &config, deadline)
            .await?;
        if !self.answering.load(Ordering::Acquire) {
            self.answer_pings().await?;
            self.answering.store(true, Ordering::Release);
        }
        self.publish_registration(deadline).await?;
        self.registered.store(true, Ordering::Release);
        Ok(())
    }

    async fn answer_pings(&self) -> Result<()> {
        let subject = format!("{}.ping.{}.*", self.prefix, self.id);
        let mut pings = self
            .api
            .client
            .subscribe(subject)
            .await
            .map_err(|e| Error::new(Kind::Unavailable, format!("subscribing: {e}")))?;
        let client = self.api.client.clone();
        tokio::spawn(async move {
            while let Some(ping) = pings.next().await {
                if let Some(reply) = ping.reply {
                    let _ = client.publish(reply, Bytes::new()).await;
                }
            }
        });
        // The subscription is on the server before anyone is told to ping it.
        let _ = tokio::time::timeout(self.api.request_timeout, self.api.client.flush()).await;
        Ok(())
    }

    async fn publish_registration(&self, deadline: Instant) -> Result<()> {
        let subject = self.registration_subject(&self.key());
        let request = Request::new().payload(Bytes::from(format!("alive {}", now_ms())));
        match self.api.send(subject, request, deadline).await {
            Sent::Reply(m) if PubAck::stored(&m.payload) => Ok(()),
            _ => Err(Error::new(
                Kind::Unavailable,
                "the instances' stream did not store the registration",
            )),
        }
    }

    /// Whether another instance took this one for dead (it was cut off from NATS): then
    /// its leases are no longer its own, and it registers again under a new key.
    async fn check_self(&self) -> Result<()> {
        let key = self.key();
        let deadline = Instant::now() + self.api.request_timeout;
        match self
            .last(&self.registration_subject(&key), deadline)
            .await?
        {
            Some((_, payload)) if payload.starts_with(b"dead") => {
                self.lost_leases("other instances took it for dead (it was cut off from NATS)");
            }
            Some(_) => return Ok(()),
            // The registration is gone (the instances' stream lost it): register again.
            None => {}
        }
        self.publish_registration(deadline).await
    }

    /// Cut off from NATS for longer than half the lease timeout, an instance's leases may
    /// have timed out and gone to other clients, marked dead or not: lost.
    fn after_cut_off(&self, connected_at: &mut Instant) {
        let now = Instant::now();
        if self.api.client.connection_state() != async_nats::connection::State::Connected {
            return;
        }
        if now.duration_since(*connected_at) > self.lease_timeout / 2 {
            self.lost_leases("it was cut off from NATS for longer than half the lease timeout");
        }
        *connected_at = now;
    }

    /// This instance's leases are no longer its own: none is renewed or given back again,
    /// and it registers again under a new key.
    fn lost_leases(&self, why: &str) {
        let lost = self.leases.lose_all();
        let key = self.key();
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.registered.store(false, Ordering::Release);
        if lost > 0 {
            tracing::warn!(
                instance = %key,
                lost,
                why,
                "jetstream: this instance's open leases went back to the queues; none is renewed or given back again"
            );
        }
    }

    /// Learns the registered instances (other than this one).
    async fn list(&self, known: &mut HashMap<String, Known>) {
        let deadline = Instant::now() + self.api.request_timeout;
        let filter = format!("{}.rec.door.>", self.prefix);
        let Ok(subjects) = self.subjects(&filter, deadline).await else {
            return;
        };
        let strip = format!("{}.rec.door.", self.prefix);
        let mine = self.key();
        let listed: Vec<String> = subjects
            .into_iter()
            .filter_map(|s| s.strip_prefix(&strip).map(str::to_owned))
            .filter(|k| *k != mine)
            .collect();
        known.retain(|k, _| listed.contains(k));
        for key in listed {
            if known.len() >= INSTANCES_MAX && !known.contains_key(&key) {
                tracing::warn!(
                    max = INSTANCES_MAX,
                    "jetstream: too many weir instances to watch"
                );
                break;
            }
            known.entry(key).or_default();
        }
        // This instance never watches itself (it would find itself dead when its
        // ping subscription lags, and give its own leases back).
        debug_assert!(!known.contains_key(&mine), "an instance watching itself");
    }

    /// Pings every instance not yet taken care of; claims the ones silent for too long.
    async fn ping_all(&self, known: &mut HashMap<String, Known>) {
        let now = Instant::now();
        let mut dead = Vec::new();
        for (key, instance) in known.iter_mut() {
            if instance.watch == Watch::Purging {
                if self.purge(key).await.is_ok() {
                    instance.watch = Watch::Done;
                }
                continue;
            }
            if instance.watch == Watch::Done {
                continue;
            }
            let subject = format!("{}.ping.{key}", self.prefix);
            let request = Request::new().payload(Bytes::new());
            let wait = self
                .timeout
                .clamp(Duration::from_millis(100), Duration::from_secs(1));
            let deadline = Instant::now() + wait;
            match self.api.send(subject, request, deadline).await {
                Sent::Reply(_) => {
                    instance.alive_at = Some(Instant::now());
                    instance.silent_since = None;
                }
                Sent::NoResponders => {
                    let since = *instance.silent_since.get_or_insert(now);
                    if now.duration_since(since) >= self.timeout {
                        dead.push(key.clone());
                    }
                }
                // Slow, or this instance is cut off: nothing is known.
                Sent::Failed(_) | Sent::Refused(_) => {}
            }
        }
        for key in dead {
            let Some(instance) = known.get_mut(&key) else {
                continue;
            };
            // Only an instance still watched is found dead: one being purged or
            // done was skipped above, so none is claimed (and given back) twice.
            assert!(
                instance.watch == Watch::Watching,
                "a dead instance claimed twice"
            );
            // Its leases are still its own until half the lease timeout after it
            // last answered (see the module doc); after that AckWait gives them back.
            let until = instance.alive_at.map(|at| at + self.lease_timeout / 2);
            match self.claim(&key, until).await {
                Ok(watch) => instance.watch = watch,
                // Nothing known (a timeout, an election): again next round.
                Err(e) => {
                    tracing::debug!(instance = %key, "jetstream: a dead instance's leases: {e}")
                }
            }
        }
    }

    /// Marks `key`'s registration dead (unless another instance did), gives its leases
    /// back until `until` (not at all when `None`: it was never seen alive), and
    /// purges its records.
    async fn claim(&self, key: &str, until: Option<Instant>) -> Result<Watch> {
        let deadline = Instant::now() + self.api.request_timeout;
        let subject = self.registration_subject(key);
        let Some((seq, payload)) = self.last(&subject, deadline).await? else {
            return Ok(Watch::Done);
        };
        if payload.starts_with(b"dead") {
            return Ok(Watch::Done);
        }
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Expected-Last-Subject-Sequence", seq.to_string());
        let ttl_s = (self.lease_timeout.as_secs() * 2).max(DEAD_TTL_MIN_S);
        headers.insert("Nats-TTL", format!("{ttl_s}s"));
        let request = Request::new().headers(headers).payload(Bytes::from(format!(
            "dead {} {}",
            self.key(),
            now_ms()
        )));
        match self.api.send(subject, request, deadline).await {
            Sent::Reply(m) if PubAck::stored(&m.payload) => {}
            // Another instance marked it first (its sequence moved on).
            Sent::Reply(_) => return Ok(Watch::Done),
            // Nothing known: again next round (a mark that was stored after all
            // reads as taken care of, its leases left to AckWait).
            Sent::NoResponders | Sent::Failed(_) => {
                return Err(super::errors::unavailable("marking an instance dead"))
            }
            Sent::Refused(e) => return Err(e),
        }
        let given = match until {
            Some(until) => self.give_back(key, until).await.unwrap_or(0),
            None => 0,
        };
        tracing::info!(instance = %key, given_back = given, "jetstream: a weir instance died; its open leases are back in their queues");
        Ok(match self.purge(key).await {
            Ok(()) => Watch::Done,
            Err(_) => Watch::Purging,
        })
    }

    /// Removes a dead instance's lease records.
    async fn purge(&self, key: &str) -> Result<()> {
        let api = format!("STREAM.PURGE.{}", self.stream);
        let body = json!({ "filter": self.leases_filter(key) });
        let deadline = Instant::now() + self.api.request_timeout;
        self.api
            .json::<serde_json::Value>(&api, &body, deadline)
            .await
            .map(drop)
    }

    /// `-NAK` for each of the dead instance's recorded leases, as long as it is before
    /// `until`; how many. A reader's leases are given back in the order of their
    /// items (the server redelivers in the order it gets them back): a killed instance's
    /// leases come back in their queue's order.
    async fn give_back(&self, key: &str, until: Instant) -> Result<usize> {
        let deadline = Instant::now() + self.api.request_timeout;
        let subjects = self.subjects(&self.leases_filter(key), deadline).await?;
        let replies: Vec<String> = futures_util::stream::iter(subjects)
            .map(|subject| async move {
                if Instant::now() >= until {
                    return Vec::new();
                }
                let deadline = until.min(Instant::now() + self.api.request_timeout);
                let Ok(Some((_, record))) = self.last(&subject, deadline).await else {
                    return Vec::new();
                };
                let soon = now_ms() + EXPIRY_MARGIN_MS;
                records::parse(&record)
                    .into_iter()
                    .filter(|(_, expires)| *expires == 0 || *expires > soon)
                    .map(|(reply, _)| reply.to_owned())
                    .collect::<Vec<String>>()
            })
            .buffer_unordered(NAKS_AT_ONCE)
            .flat_map(futures_util::stream::iter)
            .collect()
            .await;
        let mut by_reader: std::collections::BTreeMap<String, Vec<(u64, String)>> =
            std::collections::BTreeMap::new();
        for reply in replies {
            let Some((consumer, delivery)) = super::layout::Delivery::parse_with_consumer(&reply)
            else {
                continue;
            };
            let consumer = consumer.to_owned();
            by_reader
                .entry(consumer)
                .or_default()
                .push((delivery.stream_seq, reply));
        }
        let naks = futures_util::stream::iter(by_reader.into_values())
            .map(|mut leases| async move {
                leases.sort_unstable();
                if Instant::now() >= until {
                    return 0;
                }
                let deadline = until.min(Instant::now() + self.api.request_timeout);
                // Sent in order without waiting for each reply: `join_all` polls them
                // in order, a request goes into the connection's queue when first
                // polled, and one connection keeps its order to the server.
                let naks = leases
                    .iter()
                    .map(|(_, reply)| leases::nak(&self.api, reply, deadline));
                futures_util::future::join_all(naks)
                    .await
                    .into_iter()
                    .filter(|n| *n == leases::Nak::Confirmed)
                    .count()
            })
            .buffer_unordered(NAKS_AT_ONCE)
            .fold(0, |total, sent| std::future::ready(total + sent))
            .await;
        Ok(naks)
    }

    /// The subjects of the instances' stream matching `filter` (one page: up to the
    /// server's 100,000).
    async fn subjects(&self, filter: &str, deadline: Instant) -> Result<Vec<String>> {
        let api = format!("STREAM.INFO.{}", self.stream);
        let info: StreamInfo = self
            .api
            .json(&api, &json!({ "subjects_filter": filter }), deadline)
            .await?;
        Ok(info.state.subjects.into_keys().collect())
    }

    /// The last message on `subject` (Direct Get, one attempt: the instances' loop tries
    /// again next round): its sequence and payload.
    async fn last(&self, subject: &str, deadline: Instant) -> Result<Option<(u64, Bytes)>> {
        let query = json!({ "last_by_subj": subject });
        match self
            .api
            .direct_get_once(&self.stream, &query, deadline)
            .await?
        {
            Got::Found(m) => {
                let seq = m
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("Nats-Sequence"))
                    .and_then(|v| v.as_str().parse().ok())
                    .unwrap_or(0);
                Ok(Some((seq, m.payload)))
            }
            Got::Nothing => Ok(None),
            Got::Retry(why) => Err(super::errors::unavailable(format!("direct get: {why}"))),
        }
    }

    /// Purges this instance's records at a graceful shutdown (its leases were given back
    /// already).
    pub async fn close(&self) {
        self.closing.store(true, Ordering::Release);
        if !self.registered.load(Ordering::Acquire) {
            return;
        }
        let key = self.key();
        let api = format!("STREAM.PURGE.{}", self.stream);
        for filter in [self.leases_filter(&key), self.registration_subject(&key)] {
            let deadline = Instant::now() + self.api.request_timeout;
            let _ = self
                .api
                .json_or_api_error::<serde_json::Value>(
                    &api,
                    &json!({ "filter": filter }),
                    deadline,
                )
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_pub_acks() {
        assert!(PubAck::stored(br#"{"stream":"S_DOORS","seq":7}"#));
        assert!(!PubAck::stored(
            br#"{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"}}"#
        ));
        assert!(!PubAck::stored(b"garbage"));
    }
}
