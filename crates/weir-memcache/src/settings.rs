//! What the memcache door runs with: its restart-only settings ([`MemcacheSettings`])
//! and the limits a `reload` may change ([`Limits`]). The root (weir-server's
//! config) builds them from the TOML file and the flags; the door reads no file.

use std::path::PathBuf;
use std::sync::Arc;

use std::time::Duration;

use crate::parse::{
    ParseLimits, GET_KEYS_MAX_DEFAULT, ITEM_SIZE_BYTES_MAX_DEFAULT, LINE_BYTES_MAX_DEFAULT,
};

pub const OPEN_READS_MAX_DEFAULT: u64 = 1;
pub const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 30_000;
pub const WAIT_MS_MAX_DEFAULT: u64 = 3_600_000;
/// The default of `queues_max`: the store's `queues_max`, the most queues clients can
/// bring into being.
pub const QUEUES_MAX_DEFAULT: usize = 10_000;

/// The limits of the memcache door that `reload` may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub line_bytes_max: usize,
    pub item_size_bytes_max: u64,
    /// Leases one connection may hold per queue and reader.
    pub open_reads_max: u64,
    pub request_timeout_ms: u64,
    pub wait_ms_max: u64,
    /// Most queues clients may create; more is `SERVER_ERROR too many queues`.
    pub queues_max: usize,
    pub shutdown_enabled: bool,
    /// Most keys of one `get`; more is `CLIENT_ERROR too many keys`.
    pub get_keys_max: usize,
    /// `flush_all` answers Kestrel's `Flushed all queues.` instead of memcache's `OK`.
    pub flush_all_kestrel: bool,
    /// `delete` and `flush` of the bus's and the proxy's queues work (they are
    /// refused by default: those doors own them).
    pub reserved_queues_writable: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            line_bytes_max: LINE_BYTES_MAX_DEFAULT,
            item_size_bytes_max: ITEM_SIZE_BYTES_MAX_DEFAULT,
            open_reads_max: OPEN_READS_MAX_DEFAULT,
            request_timeout_ms: REQUEST_TIMEOUT_MS_DEFAULT,
            wait_ms_max: WAIT_MS_MAX_DEFAULT,
            queues_max: QUEUES_MAX_DEFAULT,
            shutdown_enabled: false,
            get_keys_max: GET_KEYS_MAX_DEFAULT,
            flush_all_kestrel: false,
            reserved_queues_writable: false,
        }
    }
}

impl Limits {
    /// What the parser checks a request against.
    pub fn parse(&self) -> ParseLimits {
        ParseLimits {
            line_bytes_max: self.line_bytes_max,
            item_size_bytes_max: self.item_size_bytes_max,
            get_keys_max: self.get_keys_max,
        }
    }

    /// The longest a request may take to arrive whole.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
}

/// The memcache door's restart-only settings.
#[derive(Clone, Debug)]
pub struct MemcacheSettings {
    /// Address of the memcache port.
    pub listen: String,
    /// Event-loop threads (each a single-threaded runtime) serving connections.
    pub threads: usize,
    pub connections_max: usize,
    /// How long a stop waits for open connections to finish.
    pub shutdown_grace_ms: u64,
    /// The store's descriptor budget, derived at start and kept across reloads
    /// (`stats settings` shows it; a reload keeps it).
    pub files_open_max: usize,
    /// The limits at start.
    pub limits: Limits,
    /// Shown by `stats settings`: the process's HTTP port and data directory.
    pub http_listen: String,
    pub data_dir: PathBuf,
}

/// What `reload` runs: reads the configuration again and answers the new limits and
/// queue settings (the door then applies both). None: `reload` has no file to read
/// and answers `RELOADED` changing nothing.
pub type Reload =
    Arc<dyn Fn() -> anyhow::Result<(Limits, weir_backend::StoreOptions)> + Send + Sync + 'static>;
