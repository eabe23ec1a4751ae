//! Bringing the backend up and down, and making what a queue needs on the cluster:
//! the stream, and a consumer per reader.
//!
//! The stream is created (or updated, when its configuration differs) on the first
//! successful contact: at connect when the cluster answers, otherwise by a background
//! task that retries every [`SETUP_RETRY`], and in any case before any call uses it
//! ([`Inner::ready`]: one setup at a time). Weir so comes up while the cluster is
//! down and answers `backend unavailable` until it is there.
//!
//! A queue's default reader `q~` is created before the queue is handed out: the queue
//! exists while a consumer of it does, and a sweep removes the items of a subject
//! that has none (`sweep.rs`). Creation is idempotent across instances: a create of a
//! consumer that exists (with this or another configuration, e.g. after a `flush q.r`) is
//! taken as success.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use weir::StoreOptions;

use super::api::{Api, Health};
use super::connect::{self, LinkState, OwnedRuntime};
use super::errors::{code, unavailable};
use super::handles::JetStream;
use super::inner::{Inner, PLACING_STRIPES};
use super::layout::{
    consumer_name, split_consumer, ConsumerInfo, Layout, Start, StreamInfo, PLACE_KEY,
};
use super::leases::{self, Leases};
use super::metrics::Metrics;
use super::registry::{QueueEntry, ReaderEntry, Registry};
use super::stats_cache;
use super::sweeper::Sweeper;
use crate::error::{Error, Kind, Result};
use crate::jetstream_config::JetStreamConfig;

// Queue and reader creations (consumer creations on the meta leader) running at
// once, per instance: a client naming new queues as fast as it can does not flood
// the cluster's meta leader. The same bound as the engine's (`weir_types`).
use weir_types::CREATIONS_AT_ONCE;

/// How often the background task tries to set the stream up while it cannot.
const SETUP_RETRY: Duration = Duration::from_secs(2);

/// Listings of the stream's consumers made before giving up when each changed while
/// it was made.
const NAMES_TRIES: usize = 5;

/// How long `close` waits for queued releases to be sent.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

pub(super) async fn connect(config: JetStreamConfig, options: StoreOptions) -> Result<JetStream> {
    let layout = Layout::new(&config)?;
    let runtime = OwnedRuntime::new()?;
    let handle = runtime
        .handle()
        .ok_or_else(|| Error::new(Kind::Other, "jetstream: its runtime is gone"))?;
    let metrics = Arc::new(Metrics::default());
    let link = Arc::new(LinkState::new(&config));
    let health = Arc::new(Health::default());
    let instance_id = instance_id();
    let client = connect_client(&config, &handle, &metrics, &link, &health, &instance_id).await?;
    let api = Api {
        client,
        metrics,
        request_timeout: Duration::from_millis(config.request_timeout_ms.max(1)),
        retry_for: Duration::from_millis(config.unavailable_retry_ms),
        health,
        queue_subjects: format!("{}.", layout.prefix).into(),
        side_streams: format!("{}_", layout.stream).into(),
    };
    let (leases, released) = Leases::new(Duration::from_millis(config.lease_timeout_ms.max(1)));
    let leases = Arc::new(leases);
    let instances = Arc::new(super::instances::Instances::new(
        api.clone(),
        leases.clone(),
        &layout.stream,
        &instance_id,
        &config,
    ));
    let inner = Arc::new(Inner {
        layout,
        api: api.clone(),
        options: RwLock::new(options),
        registry: Registry::default(),
        leases: leases.clone(),
        instances: instances.clone(),
        link,
        ready: AtomicBool::new(false),
        setup_lock: tokio::sync::Mutex::new(()),
        placing: std::array::from_fn(|_| tokio::sync::Mutex::new(())),
        creations: Semaphore::new(CREATIONS_AT_ONCE),
        instance_id,
        published: AtomicU64::new(0),
        stats_cache: stats_cache::Cache::default(),
        sweeper: Sweeper::default(),
        runtime: handle.clone(),
        config,
    });
    let nak_pump = handle.spawn(leases::nak_pump(api.clone(), leases.clone(), released));
    handle.spawn(leases::keepalive_pump(api, Arc::downgrade(&leases)));
    handle.spawn(super::instances::Instances::run(Arc::downgrade(&instances)));
    let every = Duration::from_millis(inner.config.sweep_ms);
    handle.spawn(super::sweep::pump(Arc::downgrade(&inner), every));
    let failover = Duration::from_millis(inner.config.failover_ms);
    handle.spawn(super::failover::failover_watch(
        Arc::downgrade(&inner),
        failover,
    ));
    let js = JetStream {
        inner,
        runtime: Mutex::new(runtime),
        nak_pump: Mutex::new(Some(nak_pump)),
    };
    first_setup(&js).await?;
    Ok(js)
}

/// The NATS client, connected on `handle` (in the background while the cluster is
/// unreachable: `retry_on_initial_connect`).
async fn connect_client(
    config: &JetStreamConfig,
    handle: &tokio::runtime::Handle,
    metrics: &Arc<Metrics>,
    link: &Arc<LinkState>,
    health: &Arc<Health>,
    instance_id: &str,
) -> Result<async_nats::Client> {
    let addrs = connect::server_addrs(config)?;
    let options = connect::options(
        config,
        metrics.clone(),
        link.clone(),
        health.clone(),
        instance_id,
    )
    .await?;
    handle
        .spawn(async move { options.connect(addrs).await })
        .await
        .map_err(|e| Error::new(Kind::Other, format!("jetstream: connecting: {e}")))?
        .map_err(|e| Error::new(Kind::Unavailable, format!("backend unavailable: {e}")))
}

/// Sets the stream up now if the cluster answers; otherwise leaves it to a background
/// task (and to the first call). A refusal (say, a stream of the same name that
/// cannot be updated to this layout) fails the start.
async fn first_setup(js: &JetStream) -> Result<()> {
    let inner = &js.inner;
    let deadline = Instant::now() + inner.api.request_timeout;
    match inner.ready(deadline).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == Kind::Unavailable => {
            tracing::warn!(
                "jetstream: {e}; weir answers `backend unavailable` until the cluster is reachable"
            );
            let weak = Arc::downgrade(inner);
            inner.runtime.spawn(async move {
                loop {
                    tokio::time::sleep(SETUP_RETRY).await;
                    let Some(inner) = weak.upgrade() else { return };
                    let deadline = Instant::now() + inner.api.request_timeout;
                    match inner.ready(deadline).await {
                        Ok(()) => return,
                        Err(e) if e.kind() == Kind::Unavailable => {}
                        Err(e) => tracing::error!("jetstream: setting the stream up: {e}"),
                    }
                }
            });
            Ok(())
        }
        Err(e) => {
            close(js).await;
            Err(e)
        }
    }
}

pub(super) async fn close(js: &JetStream) {
    let inner = &js.inner;
    inner.leases.close();
    let pump = js
        .nak_pump
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    if let Some(pump) = pump {
        let _ = tokio::time::timeout(CLOSE_WAIT, pump).await;
    }
    let instances = inner.instances.clone();
    let _ = tokio::time::timeout(CLOSE_WAIT, instances.close()).await;
    let client = inner.api.client.clone();
    let _ = tokio::time::timeout(CLOSE_WAIT, client.flush()).await;
    let _ = tokio::time::timeout(CLOSE_WAIT, client.drain()).await;
    js.runtime
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .shutdown();
}

/// Unique per process and start: pid and the start time.
fn instance_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("weir-{:x}-{:x}", std::process::id(), nanos)
}

/// A page of `CONSUMER.NAMES`.
#[derive(Deserialize, Default)]
#[serde(default)]
struct NamesPage {
    total: usize,
    consumers: Vec<String>,
}

impl Inner {
    /// Makes sure the stream is set up (and the registry filled) before a call uses it.
    pub(super) async fn ready(&self, deadline: Instant) -> Result<()> {
        if self.ready.load(Ordering::Acquire) {
            return Ok(());
        }
        let _setup = tokio::time::timeout_at(deadline, self.setup_lock.lock())
            .await
            .map_err(|_| unavailable("the stream is being set up"))?;
        if self.ready.load(Ordering::Acquire) {
            return Ok(());
        }
        self.ensure_stream(deadline).await.map_err(|e| {
            if e.kind() == Kind::Unavailable && !self.is_up() {
                let problem = self.link.last_problem();
                unavailable(format!("not connected to NATS ({problem}); {e}"))
            } else {
                e
            }
        })?;
        // Best effort: a queue not learnt now is learnt, proven, at its first use.
        if let Err(e) = self.learn_consumers(deadline).await {
            tracing::warn!(error = %e, "jetstream: the stream's consumers could not be listed; queues are learnt as they are used");
        }
        self.ready.store(true, Ordering::Release);
        Ok(())
    }

    /// The stream is gone (deleted by hand): set it up again before the next call.
    pub(super) fn stream_lost(&self) {
        self.ready.store(false, Ordering::Release);
        // A stream made again starts its sequences at 1.
        self.sweeper.forget_purges();
    }

    async fn ensure_stream(&self, deadline: Instant) -> Result<()> {
        let stream = &self.layout.stream;
        let config = self.layout.stream_config(&self.config);
        if !self
            .api
            .create_or_update_stream(stream, &config, deadline)
            .await?
        {
            tracing::info!(
                stream,
                "jetstream: the stream existed; its configuration is updated"
            );
        }
        self.remove_interest_keeper(deadline).await
    }

    /// Deletes the consumer [`super::layout::INTEREST_KEEPER`] if an earlier build
    /// left it (see there why).
    async fn remove_interest_keeper(&self, deadline: Instant) -> Result<()> {
        let name = super::layout::INTEREST_KEEPER;
        if self.delete_consumer(name, deadline).await? {
            tracing::warn!(stream = %self.layout.stream, consumer = name, "jetstream: deleted the interest keeper an earlier weir left on the stream");
        }
        Ok(())
    }

    /// Every consumer of the stream, by name. The listing comes in pages by offset,
    /// so a consumer deleted between two pages would shift the next page past a name
    /// that is still there: a listing whose total changed is made again (a sweep must
    /// not miss a reader).
    pub(super) async fn consumer_names(&self, deadline: Instant) -> Result<Vec<String>> {
        for _ in 0..NAMES_TRIES {
            if let Some(names) = self.names_once(deadline).await? {
                return Ok(names);
            }
        }
        Err(unavailable(
            "the stream's consumers kept changing while they were listed",
        ))
    }

    /// One listing; `None` when the consumers changed while it was paged. Each page
    /// after the first starts one name back and must begin with the name the last
    /// page ended with (the names come sorted), and the total must not change: a
    /// deletion and a creation between two pages leave the total as it was but shift
    /// the names.
    async fn names_once(&self, deadline: Instant) -> Result<Option<Vec<String>>> {
        let api = format!("CONSUMER.NAMES.{}", self.layout.stream);
        let mut names: Vec<String> = Vec::new();
        let mut total = None;
        loop {
            let offset = names.len().saturating_sub(1);
            let page: NamesPage = self
                .api
                .json(&api, &json!({ "offset": offset }), deadline)
                .await?;
            if *total.get_or_insert(page.total) != page.total {
                return Ok(None);
            }
            let mut got = page.consumers.into_iter();
            if let Some(last) = names.last() {
                if got.next().as_ref() != Some(last) {
                    return Ok(None);
                }
            }
            let before = names.len();
            names.extend(got);
            if names.len() == before || names.len() >= page.total {
                return Ok((names.len() == page.total).then_some(names));
            }
        }
    }

    /// Fills the registry from the stream's consumers: the queues with a default
    /// reader ([`ConsumerInfo::learnable`]), with their readers; the others are
    /// learnt when first used.
    async fn learn_consumers(&self, deadline: Instant) -> Result<()> {
        let consumers = self.consumer_list(deadline).await?;
        let lease_timeout = self.lease_timeout();
        for c in consumers.iter().filter(|c| c.learnable()) {
            if let Some((queue, _)) = split_consumer(&c.name) {
                self.registry
                    .add(queue, &self.layout, || self.queue_config(queue));
            }
        }
        for c in &consumers {
            let Some((queue, reader)) = split_consumer(&c.name) else {
                continue;
            };
            if c.config.metadata.contains_key(PLACE_KEY) {
                // Not placed yet (its maker died between the steps): it would be
                // read from its start. Its first use here places it (`place`).
                continue;
            }
            if let Some(q) = self.registry.get(queue) {
                let ack_wait = q.open_timeout().unwrap_or(lease_timeout);
                q.add_reader(&self.layout, reader, ack_wait_of(c, ack_wait));
            }
        }
        Ok(())
    }

    pub(super) async fn open_queue(&self, name: &str) -> Result<Arc<QueueEntry>> {
        weir_types::validate_queue_name(name)?;
        if let Some(q) = self.registry.get(name) {
            return Ok(q);
        }
        let deadline = self.api.deadline();
        self.ready(deadline).await?;
        let config = self.queue_config(name);
        let ack_wait = config.open_timeout.unwrap_or(self.lease_timeout());
        let info = self
            .create_consumer(name, "", ack_wait, false, deadline)
            .await?;
        let entry = self.registry.add(name, &self.layout, || config);
        entry.add_reader(&self.layout, "", ack_wait_of(&info, ack_wait));
        Ok(entry)
    }

    /// A queue kept for `readers` only: no default reader (`q~`) is made, so an item
    /// stays until each of them confirmed it, and the queue exists while any of them
    /// does. Each reader this instance has not registered yet is created before the
    /// queue is registered, so what is appended after this returns is kept for every
    /// one of them (an append while none of them exists goes at the next sweep). With
    /// `new_at_end`, a consumer made here delivers only what is published after it
    /// (`by_start_sequence` one past the stream's last sequence; an instance making it at
    /// the same moment finds it made); one that exists keeps where it stands.
    pub(super) async fn open_queue_for_readers(
        &self,
        name: &str,
        readers: &[&str],
        new_at_end: bool,
    ) -> Result<(Arc<QueueEntry>, Vec<Arc<ReaderEntry>>)> {
        weir_types::validate_queue_name(name)?;
        for r in readers {
            weir_types::validate_reader_name(r)?;
        }
        crate::readers_named::check_readers_named(readers)?;
        let registered = self.registry.get(name);
        if let Some(entry) = &registered {
            let known: Option<Vec<_>> = readers.iter().map(|r| entry.reader(r)).collect();
            if let Some(known) = known {
                return Ok((entry.clone(), known));
            }
        }
        self.ready(self.api.deadline()).await?;
        let config = self.queue_config(name);
        let ack_wait = config.open_timeout.unwrap_or(self.lease_timeout());
        let mut made = Vec::with_capacity(readers.len());
        for r in readers {
            if let Some(known) = registered.as_ref().and_then(|e| e.reader(r)) {
                made.push((*r, known.ack_wait()));
                continue;
            }
            // A deadline per reader: each one is a consumer creation of its own.
            let deadline = self.api.deadline();
            let info = self
                .create_consumer(name, r, ack_wait, new_at_end, deadline)
                .await?;
            made.push((*r, ack_wait_of(&info, ack_wait)));
        }
        let entry = self.registry.add(name, &self.layout, || config);
        entry.readers_only.store(true, Ordering::Release);
        let opened = made
            .into_iter()
            .map(|(r, wait)| entry.add_reader(&self.layout, r, wait))
            .collect();
        Ok((entry, opened))
    }

    /// The queue if it exists on the cluster (its default reader's consumer does),
    /// learnt into the registry; never creates. A queue kept for its readers (no
    /// `q~`) is not found: a `get` of it must not make a default reader, which would
    /// keep every item since nobody reads it.
    pub(super) async fn find_queue(&self, name: &str) -> Result<Option<Arc<QueueEntry>>> {
        weir_types::validate_queue_name(name)?;
        if let Some(q) = self.registry.get(name).filter(|q| q.reader("").is_some()) {
            return Ok(Some(q));
        }
        let deadline = self.api.deadline();
        self.ready(deadline).await?;
        let consumer = super::layout::consumer_name(name, "");
        let info = match self.consumer_info(&consumer, deadline).await {
            Ok(info) => info,
            Err(e) if e.kind() == Kind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let config = self.queue_config(name);
        let ack_wait = config.open_timeout.unwrap_or(self.lease_timeout());
        let entry = self.registry.add(name, &self.layout, || config);
        entry.add_reader(&self.layout, "", ack_wait_of(&info, ack_wait));
        Ok(Some(entry))
    }

    pub(super) async fn open_reader(
        &self,
        queue: &Arc<QueueEntry>,
        name: &str,
    ) -> Result<Arc<ReaderEntry>> {
        weir_types::validate_reader_name(name)?;
        if let Some(r) = queue.reader(name) {
            return Ok(r);
        }
        if name.is_empty() && queue.readers_only.load(Ordering::Acquire) {
            return Err(Error::new(
                Kind::InvalidArgument,
                format!(
                    "queue {} is kept for its named readers (a proxy's capture queue): it has no default reader",
                    queue.name
                ),
            ));
        }
        let deadline = self.api.deadline();
        self.ready(deadline).await?;
        let ack_wait = queue.open_timeout().unwrap_or(self.lease_timeout());
        let info = self
            .create_consumer(&queue.name, name, ack_wait, false, deadline)
            .await?;
        Ok(queue.add_reader(&self.layout, name, ack_wait_of(&info, ack_wait)))
    }

    /// Creates reader `reader`'s consumer, or finds it exists; its state.
    pub(super) async fn create_consumer(
        &self,
        queue: &str,
        reader: &str,
        ack_wait: Duration,
        from_now: bool,
        deadline: Instant,
    ) -> Result<ConsumerInfo> {
        let _permit = tokio::time::timeout_at(deadline, self.creations.acquire())
            .await
            .map_err(|_| unavailable("too many queues being created at once"))?;
        let name = consumer_name(queue, reader);
        // Readers made at the end, one at a time in this instance: two callers making
        // the same one at once (two CONSUMER.CREATEs, then the placing) left its
        // CONSUMER.RESET unanswered, every time (the contract test, two to six
        // callers). After the first, the next finds it made and placed.
        let _turn = match from_now {
            true => Some(self.placing[stripe_of(&name)].lock().await),
            false => None,
        };
        let start = match from_now {
            true => match self.start_after_newest(deadline).await? {
                Start::At(seq) if self.resets_consumers() => Start::Placed(seq),
                start => start,
            },
            false => {
                self.sweep_before_new_reader(queue, reader, &name, deadline)
                    .await?;
                Start::Oldest
            }
        };
        let body = self
            .layout
            .consumer_request(&self.config, queue, reader, ack_wait, start);
        self.create_or_find(&name, &body, deadline)
            .await
            .map_err(|e| maybe_made(e, queue, reader))
    }

    /// `CONSUMER.CREATE` of `name`, or the consumer that exists under that name;
    /// placed ([`Inner::place`]).
    async fn create_or_find(
        &self,
        name: &str,
        body: &serde_json::Value,
        deadline: Instant,
    ) -> Result<ConsumerInfo> {
        let stream = &self.layout.stream;
        let created = self
            .api
            .json_or_api_error::<ConsumerInfo>(
                &format!("CONSUMER.CREATE.{stream}.{name}"),
                body,
                deadline,
            )
            .await?;
        match created {
            Ok(info) => self.place(name, info, deadline).await,
            Err(e)
                if matches!(
                    e.err_code,
                    code::CONSUMER_EXISTS | code::CONSUMER_NAME_EXISTS
                ) =>
            {
                let info = self.consumer_info(name, deadline).await?;
                self.place(name, info, deadline).await
            }
            Err(e) => {
                if e.err_code == code::STREAM_NOT_FOUND {
                    self.stream_lost();
                }
                Err(e.to_error())
            }
        }
    }

    /// A named reader made at the oldest item starts at what the queue keeps for its
    /// other readers, as on the engine, not at what they all confirmed and the next
    /// sweep would remove: so the queue is swept first (see `sweep.rs` for why a
    /// reader made after a sweep loses nothing), when the reader does not exist yet.
    /// A sweep that fails leaves the new reader to meet such items once.
    async fn sweep_before_new_reader(
        &self,
        queue: &str,
        reader: &str,
        consumer: &str,
        deadline: Instant,
    ) -> Result<()> {
        if reader.is_empty() {
            return Ok(());
        }
        match self.consumer_info(consumer, deadline).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == Kind::NotFound => {
                if let Err(e) = self.sweep_queue(queue, deadline).await {
                    tracing::debug!(queue, error = %e, "jetstream: sweeping before a new reader failed");
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Whether the server this instance is connected to has `CONSUMER.RESET` (2.14 and
    /// later), so that a reader made at the end can later move back past its start.
    pub(super) fn resets_consumers(&self) -> bool {
        super::admin::has_reset(&self.api.client.server_info().version)
    }

    /// Moves a reader made at the end ([`Start::Placed`]) to where its
    /// [`PLACE_KEY`] says, then drops the key (an update of its config); its state
    /// then. A reader without the key is left as it is. Done by the instance that made
    /// it, and by any instance that finds the key (its maker died between the two steps,
    /// or two instances made it at once). The move is made only while the reader has
    /// delivered nothing since it was made (read again just before), so an instance
    /// finishing late never moves it back over what another instance's clients took.
    pub(super) async fn place(
        &self,
        name: &str,
        info: ConsumerInfo,
        deadline: Instant,
    ) -> Result<ConsumerInfo> {
        if !info.config.metadata.contains_key(PLACE_KEY) {
            return Ok(info);
        }
        let stream = &self.layout.stream;
        let api = format!("CONSUMER.INFO.{stream}.{name}");
        let raw: serde_json::Value = self.api.json(&api, &json!({}), deadline).await?;
        let Some(seq) = raw["config"]["metadata"][PLACE_KEY].as_str() else {
            // Placed meanwhile by another instance.
            return self.consumer_info(name, deadline).await;
        };
        let seq: u64 = seq.parse().unwrap_or(0);
        let untouched = raw["delivered"]["consumer_seq"].as_u64() == Some(0)
            && raw["num_ack_pending"].as_u64().unwrap_or(0) == 0;
        // Nothing delivered, so no lease of it anywhere: straight to the move.
        if seq > 0 && untouched {
            let api = format!("CONSUMER.RESET.{stream}.{name}");
            self.api
                .json::<serde::de::IgnoredAny>(&api, &json!({ "seq": seq }), deadline)
                .await?;
        }
        let mut config = raw.get("config").cloned().unwrap_or_default();
        if let Some(metadata) = config
            .get_mut("metadata")
            .and_then(serde_json::Value::as_object_mut)
        {
            // The server's own keys (`_nats.*`) are its to set.
            metadata.retain(|k, _| k != PLACE_KEY && !k.starts_with("_nats."));
        }
        let body = json!({ "stream_name": stream, "config": config, "action": "update" });
        let api = format!("CONSUMER.CREATE.{stream}.{name}");
        self.api.json(&api, &body, deadline).await
    }

    /// Where a reader made (or reset) now starts to get only what comes after the
    /// queue's newest item: one past the stream's last sequence, as its leader
    /// answers (a Direct Get may be answered by a replica behind it). For a reader
    /// filtered on the queue's subject that skips the same items as the queue's own
    /// newest would, and it is never below a reader's earlier start, which a reset
    /// may not go under. An item appended meanwhile may be in its backlog or not.
    pub(super) async fn start_after_newest(&self, deadline: Instant) -> Result<Start> {
        let api = format!("STREAM.INFO.{}", self.layout.stream);
        let info: StreamInfo = self.api.json(&api, &json!({}), deadline).await?;
        Ok(Start::At(info.state.last_seq + 1))
    }

    pub(super) async fn consumer_info(
        &self,
        consumer: &str,
        deadline: Instant,
    ) -> Result<ConsumerInfo> {
        let api = format!("CONSUMER.INFO.{}.{consumer}", self.layout.stream);
        self.api.json(&api, &json!({}), deadline).await
    }

    /// Whether the consumer is known to be gone (after a pull or an ack found nobody
    /// listening: either it is gone, or it has no leader for the moment).
    pub(super) async fn consumer_gone(&self, consumer: &str, deadline: Instant) -> Result<bool> {
        match self.consumer_info(consumer, deadline).await {
            Ok(_) => Ok(false),
            Err(e) if e.kind() == Kind::NotFound => Ok(true),
            Err(e) if e.kind() == Kind::Unavailable => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// The lock of [`Inner::placing`] for consumer `name`.
fn stripe_of(name: &str) -> usize {
    use std::hash::{BuildHasher, BuildHasherDefault};
    let hash =
        BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(name);
    usize::try_from(hash % PLACING_STRIPES as u64).unwrap_or(0)
}

/// A reader's creation that got no answer in time may still have made it, and a
/// reader keeps every item of its queue from then on: the error says so, and so does
/// the log, as for a `set` whose outcome is unknown.
fn maybe_made(e: Error, queue: &str, reader: &str) -> Error {
    if e.kind() != Kind::Unavailable {
        return e;
    }
    if reader.is_empty() {
        // A queue's default reader: the queue may exist, empty (harmless).
        return Error::new(
            Kind::Unavailable,
            format!("{e}; queue {queue} may have been made (stats lists it)"),
        );
    }
    let shown = format!("{queue}.{reader}");
    tracing::warn!(reader = %shown, error = %e, "jetstream: a reader's creation got no answer; it may exist (stats lists it, `delete` removes it)");
    Error::new(
        Kind::Unavailable,
        format!(
            "{e}; reader {shown} may have been made (stats lists it; delete {shown} removes it)"
        ),
    )
}

/// The consumer's AckWait as the server has it (`wanted` when it did not say).
fn ack_wait_of(info: &ConsumerInfo, wanted: Duration) -> Duration {
    match info.config.ack_wait {
        0 => wanted,
        ns => Duration::from_nanos(ns),
    }
}
