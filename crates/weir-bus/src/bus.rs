//! `Bus`: the metadata, the topics' queues and the subscribers' delivery workers,
//! and the one way to change them.
//!
//! Every change to tokens, topics or subscriptions goes through [`Bus::change`]:
//! under one lock it edits a copy of the metadata, writes what changed durably
//! (`meta_map.rs`'s keys in the backend's map: a file of the data directory on the
//! embedded engine, the cluster's map on JetStream), publishes it, then brings the
//! backend and the workers in line (`sync_runtime`).
//! The backend follows the metadata, never the reverse: a crash between the two is
//! repaired at the next start by `reconcile`, which creates what the metadata names
//! and deletes what it does not (orphan readers, queues of deleted topics).
//!
//! Queues are kept through [`weir_backend::Backend`] only. A topic's queue is made
//! with `queue_for_readers`, naming the retention reader and every subscriber: a
//! backend's default reader, which nobody here reads, would keep every event.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::http::StatusCode;
use parking_lot::{Mutex, RwLock};
use tokio::sync::{watch, Semaphore};
use weir_backend::{Backend, Queue, SeekTo};

use crate::config::BusSettings;
use crate::counters::SubscriberCounters;
use crate::error::{ApiError, ApiResult};
use crate::live::{LiveSubscriber, LiveTopic};
use crate::meta::{Meta, TopicMeta};
use crate::meta_map::MetaMap;
use crate::names::{dead_queue, topic_queue, DEAD_PREFIX, RETENTION_READER, TOPIC_PREFIX};
use crate::scope::{ByTopic, Touched};
use crate::wake::TopicWake;
use crate::worker::{BusFuture, BusLink};

/// What a change needs of this instance's hold of the cluster's `owner` key: whether
/// it is fresh, and its renewal before a write. `owner.rs` implements it: it runs the
/// bus (activates and deactivates it), so the bus reaches it back through this trait
/// object rather than by name.
pub trait OwnerHold: Send + Sync {
    /// Whether this instance holds the key and wrote it recently enough that no other
    /// instance may have taken it over.
    fn holds_fresh(&self) -> bool;
    /// Writes the key again; [`weir_backend::Kind::Conflict`] when this instance does
    /// not hold it (any more).
    fn renew(&self) -> Pin<Box<dyn Future<Output = weir_backend::Result<()>> + Send + '_>>;
}

/// `GET /pulse/scaling` answers held back a second at once, at most; past that
/// they answer at once (the slow ones already say "scale up").
const SCALING_DELAYS_MAX: usize = 16;
/// How long stopping (`BusHandle::stop`) or standing down (`deactivate`) lets
/// deliveries in flight finish.
pub const STOP_GRACE: Duration = Duration::from_secs(2);

pub struct Bus {
    pub backend: Arc<Backend>,
    pub settings: BusSettings,
    /// The metadata's keys in the backend's map: set at open on the embedded
    /// engine, once the cluster answered on JetStream (`owner.rs`).
    store: std::sync::OnceLock<MetaMap>,
    meta: RwLock<Arc<Meta>>,
    /// This instance serves the bus: always on the embedded engine; on JetStream while
    /// it holds the cluster's `owner` key (`owner.rs`). An instance that does not answers
    /// 503 and delivers nothing.
    active: AtomicBool,
    /// On JetStream: the `owner` key, renewed before every change of the metadata.
    owner: std::sync::OnceLock<Arc<dyn OwnerHold>>,
    /// A write of the map failed in a way that leaves what it holds unknown here
    /// (part of a change may stand); it is read again before the next change.
    stale: AtomicBool,
    /// Held across a change's edit, write and runtime update: changes are serial.
    /// Shared so that a change, once edited, finishes in a task of its own even when
    /// the request that asked for it is dropped (a client gone).
    change_lock: Arc<tokio::sync::Mutex<()>>,
    topics: RwLock<HashMap<String, Arc<LiveTopic>>>,
    /// Topic → subscriber tokens, as the metadata has them (`scope.rs`).
    by_topic: Mutex<ByTopic>,
    /// A refused write had the metadata read again: the next change brings every
    /// worker in line, not only what it touched.
    resync: AtomicBool,
    pub(crate) subscribers: Mutex<HashMap<String, LiveSubscriber>>,
    /// Deliveries in flight, across subscribers.
    pub in_flight: Semaphore,
    pub client: reqwest::Client,
    pub shutdown: watch::Receiver<bool>,
    /// Idle API connections closed at `connections_max` for a new one (`api::serve`).
    pub api_connections_evicted: Arc<std::sync::atomic::AtomicU64>,
    /// Topics whose queue was found deleted outside the bus (said once each; at
    /// most `topics_max` names).
    gone_said: Mutex<std::collections::HashSet<String>>,
    /// `GET /pulse/scaling`'s count of waiting events and when it was taken: one
    /// gathering at a time, reused for a second (`api/health.rs`'s `pulse_scaling`).
    pub(crate) waiting: tokio::sync::Mutex<Option<(std::time::Instant, u64)>>,
    /// `GET /pulse/scaling` answers held back a second at once, at most.
    pub(crate) scaling_delays: Semaphore,
}

impl Bus {
    /// Opens the metadata: with [`MetaHome::Local`], the data directory's map (an
    /// earlier weir's `meta.json` imported into it first: `meta_import.rs`), and
    /// reconciles the backend with it, the bus serving at once; with
    /// [`MetaHome::Cluster`], nothing is read until [`Bus::activate`]. Workers start with
    /// [`Bus::sync_runtime`] once the bus is in an `Arc`.
    pub async fn open(
        backend: Arc<Backend>,
        home: MetaHome,
        settings: BusSettings,
        shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<Bus> {
        let store = std::sync::OnceLock::new();
        let (meta, active) = match home {
            MetaHome::Local { map, data_dir } => {
                let map = MetaMap::new(map);
                crate::meta_import::import(&map, &data_dir).await?;
                let meta = map.load().await.context("reading the bus's metadata")?;
                let _ = store.set(map);
                (meta, true)
            }
            MetaHome::Cluster => (Meta::empty(), false),
        };
        let client = crate::client::build(&settings)?;
        let bus = Bus {
            in_flight: Semaphore::new(settings.deliveries_in_flight_max),
            backend,
            settings,
            store,
            meta: RwLock::new(Arc::new(meta)),
            active: AtomicBool::new(active),
            owner: std::sync::OnceLock::new(),
            stale: AtomicBool::new(false),
            change_lock: Arc::new(tokio::sync::Mutex::new(())),
            topics: RwLock::new(HashMap::new()),
            by_topic: Mutex::default(),
            resync: AtomicBool::new(false),
            subscribers: Mutex::new(HashMap::new()),
            client,
            shutdown,
            api_connections_evicted: Arc::default(),
            gone_said: Mutex::default(),
            waiting: tokio::sync::Mutex::new(None),
            scaling_delays: Semaphore::new(SCALING_DELAYS_MAX),
        };
        if active {
            bus.reconcile(true).await?;
        }
        Ok(bus)
    }

    /// The cluster's map, once open (`owner.rs`; the embedded engine's is set at
    /// [`Bus::open`]).
    pub fn set_map(&self, map: MetaMap) {
        let _ = self.store.set(map);
    }

    /// The metadata's map, once open.
    fn map(&self) -> Option<&MetaMap> {
        self.store.get()
    }

    /// Reads the whole metadata from the map into this instance's copy.
    async fn load_map(&self, map: &MetaMap) -> weir_backend::Result<()> {
        let meta = map.load().await?;
        *self.meta.write() = Arc::new(meta);
        self.stale.store(false, Ordering::Release);
        Ok(())
    }

    /// The `owner` key this instance renews before a change (`owner.rs`).
    pub fn set_owner(&self, owner: Arc<dyn OwnerHold>) {
        let _ = self.owner.set(owner);
    }

    /// Whether this instance serves the bus now.
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// This instance starts serving the bus (it took the cluster's `owner` key): reads
    /// the metadata the previous instance left, brings the backend in line with it (as
    /// at a start) and starts the workers.
    pub async fn activate(self: &Arc<Self>) -> anyhow::Result<()> {
        let _serial = self.hold_changes().await;
        if self.is_shutting_down() {
            anyhow::bail!("the bus is stopping");
        }
        let Some(map) = self.map() else {
            anyhow::bail!("the bus's metadata map is not open");
        };
        self.load_map(map)
            .await
            .context("reading the bus's metadata")?;
        self.reconcile(true)
            .await
            .context("bringing the bus's queues in line")?;
        self.sync_runtime();
        self.active.store(true, Ordering::Release);
        Ok(())
    }

    /// This instance stops serving the bus (another took over, or it cannot reach the
    /// cluster): no change runs any more, the workers stop (their leases go back),
    /// and what it knew is forgotten, to be read again if it serves later.
    pub async fn deactivate(&self) {
        // Not serving from now on: the API refuses, a change in flight writes
        // nothing more (`may_write`), the workers stop, and are waited for (a
        // delivery in flight gets `grace`), before anything is forgotten.
        self.active.store(false, Ordering::Release);
        self.drain_workers(STOP_GRACE).await;
        let _serial = self.hold_changes().await;
        self.subscribers.lock().clear();
        self.topics.write().clear();
        *self.by_topic.lock() = ByTopic::default();
        *self.meta.write() = Arc::new(Meta::empty());
    }

    /// Whether this instance may still change the backend and the metadata: always on
    /// the embedded engine; on JetStream while its hold of the `owner` key is fresh
    /// (`owner.rs`), so that an instance taken over from (cut off, frozen) changes
    /// nothing once another may serve.
    pub fn may_write(&self) -> bool {
        self.owner.get().is_none_or(|o| o.holds_fresh())
    }

    /// Stops every worker and waits up to `grace` for them to end (a delivery in
    /// flight finishing, leases given back).
    pub async fn drain_workers(&self, grace: Duration) {
        let tasks: Vec<tokio::task::JoinHandle<()>> = {
            let mut subs = self.subscribers.lock();
            subs.drain()
                .map(|(_, rt)| {
                    let _ = rt.stop.send(true);
                    rt.task
                })
                .collect()
        };
        let all = async {
            for task in tasks {
                let _ = task.await;
            }
        };
        if tokio::time::timeout(grace, all).await.is_err() {
            tracing::warn!("a delivery worker did not stop in time");
        }
    }

    /// The metadata as last written.
    pub fn meta(&self) -> Arc<Meta> {
        Arc::clone(&self.meta.read())
    }

    pub fn topic(&self, name: &str) -> Option<Arc<LiveTopic>> {
        self.topics.read().get(name).cloned()
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// Edits the metadata with `edit`, writes it durably, then brings the backend and
    /// the workers in line. Nothing changes when `edit` refuses, the write fails, or
    /// the backend refuses what the change needs (the previous metadata is then
    /// written back).
    pub async fn change<R>(
        self: &Arc<Self>,
        edit: impl FnOnce(&mut Meta) -> ApiResult<R>,
    ) -> ApiResult<R> {
        let serial = Arc::clone(&self.change_lock).lock_owned().await;
        if !self.is_active() {
            return Err(ApiError::standby());
        }
        self.refresh_if_stale().await?;
        let previous = self.meta();
        let mut next = Meta::clone(&previous);
        let result = edit(&mut next)?;
        let bus = Arc::clone(self);
        // Writing, reconciling and updating the workers run to the end in a task of
        // their own, holding the lock: a dropped request cannot cut a change in two.
        let applying = tokio::spawn(async move {
            let _serial = serial;
            let touched = Touched::between(&previous, &next);
            let applied = bus.apply(previous, Arc::new(next), &touched).await;
            if bus.resync.swap(false, Ordering::AcqRel) {
                bus.sync_runtime();
            } else {
                bus.sync_touched(&touched);
            }
            applied
        });
        applying
            .await
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
        Ok(result)
    }

    /// The queue of topic `name` (or a subscriber's reader on it) was found gone
    /// under its handle: deleted outside the bus (the memcache port with
    /// `reserved_queues_writable`, a tool on the cluster). The bus makes its queues
    /// and readers again as its metadata has them (a subscriber's reader at the
    /// topic's end: what the deleted queue held is gone), and says so once per
    /// topic. Before, every publish to the topic answered 500 and its workers
    /// logged an error every second until a restart.
    pub async fn topic_gone(&self, name: &str) -> weir_backend::Result<()> {
        let _held = self.hold_changes().await;
        if !self.is_active() || !self.may_write() {
            return Ok(());
        }
        // Against an empty state: the topic's queue is opened whole.
        let only = Touched {
            topics: BTreeSet::from([name.to_owned()]),
            ..Touched::default()
        };
        self.reconcile_touched(&Meta::empty(), &only).await?;
        let first = self.gone_said.lock().insert(name.to_owned());
        if first {
            tracing::warn!(
                topic = name,
                "bus: the topic's queue was deleted outside the bus; made again (the events it held are gone)"
            );
        }
        Ok(())
    }

    /// Holds changes off while the caller works on readers (replay), so that no
    /// change deletes or creates one meanwhile.
    pub async fn hold_changes(&self) -> tokio::sync::OwnedMutexGuard<()> {
        Arc::clone(&self.change_lock).lock_owned().await
    }

    /// Writes `next`, publishes it and reconciles the backend with it; when the
    /// backend refuses (no space, too many queues), puts `previous` back the same way,
    /// so that what stands is what the API answered.
    async fn apply(
        &self,
        previous: Arc<Meta>,
        next: Arc<Meta>,
        touched: &Touched,
    ) -> ApiResult<()> {
        if let Err(e) = self.write_meta(&next, &previous).await {
            self.reload_after_refused_write().await;
            return Err(e);
        }
        *self.meta.write() = Arc::clone(&next);
        self.by_topic.lock().update(&previous, &next, touched);
        let Err(e) = self.reconcile_touched(&previous, touched).await else {
            return Ok(());
        };
        let refused = ApiError::engine("applying a change", &e);
        self.write_meta(&previous, &next).await?;
        *self.meta.write() = Arc::clone(&previous);
        self.by_topic.lock().update(&next, &previous, touched);
        // Back to `previous` for what the change touched: create what is missing,
        // move nothing.
        let back = Touched {
            joined: BTreeMap::new(),
            ..Touched::between(&next, &previous)
        };
        if let Err(e) = self.reconcile_touched(&next, &back).await {
            tracing::error!(error = %e, "could not bring the backend back in line after a refused change");
        }
        Err(refused)
    }

    /// Writes what changed from `held` (what the map holds) to `meta` durably to the
    /// map (the changed keys only, compare-and-set; each write fsync'ed on the
    /// embedded engine, replicated on JetStream), once the `owner` key is renewed on
    /// JetStream: an instance another has taken over from writes nothing.
    async fn write_meta(&self, meta: &Meta, held: &Meta) -> ApiResult<()> {
        let Some(map) = self.map() else {
            return Err(ApiError::standby());
        };
        if let Some(owner) = self.owner.get() {
            owner.renew().await.map_err(|e| refused_write(&e))?;
        }
        map.write(meta, Some(held), || self.may_write())
            .await
            .map_err(|e| refused_write(&e))
    }

    /// After a write to the map failed (part of a change may stand, or another instance
    /// wrote since this one read): what stands there is read again and the backend
    /// brought in line with it.
    async fn reload_after_refused_write(&self) {
        let Some(map) = self.map() else {
            return;
        };
        // Until read again, what the map holds is not known here.
        self.stale.store(true, Ordering::Release);
        // An instance another has taken over from touches nothing more (it stops serving
        // at its next renewal).
        if let Some(owner) = self.owner.get() {
            if owner.renew().await.is_err() {
                return;
            }
        }
        match self.load_map(map).await {
            Ok(()) => {
                self.resync.store(true, Ordering::Release);
                if let Err(e) = self.reconcile(false).await {
                    tracing::error!(error = %e, "could not bring the bus's queues in line after a refused write");
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "could not read the bus's metadata again after a refused write; it is read before the next change")
            }
        }
    }

    /// Reads the map again when a refused write left it unknown (`stale`), before a
    /// change edits the metadata.
    async fn refresh_if_stale(&self) -> ApiResult<()> {
        if !self.stale.load(Ordering::Acquire) {
            return Ok(());
        }
        let Some(map) = self.map() else {
            return Err(ApiError::standby());
        };
        self.load_map(map)
            .await
            .map_err(|e| ApiError::engine("reading the bus's metadata", &e))
    }

    /// Makes the backend match the metadata, all of it (at a start, on taking the
    /// bus over, after a refused write of the map): a queue (with its retention
    /// reader) per topic, a reader per subscriber on each of its topics, a
    /// dead-letter queue per subscriber; then deletes what the metadata no longer
    /// names: everything is created before anything is deleted, so a change the
    /// backend refuses half-way has deleted nothing. The index of who is on which
    /// topic is built again here.
    ///
    /// A reader a running worker may still use is not deleted here: a take through
    /// a reader's handle may create it again (the engine's does), so a worker with
    /// stale sources would bring it back at the oldest event. The worker deletes the
    /// readers of the topics it leaves, and of every topic when its subscription is
    /// gone (`worker.rs`). At start (`startup`) no worker runs yet, and every reader
    /// not named is deleted here. File work runs on the blocking pool (the embedded
    /// backend's arms see to it).
    async fn reconcile(&self, startup: bool) -> weir_backend::Result<()> {
        let meta = self.meta();
        *self.by_topic.lock() = ByTopic::of(&meta);
        let all = Touched {
            topics: meta.topics.keys().cloned().collect(),
            subscribers: meta.subscribers.keys().cloned().collect(),
            joined: BTreeMap::new(),
        };
        let names: Vec<String> = all.topics.iter().map(|n| topic_queue(n)).collect();
        self.create_touched(&meta, None, &all).await?;
        self.delete_orphan_readers(&meta, names, startup).await?;
        self.delete_orphan_queues(&meta).await?;
        let mut map = self.topics.write();
        map.retain(|name, _| meta.topics.contains_key(name));
        Ok(())
    }

    /// Makes the backend match the metadata for what a change `touched` (from
    /// `previous` to the metadata now): the touched topics' queues and readers (a
    /// subscriber's reader on a topic it joined is moved to the topic's end), the
    /// touched subscribers' dead-letter queues; then deletes the queues of touched
    /// topics and subscribers that are gone, and readers of touched topics that no
    /// subscription and no running worker has. Nothing else is looked at: a change
    /// costs what it changes.
    async fn reconcile_touched(
        &self,
        previous: &Meta,
        touched: &Touched,
    ) -> weir_backend::Result<()> {
        if touched.is_empty() {
            return Ok(());
        }
        let meta = self.meta();
        self.create_touched(&meta, Some(previous), touched).await?;
        // A subscription's readers on the topics it left are deleted by its worker
        // (see `reconcile`), so nothing here walks a topic's readers.
        for name in touched
            .topics
            .iter()
            .filter(|n| !meta.topics.contains_key(*n))
        {
            self.fence()?;
            if let Some(gone) = self.topics.write().remove(name) {
                for w in &gone.wake {
                    w.flags.forget(name);
                }
            }
            if self.backend.delete_queue(&topic_queue(name)).await? {
                tracing::info!(topic = %name, "deleted the queue of a deleted topic");
            }
        }
        let ids: HashSet<&str> = meta.subscribers.values().map(|s| s.id.as_str()).collect();
        for token in &touched.subscribers {
            let Some(old) = previous.subscribers.get(token) else {
                continue;
            };
            if !ids.contains(old.id.as_str()) {
                self.fence()?;
                self.backend.delete_queue(&dead_queue(&old.id)).await?;
            }
        }
        Ok(())
    }

    /// Creates the queues and readers `touched` names as `meta` has them, and
    /// points the runtime's topics at their queues. A topic `previous` had already
    /// (and the runtime too) gets only the readers of the subscriptions that joined
    /// it; any other is opened whole.
    async fn create_touched(
        &self,
        meta: &Meta,
        previous: Option<&Meta>,
        touched: &Touched,
    ) -> weir_backend::Result<()> {
        // In LANES lanes at once (the engine makes that many at a time on its
        // blocking pool, each a file's work): a subscription on 1,000 topics waits
        // for a quarter of the readers' creations in a row.
        let names: Vec<&String> = touched.topics.iter().collect();
        let lane = |k: usize| {
            let names = &names;
            async move {
                for name in names.iter().skip(k).step_by(LANES) {
                    self.touch_topic(meta, previous, touched, name).await?;
                }
                weir_backend::Result::Ok(())
            }
        };
        let (a, b, c, d) = tokio::join!(lane(0), lane(1), lane(2), lane(3));
        a.and(b).and(c).and(d)?;
        for token in &touched.subscribers {
            let Some(s) = meta.subscribers.get(token) else {
                continue;
            };
            let queue = self.backend.queue(&dead_queue(&s.id)).await?;
            self.backend.reader(&queue, "").await?;
        }
        Ok(())
    }

    /// The reader names (subscriber ids) `meta` has on topic `name`, from the
    /// topic → subscribers index.
    fn reader_ids(&self, meta: &Meta, name: &str) -> Vec<String> {
        self.by_topic
            .lock()
            .subscribers(meta, name)
            .into_iter()
            .map(|s| s.id.clone())
            .collect()
    }

    /// The queue of topic `name`, kept for its retention reader and the readers of
    /// the subscribers `meta` has on it (no default reader: nobody would read it, and
    /// it would keep every event). A subscriber's reader made here starts at the
    /// topic's end; one of a subscriber that joined the topic (`touched.joined`) is
    /// moved there.
    async fn open_topic(
        &self,
        meta: &Meta,
        touched: &Touched,
        name: &str,
    ) -> weir_backend::Result<Queue> {
        let readers = self.reader_ids(meta, name);
        // The retention reader, when missing (a new topic, or deleted by other
        // means), starts at the oldest event, as the engine makes any reader: it keeps
        // what replay may need until the janitor moves it. Subscribers' start at the
        // end.
        let (queue, _) = self
            .backend
            .queue_for_readers(&topic_queue(name), &[RETENTION_READER], false)
            .await?;
        let ids: Vec<&str> = readers.iter().map(String::as_str).collect();
        if !ids.is_empty() {
            self.backend
                .queue_for_readers(&topic_queue(name), &ids, true)
                .await?;
        }
        for id in touched.joined.get(name).into_iter().flatten() {
            queue.seek_reader(id, SeekTo::End).await?;
        }
        Ok(queue)
    }

    /// [`Bus::create_touched`] for one topic.
    async fn touch_topic(
        &self,
        meta: &Meta,
        previous: Option<&Meta>,
        touched: &Touched,
        name: &str,
    ) -> weir_backend::Result<()> {
        let Some(t) = meta.topics.get(name) else {
            return Ok(());
        };
        let known = previous.is_some_and(|p| p.topics.contains_key(name));
        let queue = match self.topic(name).filter(|_| known) {
            Some(rt) => {
                self.join_topic(&rt.queue, touched, name).await?;
                rt.queue.clone()
            }
            None => self.open_topic(meta, touched, name).await?,
        };
        let mut map = self.topics.write();
        let keep_wake = map.get(name).map(|rt| rt.wake.clone()).unwrap_or_default();
        map.insert(name.to_owned(), Arc::new(live_topic(queue, t, keep_wake)));
        Ok(())
    }

    /// Makes the readers of the subscriptions that joined topic `name` (its queue
    /// there), at the topic's end; one still there (the subscription left and came
    /// back before its worker deleted it) is moved to the end.
    async fn join_topic(
        &self,
        queue: &Queue,
        touched: &Touched,
        name: &str,
    ) -> weir_backend::Result<()> {
        let mut fresh = Vec::new();
        for id in touched.joined.get(name).into_iter().flatten() {
            if queue.has_reader(id).await? {
                queue.seek_reader(id, SeekTo::End).await?;
            } else {
                fresh.push(id.as_str());
            }
        }
        if !fresh.is_empty() {
            self.backend
                .queue_for_readers(&topic_queue(name), &fresh, true)
                .await?;
        }
        Ok(())
    }

    /// Deletes the readers of the topic queues `names` that no subscription names:
    /// at `startup` every such reader; later only those of no subscriber and no
    /// running worker.
    async fn delete_orphan_readers(
        &self,
        meta: &Meta,
        names: Vec<String>,
        startup: bool,
    ) -> weir_backend::Result<()> {
        let running: HashSet<String> = self
            .subscribers
            .lock()
            .values()
            .map(|rt| rt.config.borrow().id.clone())
            .collect();
        let known: HashSet<&str> = meta.subscribers.values().map(|s| s.id.as_str()).collect();
        for queue in self.backend.stats(Some(names)).await? {
            let Some(name) = queue.name.strip_prefix(TOPIC_PREFIX) else {
                continue;
            };
            let on_topic: HashSet<String> = self.reader_ids(meta, name).into_iter().collect();
            for reader in queue.readers.iter().map(|r| &r.name) {
                if reader == RETENTION_READER {
                    continue;
                }
                let orphan = if startup {
                    !on_topic.contains(reader)
                } else {
                    !known.contains(reader.as_str()) && !running.contains(reader)
                };
                if orphan {
                    self.fence()?;
                    tracing::info!(topic = %name, reader = %reader, "deleting a reader no subscription names");
                    self.backend.delete_reader(&queue.name, reader).await?;
                }
            }
        }
        Ok(())
    }

    /// Deletes `bus:topic:*` queues of topics the metadata does not have, and
    /// `bus:dead:*` queues of subscribers it does not have.
    async fn delete_orphan_queues(&self, meta: &Meta) -> weir_backend::Result<()> {
        let ids: HashSet<&str> = meta.subscribers.values().map(|s| s.id.as_str()).collect();
        for queue in self.backend.stats(None).await? {
            let name = queue.name;
            let orphan = match (
                name.strip_prefix(TOPIC_PREFIX),
                name.strip_prefix(DEAD_PREFIX),
            ) {
                (Some(topic), _) => !meta.topics.contains_key(topic),
                (_, Some(id)) => !ids.contains(id),
                _ => false,
            };
            if orphan {
                self.fence()?;
                tracing::info!(queue = %name, "deleting a bus queue its metadata no longer names");
                self.backend.delete_queue(&name).await?;
            }
        }
        Ok(())
    }

    /// Starts a worker for each new subscriber, sends changed settings to running
    /// ones, stops those whose subscription is gone, and points each topic's wake-ups
    /// at its subscribers' workers: for everything (at a start).
    pub fn sync_runtime(self: &Arc<Self>) {
        let meta = self.meta();
        let all = Touched {
            topics: self.topics.read().keys().cloned().collect(),
            subscribers: meta
                .subscribers
                .keys()
                .chain(self.subscribers.lock().keys())
                .cloned()
                .collect(),
            joined: BTreeMap::new(),
        };
        self.sync_touched(&all);
    }

    /// [`Bus::sync_runtime`] for the topics and subscribers a change touched.
    fn sync_touched(self: &Arc<Self>, touched: &Touched) {
        let meta = self.meta();
        let mut subs = self.subscribers.lock();
        for token in &touched.subscribers {
            self.sync_worker(&mut subs, &meta, token);
        }
        let by_topic = self.by_topic.lock();
        let mut topics = self.topics.write();
        for name in &touched.topics {
            let Some(rt) = topics.get_mut(name) else {
                continue;
            };
            let wake: Vec<TopicWake> = by_topic
                .tokens(name)
                .filter_map(|token| subs.get(token))
                .map(|r| TopicWake::new(Arc::clone(&r.notify), Arc::clone(&r.flags), name))
                .collect();
            for gone in rt
                .wake
                .iter()
                .filter(|old| !wake.iter().any(|w| w.same_worker(old)))
            {
                gone.flags.forget(name);
            }
            *rt = Arc::new(LiveTopic {
                queue: rt.queue.clone(),
                epoch: rt.epoch,
                publisher: rt.publisher.clone(),
                wake,
            });
        }
    }

    /// Brings the worker of subscription `token` in line with `meta`: started,
    /// given new settings, or stopped.
    fn sync_worker(
        self: &Arc<Self>,
        subs: &mut HashMap<String, LiveSubscriber>,
        meta: &Meta,
        token: &str,
    ) {
        let Some(s) = meta.subscribers.get(token) else {
            if let Some(rt) = subs.remove(token) {
                let _ = rt.stop.send(true);
            }
            return;
        };
        let name = meta.tokens.get(token).cloned().unwrap_or_default();
        match subs.get_mut(token) {
            Some(rt) if rt.config.borrow().id == s.id => {
                rt.name = name;
                if **rt.config.borrow() != **s {
                    let _ = rt.config.send(Arc::clone(s));
                    rt.notify.notify_one();
                }
            }
            _ => {
                // New, or deleted and made again (a new id): a worker of its own.
                if let Some(old) = subs.remove(token) {
                    let _ = old.stop.send(true);
                }
                let rt =
                    crate::worker::start(Arc::clone(self) as Arc<dyn BusLink>, name, Arc::clone(s));
                subs.insert(token.to_owned(), rt);
            }
        }
    }

    /// [`Bus::may_write`] as an error.
    fn fence(&self) -> weir_backend::Result<()> {
        if self.may_write() {
            Ok(())
        } else {
            Err(weir_backend::Error::new(
                weir_backend::Kind::Conflict,
                "this instance no longer serves the bus",
            ))
        }
    }

    /// The counters of every subscriber: (token, owner name, counters).
    pub fn counters(&self) -> Vec<(String, String, Arc<SubscriberCounters>)> {
        self.subscribers
            .lock()
            .iter()
            .map(|(token, rt)| (token.clone(), rt.name.clone(), Arc::clone(&rt.counters)))
            .collect()
    }
}

impl BusLink for Bus {
    fn backend(&self) -> &weir_backend::Backend {
        &self.backend
    }

    fn settings(&self) -> &BusSettings {
        &self.settings
    }

    fn client(&self) -> &reqwest::Client {
        &self.client
    }

    fn in_flight(&self) -> &Semaphore {
        &self.in_flight
    }

    fn shutdown(&self) -> &watch::Receiver<bool> {
        &self.shutdown
    }

    fn is_shutting_down(&self) -> bool {
        Bus::is_shutting_down(self)
    }

    fn is_active(&self) -> bool {
        Bus::is_active(self)
    }

    fn may_write(&self) -> bool {
        Bus::may_write(self)
    }

    fn meta(&self) -> Arc<Meta> {
        Bus::meta(self)
    }

    fn topic(&self, name: &str) -> Option<Arc<LiveTopic>> {
        Bus::topic(self, name)
    }

    fn hold_changes(&self) -> BusFuture<'_, tokio::sync::OwnedMutexGuard<()>> {
        Box::pin(Bus::hold_changes(self))
    }

    fn topic_gone<'a>(&'a self, topic: &'a str) -> BusFuture<'a, weir_backend::Result<()>> {
        Box::pin(Bus::topic_gone(self, topic))
    }
}

/// A refused write of the map, as the API answers it: 503 on a conflict (on
/// JetStream: this instance no longer serves, or the metadata changed under it; retry),
/// else as any storage failure (507 when the disk is full).
fn refused_write(e: &weir_backend::Error) -> ApiError {
    if e.kind() == weir_backend::Kind::Conflict {
        tracing::warn!(error = %e, "the bus's metadata changed under this instance, or another instance serves the bus now");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the bus's metadata changed under this instance, or another instance serves the bus now; retry",
        )
    } else {
        ApiError::engine("writing the bus's metadata", e)
    }
}

/// Topics worked on at once by [`Bus::create_touched`] (as many as the engine
/// creates at once: `weir_backend::embedded::CREATIONS_AT_ONCE`).
const LANES: usize = 4;

/// Where [`Bus::open`] finds the metadata.
pub enum MetaHome {
    /// The backend's map when this process is its only writer (the embedded
    /// engine's), and the data directory where an earlier weir's `meta.json` may be
    /// (`meta_import.rs`).
    Local {
        map: weir_backend::SharedMap,
        data_dir: PathBuf,
    },
    /// The cluster's map (JetStream), opened later by `owner.rs`, once the
    /// cluster answers.
    Cluster,
}

/// The running form of topic `t`: its queue `queue`, waking the workers in `wake`.
fn live_topic(queue: Queue, t: &TopicMeta, wake: Vec<TopicWake>) -> LiveTopic {
    LiveTopic {
        queue,
        epoch: t.epoch,
        publisher: t.publisher.clone(),
        wake,
    }
}
