//! What every connection shares: the backend (where the queues live), the settings, the
//! reloadable limits, the metrics, the reload and the shutdown signal. Its
//! own module so that the commands (`cmd`) and the accept loop (`door`) both use it
//! without importing each other.

use std::sync::{PoisonError, RwLock};
use std::time::Instant;

use crate::metrics::Metrics;
use crate::settings::{Limits, MemcacheSettings, Reload};
use crate::shutdown::Shutdown;

/// Pending replies past this size are written before the next request of the same
/// read is executed (and, within a `get` or `monitor`, before the next item).
pub const OUTPUT_BYTES_FLUSH_AT: usize = 256 * 1024;

/// What every connection shares. Nothing of the other doors: the root composes them.
pub struct Shared {
    /// Where the queues live; connections get the queues and readers they have not
    /// cached from it, which creates them (within `queues_max`) without blocking an
    /// event loop.
    pub backend: std::sync::Arc<weir_backend::Backend>,
    /// The settings the door started with (`stats settings` shows the restart-only
    /// ones from here, the reloadable ones from `limits`).
    pub settings: MemcacheSettings,
    pub limits: LimitsCell,
    pub metrics: Metrics,
    /// What `reload` runs; none without a config file.
    pub reload: Option<Reload>,
    pub shutdown: Shutdown,
    pub started: Instant,
}

impl Shared {
    pub fn new(
        backend: std::sync::Arc<weir_backend::Backend>,
        settings: MemcacheSettings,
        reload: Option<Reload>,
    ) -> Shared {
        Shared {
            backend,
            limits: LimitsCell::new(settings.limits),
            metrics: Metrics::new(settings.threads),
            settings,
            reload,
            shutdown: Shutdown::default(),
            started: Instant::now(),
        }
    }

    /// Starts the graceful shutdown. The backend is told first, so that no item a
    /// closing connection gives back reaches another connection of this process:
    /// it is delivered again after the restart (see `weir::Store::begin_shutdown`).
    pub fn begin_shutdown(&self) {
        self.backend.begin_shutdown();
        self.shutdown.trigger();
    }
}

/// The reloadable limits, swapped whole by a `reload`: a connection takes one copy
/// for each read's requests ([`LimitsCell::get`]), so no request ever sees some limits
/// of one file and some of the next.
pub struct LimitsCell {
    /// A read lock for a copy of a few words, taken once per read of a connection;
    /// written only by `reload`.
    current: RwLock<Limits>,
}

impl LimitsCell {
    pub fn new(limits: Limits) -> LimitsCell {
        LimitsCell {
            current: RwLock::new(limits),
        }
    }

    /// The limits in force. A poisoned lock still holds a whole `Limits` (the only
    /// writer assigns one in a single statement), so it is read all the same.
    pub fn get(&self) -> Limits {
        *self.current.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts `limits` in force, all at once.
    pub fn set(&self, limits: Limits) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = limits;
    }
}
