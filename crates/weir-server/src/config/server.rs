//! `[server]`: the memcache door's addresses and limits, the HTTP port's, the log
//! level and the admin key. [`ServerSection::limits`] checks the limits a `reload`
//! may change; [`ServerSection::admin_key`] the key of the HTTP port's admin
//! endpoints. Every key, its default and whether a reload changes it is in
//! docs/configuration.md.

use std::path::PathBuf;

use serde::Deserialize;
use weir_backend::ConfigError;
use weir_memcache::settings::Limits;

pub const LISTEN_DEFAULT: &str = "127.0.0.1:22133";
pub const HTTP_LISTEN_DEFAULT: &str = "127.0.0.1:22134";
pub const DATA_DIR_DEFAULT: &str = "./data";
pub const LOG_LEVEL_DEFAULT: &str = "info";
pub const CONNECTIONS_MAX_DEFAULT: usize = 16_384;
pub const SHUTDOWN_GRACE_MS_DEFAULT: u64 = 5_000;
/// Event-loop threads: at most this many, whatever the file says.
pub const THREADS_MAX: usize = 1024;

/// Bounds on the limits themselves, so a typo cannot make the server unusable.
pub const LINE_BYTES_MAX_MIN: usize = 256;
pub const LINE_BYTES_MAX_MAX: usize = 1024 * 1024;
pub const OPEN_READS_MAX_MAX: u64 = 1024;
pub const GET_KEYS_MAX_MAX: usize = 65_536;
/// The whole of a `set`'s data sits in one connection's buffer: it must fit in memory.
pub const ITEM_SIZE_BYTES_MAX_MAX: u64 = 1 << 30;
/// HTTP connections (`/health`, `/metrics`) open at once: a few scrapers and probes
/// need a handful; the cap keeps a flood of half-open ones from holding memory.
pub const HTTP_CONNECTIONS_MAX_DEFAULT: usize = 256;
/// Time an HTTP client has to send its whole request head.
pub const HTTP_HEADER_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// The environment variable the admin key may come from (it wins over the file's
/// `admin_key`, as every secret from the environment does).
pub use weir_proxy::tools::ADMIN_KEY_ENV;
/// Bounds on the admin key's length: it guards captured requests' credentials.
pub const ADMIN_KEY_BYTES_MIN: usize = 16;
pub const ADMIN_KEY_BYTES_MAX: usize = 256;

const _: () = assert!(LINE_BYTES_MAX_MIN < LINE_BYTES_MAX_MAX);
const _: () = assert!(ADMIN_KEY_BYTES_MIN < ADMIN_KEY_BYTES_MAX);
const _: () = assert!(CONNECTIONS_MAX_DEFAULT > 0 && HTTP_CONNECTIONS_MAX_DEFAULT > 0);

/// `[server]` as written; every key optional. Old names are aliases
/// ([`super::renamed::RENAMED`]).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    pub listen: Option<String>,
    pub http_listen: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub log_level: Option<String>,
    pub threads: Option<usize>,
    #[serde(alias = "max_connections")]
    pub connections_max: Option<usize>,
    pub line_bytes_max: Option<usize>,
    pub item_size_bytes_max: Option<u64>,
    #[serde(alias = "max_open_reads")]
    pub open_reads_max: Option<u64>,
    pub request_timeout_ms: Option<u64>,
    pub wait_ms_max: Option<u64>,
    #[serde(alias = "max_queues")]
    pub queues_max: Option<usize>,
    pub shutdown_enabled: Option<bool>,
    pub shutdown_grace_ms: Option<u64>,
    pub get_keys_max: Option<usize>,
    pub flush_all_reply: Option<String>,
    pub reserved_queues_writable: Option<bool>,
    #[serde(alias = "http_max_connections")]
    pub http_connections_max: Option<usize>,
    pub http_header_timeout_ms: Option<u64>,
    /// Turns on the HTTP port's admin endpoints (`/captures/...`), which then want
    /// `Authorization: Bearer KEY`.
    pub admin_key: Option<String>,
}

/// A secret that never shows in logs or `Debug` output.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminKey(String);

impl AdminKey {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for AdminKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminKey(..)")
    }
}

/// A key of `[server]` as a message names it.
fn key(name: &str) -> String {
    format!("server.{name}")
}

impl ServerSection {
    /// The reloadable limits, checked.
    pub fn limits(&self) -> Result<Limits, ConfigError> {
        let d = Limits::default();
        let flush_all_kestrel = match self.flush_all_reply.as_deref() {
            None | Some("ok") => false,
            Some("kestrel") => true,
            Some(other) => {
                return Err(ConfigError::one_of(
                    key("flush_all_reply"),
                    &["ok", "kestrel"],
                    other,
                ))
            }
        };
        let limits = Limits {
            line_bytes_max: self.line_bytes_max.unwrap_or(d.line_bytes_max),
            item_size_bytes_max: self.item_size_bytes_max.unwrap_or(d.item_size_bytes_max),
            open_reads_max: self.open_reads_max.unwrap_or(d.open_reads_max),
            request_timeout_ms: self.request_timeout_ms.unwrap_or(d.request_timeout_ms),
            wait_ms_max: self.wait_ms_max.unwrap_or(d.wait_ms_max),
            queues_max: self.queues_max.unwrap_or(d.queues_max),
            shutdown_enabled: self.shutdown_enabled.unwrap_or(d.shutdown_enabled),
            get_keys_max: self.get_keys_max.unwrap_or(d.get_keys_max),
            flush_all_kestrel,
            reserved_queues_writable: self
                .reserved_queues_writable
                .unwrap_or(d.reserved_queues_writable),
        };
        check_limits(&limits)?;
        Ok(limits)
    }

    /// The restart-only numbers no flag overrides, checked: `http_connections_max`,
    /// `http_header_timeout_ms` (`threads` and `connections_max` are checked as
    /// resolved, the flag's value or the file's: [`check_threads`]).
    pub fn check_restart_only(&self) -> Result<(), ConfigError> {
        if self.http_connections_max == Some(0) {
            return Err(ConfigError::at_least(key("http_connections_max"), 1));
        }
        if self.http_header_timeout_ms == Some(0) {
            return Err(ConfigError::at_least(key("http_header_timeout_ms"), 1));
        }
        Ok(())
    }

    /// The admin key: `from_env` (`WEIR_ADMIN_KEY`) when set, else the file's
    /// `admin_key`; checked: 16 to 256 visible ASCII characters (it travels in a
    /// header).
    pub fn admin_key(&self, from_env: Option<String>) -> Result<Option<AdminKey>, ConfigError> {
        let Some(key) = from_env.or_else(|| self.admin_key.clone()) else {
            return Ok(None);
        };
        if !(ADMIN_KEY_BYTES_MIN..=ADMIN_KEY_BYTES_MAX).contains(&key.len())
            || !key.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(ConfigError::new(
                "server.admin_key",
                format!("(or {ADMIN_KEY_ENV}) must be {ADMIN_KEY_BYTES_MIN} to {ADMIN_KEY_BYTES_MAX} visible ASCII characters, no spaces"),
            ));
        }
        Ok(Some(AdminKey(key)))
    }
}

/// Event-loop threads: 1 to [`THREADS_MAX`]; `from_flag` names `--threads` in the
/// error, else `server.threads`.
pub fn check_threads(threads: usize, from_flag: bool) -> Result<(), ConfigError> {
    if (1..=THREADS_MAX).contains(&threads) {
        return Ok(());
    }
    let name = if from_flag {
        "--threads".to_string()
    } else {
        key("threads")
    };
    Err(ConfigError::range(name, 1, THREADS_MAX))
}

/// Connections open at once: at least 1; `from_flag` names `--connections-max`.
pub fn check_connections_max(connections_max: usize, from_flag: bool) -> Result<(), ConfigError> {
    if connections_max >= 1 {
        return Ok(());
    }
    let name = if from_flag {
        "--connections-max".to_string()
    } else {
        key("connections_max")
    };
    Err(ConfigError::at_least(name, 1))
}

fn check_limits(limits: &Limits) -> Result<(), ConfigError> {
    if !(1..=GET_KEYS_MAX_MAX).contains(&limits.get_keys_max) {
        return Err(ConfigError::range(key("get_keys_max"), 1, GET_KEYS_MAX_MAX));
    }
    if !(LINE_BYTES_MAX_MIN..=LINE_BYTES_MAX_MAX).contains(&limits.line_bytes_max) {
        return Err(ConfigError::range(
            key("line_bytes_max"),
            LINE_BYTES_MAX_MIN,
            LINE_BYTES_MAX_MAX,
        ));
    }
    if limits.item_size_bytes_max > ITEM_SIZE_BYTES_MAX_MAX {
        return Err(ConfigError::new(
            key("item_size_bytes_max"),
            "must be at most 1 GiB",
        ));
    }
    if !(1..=OPEN_READS_MAX_MAX).contains(&limits.open_reads_max) {
        return Err(ConfigError::range(
            key("open_reads_max"),
            1,
            OPEN_READS_MAX_MAX,
        ));
    }
    if limits.request_timeout_ms == 0 {
        return Err(ConfigError::at_least(key("request_timeout_ms"), 1));
    }
    if limits.queues_max == 0 {
        return Err(ConfigError::at_least(key("queues_max"), 1));
    }
    Ok(())
}
