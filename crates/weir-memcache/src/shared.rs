//! What every connection shares: the backend (where the queues live), the settings, the
//! reloadable limits, the metrics, the reload and the shutdown signal. Its
//! own module so that the commands (`cmd`) and the accept loop (`door`) both use it
//! without importing each other.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::metrics::Metrics;
use crate::parse::ParseLimits;
use crate::settings::{Limits, MemcacheSettings, Reload};
use crate::shutdown::Shutdown;

/// Pending replies past this size are written before the next request of the same
/// read is executed (and, within a `get` or `monitor`, before the next item).
pub const OUTPUT_BYTES_FLUSH_AT: usize = 256 * 1024;

/// What every connection shares. Nothing of the other doors: the root composes them.
pub struct Shared {
    /// Where the queues live; connections get the queues and readers they have not
    /// cached from it, which creates them (within `max_queues`) without blocking an
    /// event loop.
    pub backend: std::sync::Arc<weir_backend::Backend>,
    /// The settings the door started with (`stats settings` shows the restart-only
    /// ones from here, the reloadable ones from `limits`).
    pub settings: MemcacheSettings,
    pub limits: RuntimeLimits,
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
            limits: RuntimeLimits::new(settings.limits),
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

/// The reloadable limits, readable without a lock on every request.
pub struct RuntimeLimits {
    line_bytes_max: AtomicUsize,
    item_size_bytes_max: AtomicU64,
    max_open_reads: AtomicU64,
    request_timeout_ms: AtomicU64,
    wait_ms_max: AtomicU64,
    shutdown_enabled: AtomicBool,
    get_keys_max: AtomicUsize,
    flush_all_kestrel: AtomicBool,
    reserved_queues_writable: AtomicBool,
}

impl RuntimeLimits {
    pub fn new(limits: Limits) -> RuntimeLimits {
        let r = RuntimeLimits {
            line_bytes_max: AtomicUsize::new(0),
            item_size_bytes_max: AtomicU64::new(0),
            max_open_reads: AtomicU64::new(0),
            request_timeout_ms: AtomicU64::new(0),
            wait_ms_max: AtomicU64::new(0),
            shutdown_enabled: AtomicBool::new(false),
            get_keys_max: AtomicUsize::new(0),
            flush_all_kestrel: AtomicBool::new(false),
            reserved_queues_writable: AtomicBool::new(false),
        };
        r.set(limits);
        r
    }

    pub fn set(&self, l: Limits) {
        self.line_bytes_max.store(l.line_bytes_max, Relaxed);
        self.item_size_bytes_max
            .store(l.item_size_bytes_max, Relaxed);
        self.max_open_reads.store(l.max_open_reads, Relaxed);
        self.request_timeout_ms.store(l.request_timeout_ms, Relaxed);
        self.wait_ms_max.store(l.wait_ms_max, Relaxed);
        self.shutdown_enabled.store(l.shutdown_enabled, Relaxed);
        self.get_keys_max.store(l.get_keys_max, Relaxed);
        self.flush_all_kestrel.store(l.flush_all_kestrel, Relaxed);
        self.reserved_queues_writable
            .store(l.reserved_queues_writable, Relaxed);
    }

    /// Whether `delete` and `flush` may touch the bus's and the proxy's queues.
    pub fn reserved_queues_writable(&self) -> bool {
        self.reserved_queues_writable.load(Relaxed)
    }

    /// Whether `flush_all` answers Kestrel's text instead of `OK`.
    pub fn flush_all_kestrel(&self) -> bool {
        self.flush_all_kestrel.load(Relaxed)
    }

    pub fn parse_limits(&self) -> ParseLimits {
        ParseLimits {
            line_bytes_max: self.line_bytes_max.load(Relaxed),
            item_size_bytes_max: self.item_size_bytes_max.load(Relaxed),
            get_keys_max: self.get_keys_max.load(Relaxed),
        }
    }

    pub fn max_open_reads(&self) -> u64 {
        self.max_open_reads.load(Relaxed)
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms.load(Relaxed))
    }

    pub fn wait_ms_max(&self) -> u64 {
        self.wait_ms_max.load(Relaxed)
    }

    pub fn shutdown_enabled(&self) -> bool {
        self.shutdown_enabled.load(Relaxed)
    }
}
