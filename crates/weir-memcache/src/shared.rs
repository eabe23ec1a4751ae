//! What every connection shares: the backend (where the queues live), the settings, the
//! reloadable limits, the metrics, the reload and the shutdown signal. Its
//! own module so that the commands (`cmd`) and the accept loop (`door`) both use it
//! without importing each other.

use std::sync::atomic::{AtomicU64, Ordering};
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

/// The reloadable limits, swapped whole by a `reload`: a connection keeps a copy
/// ([`LimitsCopy`]) and runs each read's requests under it, so no request ever sees
/// some limits of one file and some of the next.
pub struct LimitsCell {
    /// Moved on after each `set`. A connection looks at it once per read (a load of a
    /// line every core only reads) and takes the lock only when it moved: a read lock
    /// per read would be a write to one shared line from every event loop.
    version: AtomicU64,
    /// Written only by `reload`.
    current: RwLock<Limits>,
}

/// A connection's copy of the limits, and which `set` it is a copy of.
#[derive(Clone, Copy, Debug, Default)]
pub struct LimitsCopy {
    /// 0 before the first [`LimitsCell::refresh`]; the cell starts at 1.
    version: u64,
    pub limits: Limits,
}

impl LimitsCell {
    pub fn new(limits: Limits) -> LimitsCell {
        LimitsCell {
            version: AtomicU64::new(1),
            current: RwLock::new(limits),
        }
    }

    /// Brings `copy` up to date when a `set` came after it. The version is read
    /// before the limits: a `set` in between only makes the next refresh read again.
    pub fn refresh(&self, copy: &mut LimitsCopy) {
        let version = self.version.load(Ordering::Acquire);
        if version != copy.version {
            copy.limits = self.get();
            copy.version = version;
        }
    }

    /// The limits in force. A poisoned lock still holds a whole `Limits` (the only
    /// writer assigns one in a single statement), so it is read all the same.
    pub fn get(&self) -> Limits {
        *self.current.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts `limits` in force, all at once; connections take them at their next read.
    pub fn set(&self, limits: Limits) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = limits;
        self.version.fetch_add(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy takes the limits at its first refresh, keeps them until a `set`, and
    /// takes the whole new set at the next refresh.
    #[test]
    fn a_copy_follows_each_set_whole() {
        let first = Limits::default();
        let cell = LimitsCell::new(first);
        let mut copy = LimitsCopy::default();
        copy.limits.get_keys_max = 1;
        cell.refresh(&mut copy);
        assert_eq!(copy.limits, first);
        let second = Limits {
            get_keys_max: 7,
            open_reads_max: 3,
            ..first
        };
        cell.set(second);
        assert_eq!(copy.limits, first, "kept until refreshed");
        cell.refresh(&mut copy);
        assert_eq!(copy.limits, second);
        assert_eq!(cell.get(), second);
    }
}
