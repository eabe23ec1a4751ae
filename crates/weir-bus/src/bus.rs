//! `Bus`: the metadata, the topics' queues and the subscribers' delivery workers,
//! and the one way to change them.
//!
//! Every change to tokens, topics or subscriptions goes through [`Bus::change`]:
//! under one lock it edits a copy of the metadata, writes it durably (`meta.rs`'s
//! file, or `meta_map.rs`'s keys in the cluster),
//! publishes it, then brings the backend and the workers in line (`sync_runtime`).
//! The backend follows the metadata, never the reverse: a crash between the two is
//! repaired at the next start by `reconcile`, which creates what the metadata names
//! and deletes what it does not (orphan readers, queues of deleted topics).
//!
//! Queues are kept through [`weir_backend::Backend`] only. A topic's queue is made
//! with `queue_for_readers`, naming the retention reader and every subscriber: a
//! backend's default reader, which nobody here reads, would keep every event.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use axum::http::StatusCode;
use parking_lot::{Mutex, RwLock};
use tokio::sync::{watch, Notify, Semaphore};
use weir_backend::{Backend, Queue, SeekTo};

use crate::config::BusSettings;
use crate::error::{ApiError, ApiResult};
use crate::meta::{Meta, MetaFile, MetaStore, SubscriberMeta, TopicMeta};
use crate::meta_map::MetaMap;
use crate::metrics::SubscriberCounters;
use crate::names::{dead_queue, topic_queue, DEAD_PREFIX, RETENTION_READER, TOPIC_PREFIX};

/// A topic as the publish path needs it: its queue, its epoch, and the wake-ups of
/// the workers that read it.
pub struct TopicRt {
    pub queue: Queue,
    pub epoch: u32,
    pub publisher: Option<String>,
    pub wake: Vec<Arc<Notify>>,
}

/// A subscriber's running worker.
pub struct SubscriberRt {
    pub notify: Arc<Notify>,
    pub config: watch::Sender<Arc<SubscriberMeta>>,
    pub counters: Arc<SubscriberCounters>,
    pub stop: watch::Sender<bool>,
    /// The token's owner name, for metrics labels.
    pub name: String,
    /// The worker's task (it ends once stopped and its batch released).
    pub task: tokio::task::JoinHandle<()>,
}

pub struct Bus {
    pub backend: Arc<Backend>,
    pub settings: BusSettings,
    /// Shared with the blocking pool, where a file is written.
    store: Arc<MetaStore>,
    meta: RwLock<Arc<Meta>>,
    /// This door serves the bus: always on the embedded engine; on JetStream while
    /// it holds the cluster's `owner` key (`owner.rs`). A door that does not answers
    /// 503 and delivers nothing.
    active: AtomicBool,
    /// On JetStream: the `owner` key, renewed before every change of the metadata.
    owner: std::sync::OnceLock<Arc<crate::owner::Owner>>,
    /// On JetStream: a write of the map failed in a way that leaves what it holds
    /// unknown here; it is read again before the next change.
    stale: AtomicBool,
    /// Held across a change's edit, write and runtime update: changes are serial.
    /// Shared so that a change, once edited, finishes in a task of its own even when
    /// the request that asked for it is dropped (a client gone).
    change_lock: Arc<tokio::sync::Mutex<()>>,
    topics: RwLock<HashMap<String, Arc<TopicRt>>>,
    pub(crate) subscribers: Mutex<HashMap<String, SubscriberRt>>,
    /// Deliveries in flight, across subscribers.
    pub in_flight: Semaphore,
    pub client: reqwest::Client,
    pub shutdown: watch::Receiver<bool>,
    /// Idle API connections closed at `connections_max` for a new one (`api::serve`).
    pub api_connections_evicted: Arc<std::sync::atomic::AtomicU64>,
    /// Topics whose queue was found deleted outside the bus (said once each; at
    /// most `topics_max` names).
    gone_said: Mutex<std::collections::HashSet<String>>,
}

impl Bus {
    /// Opens the metadata: with `meta_dir`, the file there (see [`MetaFile::open`]),
    /// and reconciles the backend with it, the bus serving at once; with `map`
    /// instead, nothing is read until [`Bus::activate`]. Workers start with
    /// [`Bus::sync_runtime`] once the bus is in an `Arc`.
    pub async fn open(
        backend: Arc<Backend>,
        home: MetaHome,
        settings: BusSettings,
        shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<Bus> {
        let (store, meta, active) = match home {
            MetaHome::Dir(meta_dir) => {
                let (file, meta) = tokio::task::spawn_blocking(move || MetaFile::open(&meta_dir))
                    .await
                    .context("reading the bus's metadata")??;
                (MetaStore::File(file), meta, true)
            }
            MetaHome::Cluster => (MetaStore::Map(Box::default()), Meta::empty(), false),
        };
        let client = crate::client::build(&settings)?;
        let bus = Bus {
            in_flight: Semaphore::new(settings.deliveries_in_flight_max),
            backend,
            settings,
            store: Arc::new(store),
            meta: RwLock::new(Arc::new(meta)),
            active: AtomicBool::new(active),
            owner: std::sync::OnceLock::new(),
            stale: AtomicBool::new(false),
            change_lock: Arc::new(tokio::sync::Mutex::new(())),
            topics: RwLock::new(HashMap::new()),
            subscribers: Mutex::new(HashMap::new()),
            client,
            shutdown,
            api_connections_evicted: Arc::default(),
            gone_said: Mutex::default(),
        };
        if active {
            bus.reconcile(None).await?;
        }
        Ok(bus)
    }

    /// The cluster's map, once open (`owner.rs`).
    pub fn set_map(&self, map: MetaMap) {
        if let MetaStore::Map(cell) = &*self.store {
            let _ = cell.set(map);
        }
    }

    /// The cluster's map, when the metadata is there and the map is open.
    fn map(&self) -> Option<&MetaMap> {
        match &*self.store {
            MetaStore::Map(cell) => cell.get(),
            MetaStore::File(_) => None,
        }
    }

    /// Reads the whole metadata from the cluster's map into this door's copy.
    async fn load_map(&self, map: &MetaMap) -> weir_backend::Result<()> {
        let meta = map.load().await?;
        *self.meta.write() = Arc::new(meta);
        self.stale.store(false, Ordering::Release);
        Ok(())
    }

    /// The `owner` key this door renews before a change (`owner.rs`).
    pub fn set_owner(&self, owner: Arc<crate::owner::Owner>) {
        let _ = self.owner.set(owner);
    }

    /// Whether this door serves the bus now.
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// This door starts serving the bus (it took the cluster's `owner` key): reads
    /// the metadata the previous door left, brings the backend in line with it (as
    /// at a start) and starts the workers.
    pub async fn activate(self: &Arc<Self>) -> anyhow::Result<()> {
        let _serial = self.hold_changes().await;
        if self.is_shutting_down() {
            anyhow::bail!("the bus is stopping");
        }
        let MetaStore::Map(_) = &*self.store else {
            return Ok(());
        };
        let Some(map) = self.map() else {
            anyhow::bail!("the bus's metadata map is not open");
        };
        self.load_map(map)
            .await
            .context("reading the bus's metadata")?;
        self.reconcile(None)
            .await
            .context("bringing the bus's queues in line")?;
        self.sync_runtime();
        self.active.store(true, Ordering::Release);
        Ok(())
    }

    /// This door stops serving the bus (another took over, or it cannot reach the
    /// cluster): no change runs any more, the workers stop (their leases go back),
    /// and what it knew is forgotten, to be read again if it serves later.
    pub async fn deactivate(&self) {
        // Not serving from now on: the API refuses, a change in flight writes
        // nothing more (`may_write`), the workers stop, and are waited for (a
        // delivery in flight gets `grace`), before anything is forgotten.
        self.active.store(false, Ordering::Release);
        self.drain_workers(crate::STOP_GRACE).await;
        let _serial = self.hold_changes().await;
        self.subscribers.lock().clear();
        self.topics.write().clear();
        *self.meta.write() = Arc::new(Meta::empty());
    }

    /// Whether this door may still change the backend and the metadata: always on
    /// the embedded engine; on JetStream while its hold of the `owner` key is fresh
    /// (`owner.rs`), so that a door taken over from (cut off, frozen) changes
    /// nothing once another may serve.
    pub fn may_write(&self) -> bool {
        self.owner.get().is_none_or(|o| o.holds_fresh())
    }

    /// Stops every worker and waits up to `grace` for them to end (a delivery in
    /// flight finishing, leases given back).
    pub async fn drain_workers(&self, grace: std::time::Duration) {
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

    pub fn topic(&self, name: &str) -> Option<Arc<TopicRt>> {
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
            let applied = bus.apply(previous, Arc::new(next)).await;
            bus.sync_runtime();
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
        let meta = self.meta();
        self.reconcile(Some(&meta)).await?;
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
    async fn apply(&self, previous: Arc<Meta>, next: Arc<Meta>) -> ApiResult<()> {
        if let Err(e) = self.write_meta(Arc::clone(&next)).await {
            self.reload_after_refused_write(&previous).await;
            return Err(e);
        }
        *self.meta.write() = next;
        let Err(e) = self.reconcile(Some(&previous)).await else {
            return Ok(());
        };
        let refused = ApiError::engine("applying a change", &e);
        self.write_meta(Arc::clone(&previous)).await?;
        *self.meta.write() = Arc::clone(&previous);
        // Against itself: create what is missing, move nothing.
        if let Err(e) = self.reconcile(Some(&previous)).await {
            tracing::error!(error = %e, "could not bring the backend back in line after a refused change");
        }
        Err(refused)
    }

    /// Writes `meta` durably: to the file (file work and fsyncs: on the blocking
    /// pool), or to the cluster's map (what changed, compare-and-set), once the
    /// `owner` key is renewed: a door another has taken over from writes nothing.
    async fn write_meta(&self, meta: Arc<Meta>) -> ApiResult<()> {
        let store = Arc::clone(&self.store);
        if let MetaStore::Map(map) = &*store {
            let Some(map) = map.get() else {
                return Err(ApiError::standby());
            };
            if let Some(owner) = self.owner.get() {
                owner.renew().await.map_err(|e| refused_write(&e))?;
            }
            return map
                .write(&meta, || self.may_write())
                .await
                .map_err(|e| refused_write(&e));
        }
        tokio::task::spawn_blocking(move || match &*store {
            MetaStore::File(file) => file.write(&meta),
            MetaStore::Map(_) => Ok(()),
        })
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| ApiError::meta(&e))
    }

    /// After a write to the cluster's map failed (part of a change may stand, or
    /// another door wrote since this one read): what stands there is read again and
    /// the backend brought in line with it. A file's write leaves the old file.
    async fn reload_after_refused_write(&self, previous: &Meta) {
        let Some(map) = self.map() else {
            return;
        };
        // Until read again, what the map holds is not known here.
        self.stale.store(true, Ordering::Release);
        // A door another has taken over from touches nothing more (it stops serving
        // at its next renewal).
        if let Some(owner) = self.owner.get() {
            if owner.renew().await.is_err() {
                return;
            }
        }
        match self.load_map(map).await {
            Ok(()) => {
                if let Err(e) = self.reconcile(Some(previous)).await {
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

    /// Makes the backend match the metadata: a queue (with its retention reader) per
    /// topic, a reader per subscriber on each of its topics (created at the end of
    /// the topic: a new subscriber gets what is published from now on), a
    /// dead-letter queue per subscriber; then deletes what the metadata no longer
    /// names: everything is created before anything is deleted, so a change the
    /// backend refuses half-way has deleted nothing.
    ///
    /// A reader a running worker may still use is not deleted here: a take through
    /// a reader's handle may create it again (the engine's does), so a worker with
    /// stale sources would bring it back at the oldest event. The worker deletes the
    /// readers of the topics it leaves, and of every topic when its subscription is
    /// gone (`worker.rs`). At start (`previous` is `None`) no worker runs yet, and
    /// every reader not named is deleted here. A topic a subscription did not have
    /// in `previous` starts at its end even when the subscriber's reader is still
    /// there (it left and came back before its worker deleted the reader).
    /// File work runs on the blocking pool (the embedded backend's arms see to it).
    async fn reconcile(&self, previous: Option<&Meta>) -> weir_backend::Result<()> {
        let startup = previous.is_none();
        let meta = self.meta();
        let mut topics = HashMap::new();
        for (name, t) in &meta.topics {
            let queue = self.open_topic(&meta, previous, name).await?;
            topics.insert(name.clone(), (queue, t.clone()));
        }
        for s in meta.subscribers.values() {
            let queue = self.backend.queue(&dead_queue(&s.id)).await?;
            self.backend.reader(&queue, "").await?;
        }
        self.delete_orphan_readers(&meta, &topics, startup).await?;
        self.delete_orphan_queues(&meta).await?;
        let mut map = self.topics.write();
        map.retain(|name, _| topics.contains_key(name));
        for (name, (queue, t)) in topics {
            let keep_wake = map.get(&name).map(|rt| rt.wake.clone()).unwrap_or_default();
            map.insert(name, Arc::new(topic_rt(queue, &t, keep_wake)));
        }
        Ok(())
    }

    /// The queue of topic `name`, kept for its retention reader and the readers of
    /// the subscribers `meta` has on it (no default reader: nobody would read it, and
    /// it would keep every event). A subscriber's reader made here starts at the
    /// topic's end; one of a subscriber that did not have the topic in `previous` is
    /// moved there.
    async fn open_topic(
        &self,
        meta: &Meta,
        previous: Option<&Meta>,
        name: &str,
    ) -> weir_backend::Result<Queue> {
        let subscribers: Vec<&SubscriberMeta> = meta
            .subscribers
            .values()
            .filter(|s| s.topics.iter().any(|t| t == name))
            .collect();
        // The retention reader, when missing (a new topic, or deleted by other
        // means), starts at the oldest event, as the engine makes any reader: it keeps
        // what replay may need until the janitor moves it. Subscribers' start at the
        // end.
        let (queue, _) = self
            .backend
            .queue_for_readers(&topic_queue(name), &[RETENTION_READER], false)
            .await?;
        let readers: Vec<&str> = subscribers.iter().map(|s| s.id.as_str()).collect();
        if !readers.is_empty() {
            self.backend
                .queue_for_readers(&topic_queue(name), &readers, true)
                .await?;
        }
        for s in subscribers {
            let had = previous.is_none_or(|p| {
                p.subscribers
                    .values()
                    .any(|x| x.id == s.id && x.topics.iter().any(|t| t == name))
            });
            if !had {
                queue.seek_reader(&s.id, SeekTo::End).await?;
            }
        }
        Ok(queue)
    }

    /// Deletes the readers of topic queues that no subscription names: at `startup`
    /// every such reader; later only those of no subscriber and no running worker.
    async fn delete_orphan_readers(
        &self,
        meta: &Meta,
        topics: &HashMap<String, (Queue, TopicMeta)>,
        startup: bool,
    ) -> weir_backend::Result<()> {
        let running: BTreeSet<String> = self
            .subscribers
            .lock()
            .values()
            .map(|rt| rt.config.borrow().id.clone())
            .collect();
        let known: BTreeSet<&str> = meta.subscribers.values().map(|s| s.id.as_str()).collect();
        let names = topics.keys().map(|name| topic_queue(name)).collect();
        for queue in self.backend.stats(Some(names)).await? {
            let Some(name) = queue.name.strip_prefix(TOPIC_PREFIX) else {
                continue;
            };
            for reader in queue.readers.iter().map(|r| &r.name) {
                if reader == RETENTION_READER {
                    continue;
                }
                let subscribed = meta
                    .subscribers
                    .values()
                    .any(|s| s.id == *reader && s.topics.iter().any(|t| t == name));
                let orphan = if startup {
                    !subscribed
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
        for queue in self.backend.stats(None).await? {
            let name = queue.name;
            let orphan = match (
                name.strip_prefix(TOPIC_PREFIX),
                name.strip_prefix(DEAD_PREFIX),
            ) {
                (Some(topic), _) => !meta.topics.contains_key(topic),
                (_, Some(id)) => !meta.subscribers.values().any(|s| s.id == id),
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
    /// at its subscribers' workers.
    pub fn sync_runtime(self: &Arc<Self>) {
        let meta = self.meta();
        let mut subs = self.subscribers.lock();
        subs.retain(|token, rt| {
            let keep = meta.subscribers.contains_key(token);
            if !keep {
                let _ = rt.stop.send(true);
            }
            keep
        });
        for (token, s) in &meta.subscribers {
            let config = Arc::new(s.clone());
            let name = meta.tokens.get(token).cloned().unwrap_or_default();
            match subs.get_mut(token) {
                Some(rt) if rt.config.borrow().id == s.id => {
                    rt.name = name;
                    if **rt.config.borrow() != *s {
                        let _ = rt.config.send(config);
                        rt.notify.notify_one();
                    }
                }
                _ => {
                    // New, or deleted and made again (a new id): a worker of its own.
                    if let Some(old) = subs.remove(token) {
                        let _ = old.stop.send(true);
                    }
                    let rt = crate::worker::start(Arc::clone(self), name, config);
                    subs.insert(token.clone(), rt);
                }
            }
        }
        let mut topics = self.topics.write();
        for (name, rt) in topics.iter_mut() {
            let wake: Vec<Arc<Notify>> = meta
                .subscribers
                .iter()
                .filter(|(_, s)| s.topics.iter().any(|t| t == name))
                .filter_map(|(token, _)| subs.get(token).map(|r| Arc::clone(&r.notify)))
                .collect();
            *rt = Arc::new(TopicRt {
                queue: rt.queue.clone(),
                epoch: rt.epoch,
                publisher: rt.publisher.clone(),
                wake,
            });
        }
    }

    /// [`Bus::may_write`] as an error.
    fn fence(&self) -> weir_backend::Result<()> {
        if self.may_write() {
            Ok(())
        } else {
            Err(weir_backend::Error::new(
                weir_backend::Kind::Conflict,
                "this door no longer serves the bus",
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

/// A refused write of the cluster's map, as the API answers it: 503 either way (a
/// conflict: this door no longer serves, or the metadata changed under it; retry).
fn refused_write(e: &weir_backend::Error) -> ApiError {
    if e.kind() == weir_backend::Kind::Conflict {
        tracing::warn!(error = %e, "the bus's metadata changed under this door, or another door serves the bus now");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the bus's metadata changed under this door, or another door serves the bus now; retry",
        )
    } else {
        ApiError::engine("writing the bus's metadata", e)
    }
}

/// Where [`Bus::open`] finds the metadata.
pub enum MetaHome {
    /// `DIR/bus/meta.json` (the embedded engine's data directory).
    Dir(PathBuf),
    /// The cluster's map (JetStream), opened later by `owner.rs`, once the
    /// cluster answers.
    Cluster,
}

fn topic_rt(queue: Queue, t: &TopicMeta, wake: Vec<Arc<Notify>>) -> TopicRt {
    TopicRt {
        queue,
        epoch: t.epoch,
        publisher: t.publisher.clone(),
        wake,
    }
}
