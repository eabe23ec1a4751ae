//! What the backend's handles share ([`Inner`]): the cluster connection, the
//! stream's layout, the queues and readers known, the leases held, and the
//! background work's state. The files that do the work (`setup.rs`, `admin.rs`,
//! `queue.rs`, `stats.rs`, `sweep.rs`, ...) add their methods to it; this one holds
//! the state alone, so that they reach it without reaching the module that
//! composes them (`mod.rs`).

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use async_nats::connection::State;
use tokio::sync::Semaphore;
use weir::{QueueConfig, StoreOptions};

use super::api::Api;
use super::connect::LinkState;
use super::instances::Instances;
use super::layout::Layout;
use super::leases::Leases;
use super::registry::Registry;
use super::stats_cache::Cache;
use super::sweeper::Sweeper;
use crate::jetstream_config::JetStreamConfig;

/// What the handles share.
pub(crate) struct Inner {
    pub(super) config: JetStreamConfig,
    pub(super) layout: Layout,
    pub(super) api: Api,
    pub(super) options: RwLock<StoreOptions>,
    pub(super) registry: Registry,
    pub(super) leases: Arc<Leases>,
    /// The other weir instances ([`Instances`]): who gives a killed instance's leases back.
    pub(super) instances: Arc<Instances>,
    pub(super) link: Arc<LinkState>,
    /// The stream is set up and the registry filled.
    pub(super) ready: AtomicBool,
    pub(super) setup_lock: tokio::sync::Mutex<()>,
    /// One creation at a time of a given reader made at the end in this instance
    /// (`Inner::create_consumer`): locks striped by the consumer's name.
    pub(super) placing: [tokio::sync::Mutex<()>; PLACING_STRIPES],
    pub(super) creations: Semaphore,
    /// Unique per instance (and run): the prefix of its `Nats-Msg-Id`s.
    pub(super) instance_id: String,
    pub(super) published: AtomicU64,
    pub(super) stats_cache: Cache,
    /// The queues whose confirmed items are to be purged (`sweep.rs`).
    pub(super) sweeper: Sweeper,
    pub(super) runtime: tokio::runtime::Handle,
}

/// How many locks [`Inner::placing`] spreads the readers made at the end over.
pub(super) const PLACING_STRIPES: usize = 64;

impl Inner {
    pub(super) fn queue_config(&self, name: &str) -> QueueConfig {
        self.options
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .config(name)
    }

    pub(super) fn is_up(&self) -> bool {
        self.api.client.connection_state() == State::Connected
    }

    pub(super) fn lease_timeout(&self) -> Duration {
        Duration::from_millis(self.config.lease_timeout_ms.max(1))
    }
}
