//! A subscriber's delivery worker: one task per subscriber that gathers a batch from
//! the subscriber's readers, POSTs it to the callback, and confirms it on a 2xx.
//!
//! One batch is in flight per subscriber at a time, and its events stay leased until
//! it is confirmed, so each topic's events reach the subscriber in order. A batch goes
//! out when it holds `max` events or when its oldest event has waited `timeout` ms. A
//! failed attempt is retried, the same batch with the same `webhook-id`, after an
//! exponential backoff with jitter (`retry.rs`); after `attempts_max` failures its
//! events are appended to the subscriber's dead-letter queue and confirmed on their
//! topics. A batch the receiver refuses twice in a row (a 4xx other than 408 and 429)
//! is split in two, then again, so that one event it cannot take goes to the dead
//! letters alone and its neighbours are delivered (issue 32); after a part is
//! dead-lettered, splitting waits for a part to get through (a receiver that refuses
//! everything would otherwise cost every event its own attempts).
//! A crash at any point leaves the leased events pending: they are delivered
//! again after restart (at-least-once; each event's `id` lets a receiver de-duplicate).
//!
//! Re-driven dead letters come first in a batch: the worker takes from the
//! dead-letter queue while its items are older than the subscription's
//! `redrive_below` mark.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::{AcqRel, Relaxed};
use std::sync::Arc;
use std::time::Duration;

use axum::http::header::CONTENT_TYPE;
use sha2::{Digest, Sha256};
use tokio::sync::{watch, Notify, OwnedMutexGuard, Semaphore};
use tokio::time::Instant;
use weir_backend::{AppendOptions, Backend, Lease, Reader, TakeMode};

use crate::config::BusSettings;
use crate::counters::SubscriberCounters;
use crate::event::{cloudevents_batch, delivered, event_id, routemaster_batch};
use crate::guard::{check_callback, Policy};
use crate::live::{LiveSubscriber, LiveTopic};
use crate::meta::{Format, Meta, SubscriberMeta};
use crate::names::{dead_queue, topic_queue};
use crate::retry::backoff;
use crate::sign::signature_header;
use crate::wake::WakeFlags;

/// How often an idle worker wakes without being woken.
const IDLE_POLL: Duration = Duration::from_secs(1);
/// A publish wakes only its topic's subscribers, and each looks at that topic's
/// reader only. Events written to a topic's queue by other means (the memcache door
/// with `reserved_queues_writable`) wake nobody: an idle worker looks at all its
/// readers once per `IDLE_POLL` when it has at most this many, else at this many a
/// second on average (a sweep of 1,000 topics every 100 s), so that 200 idle
/// subscribers of 1,000 topics cost next to nothing.
const SWEEP_SOURCES_PER_S: usize = 10;
/// Bytes of a receiver's answer kept for the log when it refuses a batch.
const REFUSAL_BODY_LOG_BYTES: usize = 200;
/// Refusals (a 4xx other than 408 and 429) of the same batch in a row after which it
/// is split in two: one event a receiver cannot take then costs only itself.
const SPLIT_AFTER_REFUSALS: u32 = 2;

/// A future a [`BusLink`] answers with.
pub type BusFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a delivery worker needs of the bus that runs it: its settings and the shared
/// means of delivery, the metadata and topics as they run, and the two calls back
/// (holding changes off, making a topic's queue again). `bus.rs` implements it: the
/// bus starts the workers, and this trait object is how they reach it back without
/// this file reaching `bus.rs`.
pub trait BusLink: Send + Sync + 'static {
    fn backend(&self) -> &Backend;
    fn settings(&self) -> &BusSettings;
    /// The HTTP client of every delivery.
    fn client(&self) -> &reqwest::Client;
    /// Deliveries in flight, across subscribers (`deliveries_in_flight_max` permits).
    fn in_flight(&self) -> &Semaphore;
    fn shutdown(&self) -> &watch::Receiver<bool>;
    fn is_shutting_down(&self) -> bool;
    /// Whether this instance serves the bus now.
    fn is_active(&self) -> bool;
    /// Whether this instance may still change the backend (its hold is fresh).
    fn may_write(&self) -> bool;
    /// The metadata as last written.
    fn meta(&self) -> Arc<Meta>;
    /// Topic `name` as it runs.
    fn topic(&self, name: &str) -> Option<Arc<LiveTopic>>;
    /// Holds the bus's changes off until the guard is dropped.
    fn hold_changes(&self) -> BusFuture<'_, OwnedMutexGuard<()>>;
    /// Makes topic `topic`'s queue and readers again, found deleted outside the bus.
    fn topic_gone<'a>(&'a self, topic: &'a str) -> BusFuture<'a, weir_backend::Result<()>>;
}

/// Starts the worker of a subscriber (its token's owner is `name`) on the current
/// runtime.
pub fn start(bus: Arc<dyn BusLink>, name: String, config: Arc<SubscriberMeta>) -> LiveSubscriber {
    let notify = Arc::new(Notify::new());
    let flags = Arc::new(WakeFlags::default());
    let id = config.id.clone();
    let adopted = Arc::clone(&config);
    let (config_tx, config_rx) = watch::channel(config);
    let (stop_tx, stop_rx) = watch::channel(false);
    let counters = Arc::new(SubscriberCounters::default());
    let worker = Worker {
        bus,
        id,
        notify: Arc::clone(&notify),
        flags: Arc::clone(&flags),
        cached: None,
        index: None,
        swept: Instant::now(),
        adopted,
        config: config_rx,
        stop: stop_rx,
        counters: Arc::clone(&counters),
    };
    let task = tokio::spawn(supervise(worker));
    LiveSubscriber {
        notify,
        flags,
        config: config_tx,
        counters,
        stop: stop_tx,
        name,
        task,
    }
}

#[derive(Clone)]
struct Worker {
    bus: Arc<dyn BusLink>,
    /// The subscriber's id: its readers' name, its dead-letter queue, its name in logs.
    id: String,
    notify: Arc<Notify>,
    /// Which topics have something new (set by a publish, cleared before a look).
    flags: Arc<WakeFlags>,
    /// The sources as last built, kept from batch to batch until the settings
    /// change or a topic's queue is found gone.
    cached: Option<Arc<Vec<Source>>>,
    /// The sources the index was built for, and their positions by topic name.
    index: Option<(Arc<Vec<Source>>, TopicIndex)>,
    /// When every source was last looked at.
    swept: Instant,
    config: watch::Receiver<Arc<SubscriberMeta>>,
    /// The settings the worker's sources were last built from.
    adopted: Arc<SubscriberMeta>,
    stop: watch::Receiver<bool>,
    counters: Arc<SubscriberCounters>,
}

/// How long a worker that failed (a panic) waits before it starts again.
const RESTART_PAUSE: Duration = Duration::from_secs(1);

/// Runs a worker, and again if it fails; once it stops for good, deletes its readers
/// if its subscription is gone.
async fn supervise(worker: Worker) {
    loop {
        match tokio::spawn(worker.clone().run()).await {
            Ok(()) => break,
            Err(e) => {
                // The failed run's leases stay taken until weir restarts (then the
                // events are delivered again): at-least-once holds, order for them not.
                tracing::error!(subscriber = %worker.id, error = %e, "delivery worker failed; starting it again");
                tokio::time::sleep(RESTART_PAUSE).await;
                if worker.stopped() {
                    break;
                }
            }
        }
    }
    if !worker.bus.is_shutting_down() {
        worker.delete_readers_if_gone().await;
    }
}

/// A source's position in the worker's sources, by topic name.
type TopicIndex = HashMap<String, usize>;

/// Where a batch's events come from: a topic's reader, or the dead-letter queue.
struct Source {
    reader: Reader,
    /// Topic name and epoch; `None` for the dead-letter queue.
    topic: Option<(String, u32)>,
    /// Dead letters at or above this seq are not being re-driven.
    redrive_below: u64,
    /// The topic's "something new" flag; `None` for the dead-letter queue, which
    /// is looked at every time.
    pending: Option<Arc<AtomicBool>>,
    /// Found empty at the last look, and nothing new since.
    idle: AtomicBool,
}

impl Source {
    fn new(reader: Reader, topic: Option<(String, u32)>, redrive_below: u64) -> Source {
        Source {
            reader,
            topic,
            redrive_below,
            pending: None,
            idle: AtomicBool::new(false),
        }
    }
}

/// One leased event of a batch.
struct Pending {
    source: usize,
    lease: Lease,
    enqueued_at_ms: u64,
    id: String,
    /// The event as delivered in routemaster's format.
    event: Vec<u8>,
}

struct Batch {
    sources: Arc<Vec<Source>>,
    events: Vec<Pending>,
    /// Bytes of the events, bounded by `batch_bytes_max` (plus one event).
    bytes: usize,
}

/// How the delivery of a part of a batch ended.
enum Outcome {
    /// Confirmed.
    Delivered,
    /// Failed `attempts_max` times: in the dead letters (or left pending when they
    /// could not be written).
    DeadLettered,
    /// Refused `SPLIT_AFTER_REFUSALS` times in a row: to be split in two.
    Split,
    /// The worker was stopped; the part's leases are still held.
    Stopped,
}

/// A failed attempt: why, and whether the receiver refused what was sent (it would
/// refuse it again: a split may isolate the event it cannot take).
struct Failure {
    reason: String,
    refused: bool,
}

impl Failure {
    fn refusal(reason: String) -> Failure {
        Failure {
            reason,
            refused: true,
        }
    }
}

impl From<String> for Failure {
    fn from(reason: String) -> Failure {
        Failure {
            reason,
            refused: false,
        }
    }
}

/// How a wait ended.
enum Woken {
    Stop,
    ConfigChanged,
    Other,
}

impl Worker {
    async fn run(mut self) {
        tracing::debug!(subscriber = %self.id, "delivery worker started");
        while let Some(batch) = self.collect().await {
            if !self.deliver(batch).await {
                break;
            }
        }
        tracing::debug!(subscriber = %self.id, "delivery worker stopped");
    }

    /// Takes the latest settings. The readers of topics the subscription left are
    /// deleted now, by the worker, once it no longer uses them (see
    /// `Bus::reconcile` for why not before).
    async fn adopt(&mut self) -> Arc<SubscriberMeta> {
        let next = self.config.borrow_and_update().clone();
        if Arc::ptr_eq(&next, &self.adopted) {
            return next;
        }
        self.cached = None;
        self.index = None;
        let left: Vec<String> = self
            .adopted
            .topics
            .iter()
            .filter(|t| !next.topics.contains(t))
            .cloned()
            .collect();
        if !left.is_empty() {
            self.delete_readers(left).await;
        }
        self.adopted = Arc::clone(&next);
        next
    }

    /// Deletes this subscriber's readers on `topics`, those the subscription as it
    /// stands now does not have, each with changes held off (a change made
    /// meanwhile may have subscribed again); changes wait for one deletion at a
    /// time, not for all of a subscription's topics.
    async fn delete_readers(&self, topics: Vec<String>) {
        let id = &self.id;
        for topic in topics {
            let _held = self.bus.hold_changes().await;
            // An instance that stopped serving the bus (its metadata forgotten) deletes
            // nothing: its worker stopped, not its subscription.
            if !self.bus.is_active() || !self.bus.may_write() {
                return;
            }
            let meta = self.bus.meta();
            let current = meta.subscribers.values().find(|s| s.id == self.id);
            if current.is_some_and(|s| s.topics.contains(&topic)) {
                continue;
            }
            let Some(rt) = self.bus.topic(&topic) else {
                continue;
            };
            // Asked first: a reader that is not there costs no deletion (file work
            // on the engine) for each topic of a subscription that goes.
            let deleted = match rt.queue.has_reader(id).await {
                Ok(false) => Ok(false),
                Ok(true) => {
                    self.bus
                        .backend()
                        .delete_reader(&topic_queue(&topic), id)
                        .await
                }
                Err(e) => Err(e),
            };
            if let Err(e) = deleted {
                tracing::warn!(subscriber = %id, topic, error = %e, "could not delete a reader");
            }
        }
    }

    /// Once stopped: when no subscription has this id any more, its readers go.
    async fn delete_readers_if_gone(&self) {
        let all: Vec<String> = self.bus.meta().topics.keys().cloned().collect();
        self.delete_readers(all).await;
    }

    fn stopped(&self) -> bool {
        *self.stop.borrow() || self.bus.is_shutting_down()
    }

    fn now_ms(&self) -> u64 {
        self.bus.backend().now_ms()
    }

    /// The sources of the next batch under `cfg`: the dead-letter queue when
    /// re-driving, then each topic the subscriber has.
    async fn sources(&self, cfg: &SubscriberMeta) -> Vec<Source> {
        let mut sources = Vec::with_capacity(cfg.topics.len() + 1);
        if cfg.redrive_below > 0 {
            match self.dead_letter_reader().await {
                Ok(None) => {}
                Ok(Some(reader)) => sources.push(Source::new(reader, None, cfg.redrive_below)),
                Err(e) => {
                    tracing::error!(subscriber = %self.id, error = %e, "dead-letter queue unavailable")
                }
            }
        }
        for topic in &cfg.topics {
            if let Some(source) = self.topic_source(topic).await {
                sources.push(source);
            }
        }
        sources
    }

    /// The subscriber's reader on `topic`, `None` when it has none. A queue found
    /// deleted outside the bus is made again (by [`BusLink::topic_gone`]) and looked up
    /// once more: skipping it would leave the topic out of every batch until the
    /// subscription changed.
    async fn topic_source(&self, topic: &str) -> Option<Source> {
        let backend = &self.bus.backend();
        for attempt in 0..2 {
            let rt = self.bus.topic(topic)?;
            // Never create a reader here: the backend would start it at the oldest
            // event. The bus creates it, at the end, when the subscription is made.
            let reader = match rt.queue.has_reader(&self.id).await {
                // Deleted outside the bus (on JetStream, its consumer): made again at
                // the topic's end by the bus, like a deleted queue.
                Ok(false) if attempt == 0 => Err(weir_backend::Error::new(
                    weir_backend::Kind::NotFound,
                    format!("the subscriber's reader on topic {topic}"),
                )),
                Ok(false) => {
                    tracing::warn!(subscriber = %self.id, topic, "no reader on the topic; skipped");
                    return None;
                }
                Ok(true) => backend.reader(&rt.queue, &self.id).await,
                Err(e) => Err(e),
            };
            match reader {
                Ok(reader) => {
                    return Some(Source {
                        pending: Some(self.flags.flag(topic)),
                        ..Source::new(reader, Some((topic.to_owned(), rt.epoch)), 0)
                    })
                }
                Err(e) if attempt == 0 && e.kind() == weir_backend::Kind::NotFound => {
                    if let Err(e) = self.bus.topic_gone(topic).await {
                        tracing::error!(subscriber = %self.id, topic, error = %e, "could not make a deleted topic's queue again");
                        return None;
                    }
                }
                Err(e) => {
                    tracing::error!(subscriber = %self.id, topic, error = %e, "reader unavailable");
                    return None;
                }
            }
        }
        None
    }

    /// The sources as last built, or built now (the settings changed, or a topic's
    /// queue was found gone): a batch after a batch costs no look-up of readers.
    async fn current_sources(&mut self, cfg: &SubscriberMeta) -> Arc<Vec<Source>> {
        if let Some(sources) = &self.cached {
            return Arc::clone(sources);
        }
        let sources = Arc::new(self.sources(cfg).await);
        self.cached = Some(Arc::clone(&sources));
        self.swept = Instant::now();
        sources
    }

    /// How often every one of `sources` is looked at without a wake-up.
    fn sweep_every(&self, sources: usize) -> Duration {
        let seconds = u32::try_from(sources / SWEEP_SOURCES_PER_S).unwrap_or(u32::MAX);
        IDLE_POLL.saturating_mul(seconds.max(1))
    }

    /// The index of `sources` by topic, built once per set of sources.
    fn index_of(&mut self, sources: &Arc<Vec<Source>>) -> &TopicIndex {
        let stale = self
            .index
            .as_ref()
            .is_none_or(|(of, _)| !Arc::ptr_eq(of, sources));
        if stale {
            self.index = None;
        }
        let (_, index) = self.index.get_or_insert_with(|| {
            let index = sources
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.topic.as_ref().map(|(t, _)| (t.clone(), i)))
                .collect();
            (Arc::clone(sources), index)
        });
        index
    }

    /// Which sources to look at now, by index, in order: each whose topic a publish
    /// listed since the last look, each that had events left at the last look (or
    /// has not been looked at), the dead-letter queue, and (once a sweep is due)
    /// every one. Their flags are cleared before the look: a publish meanwhile sets
    /// a flag again and lists its topic. Costs the listed topics and a relaxed load
    /// per source, not an atomic exchange per source: 200 workers of 1,000 topics
    /// each are woken by every publish to any topic.
    fn sources_due(&mut self, sources: &Arc<Vec<Source>>) -> Vec<usize> {
        if self.swept.elapsed() >= self.sweep_every(sources.len()) {
            self.swept = Instant::now();
            for s in sources.iter() {
                s.idle.store(false, Relaxed);
            }
        }
        let listed = self.flags.take_listed();
        let mut due: Vec<usize> = Vec::with_capacity(listed.len());
        if !listed.is_empty() {
            let index = self.index_of(sources);
            due.extend(listed.iter().filter_map(|t| index.get(&**t).copied()));
        }
        let busy = sources
            .iter()
            .enumerate()
            .filter(|(_, s)| s.pending.is_none() || !s.idle.load(Relaxed));
        due.extend(busy.map(|(i, _)| i));
        due.sort_unstable();
        due.dedup();
        for s in due.iter().filter_map(|&i| sources.get(i)) {
            if let Some(pending) = &s.pending {
                pending.swap(false, AcqRel);
            }
        }
        due
    }

    /// The reader of the subscriber's dead-letter queue; `None` when the queue is
    /// not there (never created here: the bus makes it with the subscription).
    async fn dead_letter_reader(&self) -> weir_backend::Result<Option<Reader>> {
        let backend = &self.bus.backend();
        match backend.existing_queue(&dead_queue(&self.id))? {
            Some(queue) => backend.reader(&queue, "").await.map(Some),
            None => Ok(None),
        }
    }

    /// Gathers the next batch: returns it once it holds `max` events or its oldest
    /// has waited `timeout`; `None` when the worker is stopped.
    async fn collect(&mut self) -> Option<Batch> {
        let mut cfg = self.adopt().await;
        let mut batch = Batch {
            sources: self.current_sources(&cfg).await,
            events: Vec::new(),
            bytes: 0,
        };
        loop {
            if self.stopped() {
                release_all(&batch.sources, &batch.events);
                return None;
            }
            let max = usize::try_from(cfg.max_events).unwrap_or(usize::MAX).max(1);
            if self.fill(&mut batch, max).await && batch.events.is_empty() {
                batch.sources = self.current_sources(&cfg).await;
                continue;
            }
            if batch.events.len() >= max || batch.bytes >= self.bus.settings().batch_bytes_max {
                return Some(batch);
            }
            let due = batch
                .events
                .iter()
                .map(|e| e.enqueued_at_ms.saturating_add(cfg.timeout_ms))
                .min();
            let now_ms = self.now_ms();
            let wake_at = match due {
                Some(due) if due <= now_ms => return Some(batch),
                Some(due) => Instant::now() + Duration::from_millis(due - now_ms).min(IDLE_POLL),
                None => (self.swept + self.sweep_every(batch.sources.len()))
                    .max(Instant::now() + IDLE_POLL),
            };
            match self.wait(Some(wake_at), true).await {
                Woken::Stop => {
                    release_all(&batch.sources, &batch.events);
                    return None;
                }
                Woken::ConfigChanged if batch.events.is_empty() => {
                    cfg = self.adopt().await;
                    batch.sources = self.current_sources(&cfg).await;
                }
                Woken::ConfigChanged | Woken::Other => {}
            }
        }
    }

    /// Waits for a wake-up (a publish when `on_publish`, a change of the
    /// subscription, a stop) or `until`.
    async fn wait(&mut self, until: Option<Instant>, on_publish: bool) -> Woken {
        let sleep = async {
            match until {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let mut shutdown = self.bus.shutdown().clone();
        let notify = Arc::clone(&self.notify);
        let published = async move {
            if on_publish {
                notify.notified().await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = published => Woken::Other,
            _ = sleep => Woken::Other,
            changed = self.config.changed() => match changed {
                Ok(()) => Woken::ConfigChanged,
                Err(_) => Woken::Stop,
            },
            _ = self.stop.changed() => Woken::Stop,
            _ = shutdown.changed() => Woken::Stop,
        }
    }

    /// Leases events into `batch` until it holds `max` events or `batch_bytes_max`
    /// bytes, or every source is empty: re-driven dead letters first, then one
    /// event per topic in turn.
    /// True when a topic's reader was found gone (its queue deleted outside the
    /// bus): the bus has made it again, and the sources are to be built again.
    async fn fill(&mut self, batch: &mut Batch, max: usize) -> bool {
        let mut gone = false;
        let bytes_max = self.bus.settings().batch_bytes_max;
        let full = |b: &Batch| b.events.len() >= max || b.bytes >= bytes_max;
        let sources = Arc::clone(&batch.sources);
        let mut due = self.sources_due(&sources);
        while !full(batch) && !due.is_empty() {
            let mut left = Vec::with_capacity(due.len());
            for i in due {
                let Some(source) = sources.get(i) else {
                    continue;
                };
                let dead_letters = source.topic.is_none();
                let mut done = false;
                // Dead letters: as many as fit before any topic's next event.
                while !done && !full(batch) {
                    match self.take_one(source, i).await {
                        Ok(Some(p)) => {
                            batch.bytes += p.event.len();
                            batch.events.push(p);
                        }
                        Ok(None) => {
                            source.idle.store(true, Relaxed);
                            done = true;
                        }
                        Err(e) if e.kind() == weir_backend::Kind::NotFound => {
                            if let Some((topic, _)) = &source.topic {
                                if let Err(e) = self.bus.topic_gone(topic).await {
                                    tracing::error!(subscriber = %self.id, topic, error = %e, "could not make a deleted topic's queue again");
                                }
                            }
                            gone = true;
                            done = true;
                        }
                        Err(e) => {
                            tracing::error!(subscriber = %self.id, error = %e, "could not take an event");
                            // Its flag is cleared: looked at again next time, not
                            // left for the sweep.
                            source.idle.store(false, Relaxed);
                            done = true;
                        }
                    }
                    if !dead_letters {
                        break;
                    }
                }
                if !done {
                    left.push(i);
                }
            }
            due = left;
        }
        // Left when the batch filled: their flags are cleared, so they are marked
        // as having events (or not looked at) to be looked at next time.
        for s in due.iter().filter_map(|&i| sources.get(i)) {
            s.idle.store(false, Relaxed);
        }
        if gone {
            self.cached = None;
            self.index = None;
        }
        // `full` is checked before every take: one batch, one POST, at most `max`.
        assert!(
            batch.events.len() <= max,
            "a batch holds {} events, more than its max of {max}",
            batch.events.len()
        );
        gone
    }

    /// Leases the next event of one source. `Ok(None)` when it has none for now.
    /// Items that are not events (written by other means) are confirmed and skipped.
    async fn take_one(
        &self,
        source: &Source,
        index: usize,
    ) -> weir_backend::Result<Option<Pending>> {
        loop {
            let Some(taken) = source.reader.take(TakeMode::Lease, Duration::ZERO).await? else {
                return Ok(None);
            };
            // The backend's contract: a take in `Lease` mode answers an item with its
            // lease. Without one the event could be neither confirmed nor given back.
            let Some(lease) = taken.lease else {
                panic!("a take in Lease mode answered an item without its lease");
            };
            let item = taken.item;
            let pending = match &source.topic {
                Some((topic, epoch)) => {
                    let id = event_id(topic, *epoch, item.seq);
                    delivered(topic, &id, &item.data).map(|event| (id, event))
                }
                None if item.seq >= source.redrive_below => {
                    source.reader.release(&lease)?;
                    return Ok(None);
                }
                None => dead_letter_id(&item.data).map(|id| (id, item.data.to_vec())),
            };
            match pending {
                Some((id, event)) => {
                    return Ok(Some(Pending {
                        source: index,
                        lease,
                        enqueued_at_ms: item.enqueued_at_ms,
                        id,
                        event,
                    }))
                }
                None => {
                    tracing::warn!(
                        subscriber = %self.id,
                        queue = source.reader.queue_name(),
                        seq = item.seq,
                        "skipping an item that is not a bus event"
                    );
                    source.reader.confirm(&lease).await?;
                }
            }
        }
    }

    /// Delivers `batch` until every event is confirmed or dead-lettered. False when
    /// the worker was stopped meanwhile (the leases not yet settled are released).
    /// A part the receiver keeps refusing is split in two, first half first, so
    /// that an event it cannot take costs only itself (issue 32). Once a part is
    /// dead-lettered, parts are not split again until one is delivered: a receiver
    /// that refuses everything (a 401) costs a few parts' attempts, not each event's.
    async fn deliver(&mut self, batch: Batch) -> bool {
        let Batch {
            sources, events, ..
        } = batch;
        // Events of parts delivered or dead-lettered, of `total`.
        let (total, mut settled) = (events.len(), 0);
        // Parts still to deliver, the next one last.
        let mut parts = vec![events];
        let mut may_split = true;
        while let Some(mut part) = parts.pop() {
            if part.is_empty() {
                continue;
            }
            match self.deliver_part(&sources, &part, may_split).await {
                Outcome::Delivered => {
                    may_split = true;
                    settled += part.len();
                }
                Outcome::DeadLettered => {
                    may_split = false;
                    settled += part.len();
                }
                Outcome::Split => {
                    // `deliver_part` splits only a part of two events or more: each half
                    // holds one at least, and the splitting ends.
                    assert!(
                        part.len() >= 2,
                        "a part of {} event(s) to be split",
                        part.len()
                    );
                    let second = part.split_off(part.len() / 2);
                    tracing::info!(subscriber = %self.id, first = part.len(), second = second.len(), "the receiver keeps refusing a batch: split in two");
                    parts.push(second);
                    parts.push(part);
                }
                Outcome::Stopped => {
                    parts.push(part);
                    for part in &parts {
                        release_all(&sources, part);
                    }
                    return false;
                }
            }
        }
        // Each event is in one part at a time until that part settles: none is
        // confirmed twice, none left leased.
        assert_eq!(
            settled, total,
            "a batch's events settled other than once each"
        );
        true
    }

    /// Delivers `events` as one batch until it is confirmed or dead-lettered, or
    /// (when `may_split` and it holds more than one event) the receiver refused it
    /// `SPLIT_AFTER_REFUSALS` times in a row: it is then to be split.
    async fn deliver_part(
        &mut self,
        sources: &[Source],
        events: &[Pending],
        may_split: bool,
    ) -> Outcome {
        let msg_id = message_id(events);
        let (mut attempts, mut refusals) = (0u32, 0u32);
        loop {
            if self.stopped() {
                return Outcome::Stopped;
            }
            let cfg = self.config.borrow_and_update().clone();
            let started = std::time::Instant::now();
            match self.send(&cfg, &msg_id, events).await {
                Ok(()) => {
                    self.confirm(sources, events).await;
                    tracing::debug!(subscriber = %self.id, events = events.len(), ms = started.elapsed().as_millis() as u64, "batch delivered");
                    return Outcome::Delivered;
                }
                Err(failure) => {
                    attempts += 1;
                    // The attempt that reaches `attempts_max` dead-letters the part below.
                    assert!(
                        attempts <= self.bus.settings().attempts_max,
                        "attempt {attempts} of a part, past attempts_max"
                    );
                    refusals = if failure.refused { refusals + 1 } else { 0 };
                    self.counters.failed_attempts.fetch_add(1, Relaxed);
                    tracing::warn!(subscriber = %self.id, attempt = attempts, events = events.len(), "delivery failed: {}", failure.reason);
                }
            }
            if may_split && events.len() > 1 && refusals >= SPLIT_AFTER_REFUSALS {
                return Outcome::Split;
            }
            let settings = &self.bus.settings();
            if attempts >= settings.attempts_max {
                self.dead_letter(sources, events).await;
                return Outcome::DeadLettered;
            }
            let pause = backoff(attempts, settings.retry_initial, settings.retry_max);
            // A publish does not cut the pause short; a changed subscription (a fixed
            // callback) does.
            if let Woken::Stop = self.wait(Some(Instant::now() + pause), false).await {
                return Outcome::Stopped;
            }
        }
    }

    /// One attempt: POSTs the batch, signed, with the subscription's Basic auth. The
    /// callback is checked against the SSRF guard again (the policy may have changed
    /// since the subscription; an IP-literal URL is not resolved, so the resolver's
    /// check does not see it). Signed once a delivery slot is held, so the timestamp
    /// is the time of sending.
    async fn send(
        &self,
        cfg: &SubscriberMeta,
        msg_id: &str,
        events: &[Pending],
    ) -> Result<(), Failure> {
        let settings = &self.bus.settings();
        let policy = Policy {
            allow_http: settings.allow_http,
            allow_private_networks: settings.allow_private_networks,
        };
        check_callback(&cfg.callback, policy)?;
        let _permit = self
            .bus
            .in_flight()
            .acquire()
            .await
            .map_err(|_| "the bus is closing".to_string())?;
        // The semaphore starts with `deliveries_in_flight_max` permits and nothing adds
        // any: with this one held, fewer are left.
        assert!(
            self.bus.in_flight().available_permits() < settings.deliveries_in_flight_max,
            "more deliveries in flight than deliveries_in_flight_max"
        );
        let events = events.iter().map(|p| p.event.as_slice());
        let (body, content_type) = match cfg.format {
            Format::Routemaster => (routemaster_batch(events), "application/json"),
            // An event with no CloudEvents form fails every attempt alike: a refusal.
            Format::Cloudevents => (
                cloudevents_batch(events).map_err(Failure::refusal)?,
                "application/cloudevents-batch+json",
            ),
        };
        let now_ms = self.now_ms();
        let timestamp_s = now_ms / 1000;
        let signature = signature_header(&cfg.secrets, now_ms, msg_id, timestamp_s, &body);
        let mut request = self
            .bus
            .client()
            .post(&cfg.callback)
            .header(CONTENT_TYPE, content_type)
            .header("webhook-id", msg_id)
            .header("webhook-timestamp", timestamp_s.to_string());
        if !signature.is_empty() {
            request = request.header("webhook-signature", signature);
        }
        if let Some(uuid) = &cfg.uuid {
            request = request.basic_auth(uuid, Some("x"));
        }
        let response = request.body(body).send().await.map_err(describe)?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let text = response.text().await.unwrap_or_default();
        let text: String = text.chars().take(REFUSAL_BODY_LOG_BYTES).collect();
        // An error page may echo the request's path (`Cannot POST /hook/SECRET`).
        let text = redact_callback(&text, &cfg.callback);
        Err(Failure {
            reason: format!("the callback answered {status}: {text}"),
            // 408 and 429 ask for a later try; other 4xx refuse what was sent.
            refused: status.is_client_error()
                && status != reqwest::StatusCode::REQUEST_TIMEOUT
                && status != reqwest::StatusCode::TOO_MANY_REQUESTS,
        })
    }

    /// Confirms every event of a delivered batch and counts it.
    async fn confirm(&self, sources: &[Source], events: &[Pending]) {
        let now_ms = self.now_ms();
        for p in events {
            let source = source_of(sources, p);
            if let Err(e) = source.reader.confirm(&p.lease).await {
                tracing::error!(subscriber = %self.id, error = %e, "could not confirm a delivered event");
            }
            self.counters.sent.fetch_add(1, Relaxed);
            self.counters
                .observe_latency_ms(now_ms.saturating_sub(p.enqueued_at_ms));
        }
    }

    /// Moves a batch that failed `attempts_max` times to the dead-letter queue: the
    /// events are appended there first, then confirmed where they came from, so a
    /// crash between the two delivers them again rather than losing them.
    async fn dead_letter(&self, sources: &[Source], events: &[Pending]) {
        let queue = match self.bus.backend().existing_queue(&dead_queue(&self.id)) {
            Ok(Some(q)) => q,
            Ok(None) => {
                tracing::error!(subscriber = %self.id, "no dead-letter queue; the batch stays pending");
                release_all(sources, events);
                return;
            }
            Err(e) => {
                tracing::error!(subscriber = %self.id, error = %e, "dead-letter queue unavailable; the batch stays pending");
                release_all(sources, events);
                return;
            }
        };
        let items: Vec<&[u8]> = events.iter().map(|p| p.event.as_slice()).collect();
        match queue.append_batch(&items, AppendOptions::default()).await {
            Ok(_) => {
                for p in events {
                    let _ = source_of(sources, p).reader.confirm(&p.lease).await;
                }
                self.counters
                    .dead_lettered
                    .fetch_add(events.len() as u64, Relaxed);
                tracing::warn!(subscriber = %self.id, events = events.len(), "batch moved to the dead-letter queue");
            }
            Err(e) => {
                tracing::error!(subscriber = %self.id, error = %e, "could not dead-letter a batch; it stays pending");
                release_all(sources, events);
            }
        }
    }
}

/// Gives a batch's leases back, ahead of newer events.
fn release_all(sources: &[Source], events: &[Pending]) {
    for p in events {
        let source = source_of(sources, p);
        source.idle.store(false, Relaxed);
        let _ = source.reader.release(&p.lease);
    }
}

/// The source event `p` was leased from. A batch's events are leased from its own
/// sources (`Batch::sources`, kept with the events through every part and attempt):
/// an index out of them is a bug, and skipping the event would leave its lease held
/// until a restart.
fn source_of<'a>(sources: &'a [Source], p: &Pending) -> &'a Source {
    let Some(source) = sources.get(p.source) else {
        panic!(
            "an event of source {} in a batch of {} sources",
            p.source,
            sources.len()
        );
    };
    source
}

/// The `webhook-id` of a batch: a digest of its events' ids, the same on every
/// attempt of the same batch.
fn message_id(events: &[Pending]) -> String {
    let mut h = Sha256::new();
    for p in events {
        h.update(p.id.as_bytes());
        h.update(b",");
    }
    let digest = h.finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("msg_{hex}")
}

/// The id of a dead letter (an event in its delivered form), or `None` when the
/// item is not one.
pub(crate) fn dead_letter_id(data: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Head {
        id: String,
    }
    if !data.starts_with(br#"{"topic":""#) {
        return None;
    }
    serde_json::from_slice::<Head>(data).ok().map(|h| h.id)
}

/// `text` with the callback's path and query (which may hold a secret) replaced by
/// `…`, wherever the receiver's answer echoes them.
fn redact_callback(text: &str, callback: &str) -> String {
    let Ok(url) = url::Url::parse(callback) else {
        return text.to_owned();
    };
    let mut out = text.to_owned();
    let path_and_query = &url[url::Position::BeforePath..url::Position::AfterQuery];
    for secret in [path_and_query, url.path(), url.query().unwrap_or("")] {
        if secret.len() > 1 {
            out = out.replace(secret, "…");
        }
    }
    out
}

/// A transport error in words: refused, timed out, or what reqwest says, with the
/// causes it wraps (the SSRF guard's refusal is one). The callback appears as its
/// origin only (scheme, host, and a port other than the scheme's): its path and
/// query may hold a secret, and these words go to the log.
fn describe(e: reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "failed"
    };
    let to = e
        .url()
        .map(|url| url.origin().ascii_serialization())
        .unwrap_or_default();
    let e = e.without_url();
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        let said = c.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = c.source();
    }
    format!("{kind} ({to}: {text})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_echoing_the_callback_are_redacted() {
        let cb = "https://h.example/hook/s3cret?key=k3y";
        let said = redact_callback(
            "Cannot POST /hook/s3cret?key=k3y; path /hook/s3cret; q key=k3y",
            cb,
        );
        assert!(!said.contains("s3cret") && !said.contains("k3y"), "{said}");
        assert_eq!(
            redact_callback("not found", "https://h.example/"),
            "not found"
        );
        assert_eq!(redact_callback("x", "not a url"), "x");
    }

    #[test]
    fn dead_letters_carry_their_id() {
        let event = delivered(
            "t",
            "t.00000001.9",
            br#"{"type":"noop","url":"https://x/1","t":1}"#,
        )
        .unwrap();
        assert_eq!(dead_letter_id(&event).as_deref(), Some("t.00000001.9"));
        assert_eq!(dead_letter_id(b"hello"), None);
        assert_eq!(dead_letter_id(br#"{"topic":"t"}"#), None);
    }
}
