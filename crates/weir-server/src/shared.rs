//! What every connection shares: the backend (where the queues live), the settings, the
//! reloadable limits, the metrics and the shutdown signal. Its own module so that the
//! commands (`cmd`) and the server loop (`server`) both use it without importing each
//! other.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::config::{Limits, Settings};
use crate::metrics::Metrics;
use crate::parse::ParseLimits;
use crate::shutdown::Shutdown;

/// Pending replies past this size are written before the next request of the same
/// read is executed (and, within a `get` or `monitor`, before the next item).
pub const OUTPUT_BYTES_FLUSH_AT: usize = 256 * 1024;

/// What every connection shares.
pub struct Shared {
    /// Where the queues live; connections get the queues and readers they have not
    /// cached from it, which creates them (within `max_queues`) without blocking an
    /// event loop.
    pub backend: std::sync::Arc<weir_backend::Backend>,
    /// The store's descriptor budget, derived at start (see `server::files_open_max`) and
    /// kept across reloads.
    pub files_open_max: usize,
    /// The settings the server started with (`stats settings` shows the restart-only
    /// ones from here, the reloadable ones from `limits`).
    pub settings: Settings,
    pub limits: RuntimeLimits,
    pub metrics: Metrics,
    pub config_path: Option<PathBuf>,
    pub shutdown: Shutdown,
    pub started: Instant,
    /// The event bus, when enabled: its figures join `/metrics`.
    pub bus: Option<weir_bus::BusHandle>,
    /// The proxy, when configured: its figures join `/metrics`.
    pub proxy: Option<std::sync::Arc<weir_proxy::ProxyHandle>>,
    /// A `/metrics` gathering of the backend's figures is running (at most one).
    pub metrics_gathering: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Shared {
    /// What `weir proxy --http-listen` shares with its HTTP port: the proxy, the
    /// backend and the settings; no memcache port (its series stay at zero) and no bus.
    pub fn for_proxy(
        settings: Settings,
        backend: std::sync::Arc<weir_backend::Backend>,
        proxy: weir_proxy::ProxyHandle,
    ) -> std::sync::Arc<Shared> {
        std::sync::Arc::new(Shared {
            backend,
            files_open_max: settings.store.files_open_max,
            limits: RuntimeLimits::new(settings.limits),
            metrics: Metrics::new(1),
            config_path: None,
            shutdown: Shutdown::default(),
            started: Instant::now(),
            bus: None,
            proxy: Some(std::sync::Arc::new(proxy)),
            settings,
            metrics_gathering: Default::default(),
        })
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
