//! Configuration: a TOML file, overridden by command-line flags.
//!
//! Three parts: `[server]` (addresses, limits of the front door), `[defaults]` (queue
//! settings for every queue) and `[queues."PATTERN"]` (settings for queues whose names
//! match a glob-like pattern; `*` matches any run of characters, `?` one character).
//! A queue takes the settings of the most specific matching section (an exact name
//! first, then the pattern with the most literal characters, then the first in
//! alphabetical order), with every key it leaves out taken from `[defaults]`. Every
//! key and its default is in `docs/configuration.md`.
//!
//! `reload` re-reads the file: queue settings and the `[server]` limits marked
//! reloadable take effect at once; addresses, the data directory, threads and
//! `max_connections` need a restart.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;
use weir::{Durability, QueueConfig, StoreOptions};

pub use weir_memcache::parse::{
    GET_KEYS_MAX_DEFAULT, ITEM_SIZE_BYTES_MAX_DEFAULT, LINE_BYTES_MAX_DEFAULT,
};
pub use weir_memcache::settings::{
    Limits, OPEN_READS_MAX_DEFAULT, QUEUES_MAX_DEFAULT, REQUEST_TIMEOUT_MS_DEFAULT,
    WAIT_MS_MAX_DEFAULT,
};

pub const LISTEN_DEFAULT: &str = "127.0.0.1:22133";
pub const HTTP_LISTEN_DEFAULT: &str = "127.0.0.1:22134";
pub const DATA_DIR_DEFAULT: &str = "./data";
pub const LOG_LEVEL_DEFAULT: &str = "info";
pub const CONNECTIONS_MAX_DEFAULT: usize = 16_384;
pub const SHUTDOWN_GRACE_MS_DEFAULT: u64 = 5_000;

/// Bounds on the limits themselves, so a typo cannot make the server unusable.
pub const LINE_BYTES_MAX_MIN: usize = 256;
pub const LINE_BYTES_MAX_MAX: usize = 1024 * 1024;
pub const OPEN_READS_MAX_MAX: u64 = 1024;
pub const GET_KEYS_MAX_MAX: usize = 65_536;
/// HTTP connections (`/health`, `/metrics`) open at once: a few scrapers and probes
/// need a handful; the cap keeps a flood of half-open ones from holding memory.
pub const HTTP_CONNECTIONS_MAX_DEFAULT: usize = 256;
/// Time an HTTP client has to send its whole request head.
pub const HTTP_HEADER_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// The environment variable the admin key may come from (the file's `admin_key` wins).
pub use weir_proxy::tools::ADMIN_KEY_ENV;
/// Bounds on the admin key's length: it guards captured requests' credentials.
pub const ADMIN_KEY_BYTES_MIN: usize = 16;
pub const ADMIN_KEY_BYTES_MAX: usize = 256;

/// The file as written; every key optional.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub server: ServerSection,
    #[serde(default)]
    pub defaults: QueueSection,
    #[serde(default)]
    pub queues: BTreeMap<String, QueueSection>,
    /// The event bus; it runs when this section is present or `--bus-listen` given.
    pub bus: Option<weir_bus::BusConfig>,
    /// The HTTP proxy; it runs when this section has listeners.
    pub proxy: Option<weir_proxy::ProxyConfig>,
    /// Where the queues live: the embedded engine (default) or a JetStream cluster.
    #[serde(default)]
    pub backend: BackendSection,
}

/// `[backend]`: `kind = "embedded"` (default) or `"jetstream"` with
/// `[backend.jetstream]`. Restart-only.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSection {
    pub kind: Option<String>,
    pub jetstream: Option<weir_backend::JetStreamConfig>,
}

/// Where the queues live, resolved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum BackendSettings {
    #[default]
    Embedded,
    JetStream(Box<weir_backend::JetStreamConfig>),
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    pub listen: Option<String>,
    pub http_listen: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub log_level: Option<String>,
    pub threads: Option<usize>,
    pub max_connections: Option<usize>,
    pub line_bytes_max: Option<usize>,
    pub item_size_bytes_max: Option<u64>,
    pub max_open_reads: Option<u64>,
    pub request_timeout_ms: Option<u64>,
    pub wait_ms_max: Option<u64>,
    pub max_queues: Option<usize>,
    pub shutdown_enabled: Option<bool>,
    pub shutdown_grace_ms: Option<u64>,
    pub get_keys_max: Option<usize>,
    pub flush_all_reply: Option<String>,
    pub reserved_queues_writable: Option<bool>,
    pub http_max_connections: Option<usize>,
    pub http_header_timeout_ms: Option<u64>,
    /// Turns on the HTTP port's admin endpoints (`/captures/...`), which then want
    /// `Authorization: Bearer KEY`.
    pub admin_key: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSection {
    pub durability: Option<String>,
    pub sync_interval_ms: Option<u64>,
    pub max_items: Option<u64>,
    pub max_bytes: Option<u64>,
    pub max_item_size_bytes: Option<u64>,
    pub max_age_ms: Option<u64>,
    pub discard_old_when_full: Option<bool>,
    pub expire_to: Option<String>,
    pub open_timeout_ms: Option<u64>,
    pub segment_size_bytes: Option<u64>,
}

/// Everything the server runs with, resolved.
#[derive(Clone, Debug)]
pub struct Settings {
    pub listen: String,
    pub http_listen: String,
    pub data_dir: PathBuf,
    pub log_level: String,
    /// Event-loop threads (each a single-threaded runtime) serving connections.
    pub threads: usize,
    pub max_connections: usize,
    pub shutdown_grace_ms: u64,
    /// HTTP connections open at once; one more is closed at once.
    pub http_max_connections: usize,
    /// Time an HTTP client has to send its request head; then it is closed.
    pub http_header_timeout_ms: u64,
    /// The HTTP port's admin endpoints are off without it.
    pub admin_key: Option<AdminKey>,
    pub limits: Limits,
    pub store: StoreOptions,
    /// The event bus's settings when it is enabled.
    pub bus: Option<weir_bus::BusSettings>,
    /// The proxy's settings when it is configured.
    pub proxy: Option<weir_proxy::ProxySettings>,
    pub backend: BackendSettings,
    /// Settings the file gives that the chosen backend ignores: logged at start.
    pub ignored: Vec<&'static str>,
}

/// Flags that override the file.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub listen: Option<String>,
    pub http_listen: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub log_level: Option<String>,
    pub threads: Option<usize>,
    pub max_connections: Option<usize>,
    /// Enables the event bus on this address.
    pub bus_listen: Option<String>,
    /// `embedded` or `jetstream`.
    pub backend: Option<String>,
    /// JetStream servers, comma-separated.
    pub nats_servers: Option<String>,
    /// JetStream stream name; its subjects become `NAME.q.<queue>`.
    pub nats_stream: Option<String>,
}

impl Settings {
    /// What the memcache door runs with; `files_open_max` is the store's descriptor
    /// budget, derived at start.
    pub fn memcache(&self, files_open_max: usize) -> weir_memcache::MemcacheSettings {
        weir_memcache::MemcacheSettings {
            listen: self.listen.clone(),
            threads: self.threads,
            max_connections: self.max_connections,
            shutdown_grace_ms: self.shutdown_grace_ms,
            files_open_max,
            limits: self.limits,
            http_listen: self.http_listen.clone(),
            data_dir: self.data_dir.clone(),
        }
    }
}

/// What the memcache door's `reload` runs: reads `path` again and answers its limits
/// and queue settings (this module stays the one reader of the file).
pub fn reload_from(path: PathBuf) -> weir_memcache::Reload {
    Arc::new(move || {
        let file = read_file(&path)?;
        let limits = resolve_limits(&file.server)?;
        let options = store_options(&file)?;
        Ok((limits, options))
    })
}

/// Reads and parses a config file.
pub fn read_file(path: &Path) -> anyhow::Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing config file {}", path.display()))
}

/// Resolves a file (or nothing) plus flags into settings, checking every value.
pub fn resolve(file: &FileConfig, overrides: &Overrides) -> anyhow::Result<Settings> {
    let s = &file.server;
    let limits = resolve_limits(s)?;
    let threads = overrides.threads.or(s.threads).unwrap_or_else(cpus);
    if threads == 0 || threads > 1024 {
        bail!("threads must be 1 to 1024, not {threads}");
    }
    let max_connections = overrides
        .max_connections
        .or(s.max_connections)
        .unwrap_or(CONNECTIONS_MAX_DEFAULT);
    if max_connections == 0 {
        bail!("max_connections must be at least 1");
    }
    let http_max_connections = s
        .http_max_connections
        .unwrap_or(HTTP_CONNECTIONS_MAX_DEFAULT);
    if http_max_connections == 0 {
        bail!("http_max_connections must be at least 1");
    }
    let http_header_timeout_ms = s
        .http_header_timeout_ms
        .unwrap_or(HTTP_HEADER_TIMEOUT_MS_DEFAULT);
    if http_header_timeout_ms == 0 {
        bail!("http_header_timeout_ms must be at least 1");
    }
    let mut settings = Settings {
        listen: overrides
            .listen
            .clone()
            .or_else(|| s.listen.clone())
            .unwrap_or_else(|| LISTEN_DEFAULT.into()),
        http_listen: overrides
            .http_listen
            .clone()
            .or_else(|| s.http_listen.clone())
            .unwrap_or_else(|| HTTP_LISTEN_DEFAULT.into()),
        data_dir: overrides
            .data_dir
            .clone()
            .or_else(|| s.data_dir.clone())
            .unwrap_or_else(|| DATA_DIR_DEFAULT.into()),
        log_level: overrides
            .log_level
            .clone()
            .or_else(|| s.log_level.clone())
            .unwrap_or_else(|| LOG_LEVEL_DEFAULT.into()),
        threads,
        max_connections,
        shutdown_grace_ms: s.shutdown_grace_ms.unwrap_or(SHUTDOWN_GRACE_MS_DEFAULT),
        http_max_connections,
        http_header_timeout_ms,
        admin_key: resolve_admin_key(s)?,
        limits,
        store: store_options(file)?,
        bus: resolve_bus(file, overrides)?,
        proxy: match &file.proxy {
            Some(p) => Some(p.resolve().map_err(|e| anyhow::anyhow!(e))?),
            None => None,
        },
        backend: resolve_backend(file, overrides)?,
        ignored: ignored_settings(file, overrides),
    };
    share_cores(file, overrides, &mut settings);
    Ok(settings)
}

/// The CPU count this process may use (1 when it cannot be told).
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Gives each front door of `weir serve` whose config sets no `threads` its share
/// of the cores ([`CoreShare`]).
fn share_cores(file: &FileConfig, overrides: &Overrides, settings: &mut Settings) {
    let doors = 1 + usize::from(settings.bus.is_some()) + usize::from(settings.proxy.is_some());
    let share = CoreShare::new(cpus(), doors);
    if overrides.threads.or(file.server.threads).is_none() {
        settings.threads = share.memcache;
    }
    let bus_set = file.bus.as_ref().and_then(|c| c.threads).is_some();
    if let Some(bus) = settings.bus.as_mut().filter(|_| !bus_set) {
        bus.threads = share.other;
    }
    let proxy_set = file.proxy.as_ref().and_then(|c| c.threads).is_some();
    if let Some(proxy) = settings.proxy.as_mut().filter(|_| !proxy_set) {
        proxy.threads = share.other;
    }
}

/// The threads of each front door whose config sets none: the CPU count shared among
/// the doors that are on (the memcache door always, the bus and the proxy when
/// configured), each runtime at least one thread, the memcache door getting what a
/// division leaves over. Before, each defaulted to the whole CPU count, so with the
/// bus and the proxy on a process ran three times as many workers as cores.
struct CoreShare {
    memcache: usize,
    other: usize,
}

impl CoreShare {
    fn new(cpus: usize, doors: usize) -> CoreShare {
        let doors = doors.max(1);
        let other = (cpus / doors).max(1);
        let memcache = cpus.saturating_sub(other * (doors - 1)).max(1);
        CoreShare { memcache, other }
    }
}

/// `[backend]` and its flags, checked against what the JetStream backend cannot do.
fn resolve_backend(file: &FileConfig, overrides: &Overrides) -> anyhow::Result<BackendSettings> {
    let kind = overrides
        .backend
        .as_deref()
        .or(file.backend.kind.as_deref())
        .unwrap_or("embedded");
    match kind {
        "embedded" => return Ok(BackendSettings::Embedded),
        // Refused here, before anything starts, rather than when connecting.
        "jetstream" if !cfg!(feature = "jetstream") => bail!(weir_backend::NO_JETSTREAM),
        "jetstream" => {}
        other => bail!("backend kind must be \"embedded\" or \"jetstream\", not {other:?}"),
    }
    let mut js = file.backend.jetstream.clone().unwrap_or_default();
    if let Some(servers) = &overrides.nats_servers {
        js.servers = servers
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
    }
    if let Some(stream) = &overrides.nats_stream {
        js.stream = stream.clone();
        js.subject_prefix = format!("{stream}.q");
    }
    check_jetstream(file, &js)?;
    Ok(BackendSettings::JetStream(Box::new(js)))
}

/// What the JetStream backend refuses at start: settings it would silently ignore
/// where ignoring them could lose or keep items the user did not expect.
fn check_jetstream(file: &FileConfig, js: &weir_backend::JetStreamConfig) -> anyhow::Result<()> {
    if js.servers.is_empty() {
        bail!("[backend.jetstream] servers: at least one nats:// URL");
    }
    if !(1..=5).contains(&js.replicas) {
        bail!(
            "[backend.jetstream] replicas must be 1 to 5, not {}",
            js.replicas
        );
    }
    let least = weir_backend::DOORS_STREAM_BYTES_MIN;
    if js.doors_stream_bytes < least {
        bail!("[backend.jetstream] doors_stream_bytes must be at least {least}");
    }
    let sections = std::iter::once(&file.defaults).chain(file.queues.values());
    for q in sections {
        if q.expire_to.is_some() {
            bail!("expire_to is not supported on the jetstream backend (the servers delete expired items themselves)");
        }
        if q.max_items.is_some() || q.max_bytes.is_some() || q.discard_old_when_full.is_some() {
            bail!("max_items, max_bytes and discard_old_when_full are not supported on the jetstream backend; set limits on the stream");
        }
    }
    Ok(())
}

/// Queue settings of the engine's files that a JetStream backend ignores: the
/// cluster's own settings decide them.
fn ignored_settings(file: &FileConfig, overrides: &Overrides) -> Vec<&'static str> {
    let kind = overrides
        .backend
        .as_deref()
        .or(file.backend.kind.as_deref());
    if kind != Some("jetstream") {
        return Vec::new();
    }
    let mut ignored = Vec::new();
    for q in std::iter::once(&file.defaults).chain(file.queues.values()) {
        for (key, set) in [
            ("durability", q.durability.is_some()),
            ("sync_interval_ms", q.sync_interval_ms.is_some()),
            ("segment_size_bytes", q.segment_size_bytes.is_some()),
        ] {
            if set && !ignored.contains(&key) {
                ignored.push(key);
            }
        }
    }
    ignored
}

/// The bus's settings when `[bus]` is in the file or `--bus-listen` was given; the
/// root key may come from `WEIR_BUS_ROOT_KEY` (or routemaster's `ROUTEMASTER_ROOT_KEY`).
fn resolve_bus(
    file: &FileConfig,
    overrides: &Overrides,
) -> anyhow::Result<Option<weir_bus::BusSettings>> {
    if file.bus.is_none() && overrides.bus_listen.is_none() {
        return Ok(None);
    }
    let env_key = ["WEIR_BUS_ROOT_KEY", "ROUTEMASTER_ROOT_KEY"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()));
    let section = file.bus.clone().unwrap_or_default();
    let settings = section
        .resolve(overrides.bus_listen.as_deref(), env_key)
        .map_err(|e| anyhow::anyhow!(e))?;
    Ok(Some(settings))
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

/// `admin_key`, else `WEIR_ADMIN_KEY`, checked: 16 to 256 visible ASCII characters
/// (it travels in a header).
fn resolve_admin_key(s: &ServerSection) -> anyhow::Result<Option<AdminKey>> {
    let key = s
        .admin_key
        .clone()
        .or_else(|| std::env::var(ADMIN_KEY_ENV).ok().filter(|v| !v.is_empty()));
    let Some(key) = key else {
        return Ok(None);
    };
    if !(ADMIN_KEY_BYTES_MIN..=ADMIN_KEY_BYTES_MAX).contains(&key.len())
        || !key.bytes().all(|b| b.is_ascii_graphic())
    {
        bail!(
            "admin_key (or {ADMIN_KEY_ENV}) must be {ADMIN_KEY_BYTES_MIN} to {ADMIN_KEY_BYTES_MAX} visible ASCII characters, no spaces"
        );
    }
    Ok(Some(AdminKey(key)))
}

/// The reloadable limits of `[server]`.
pub fn resolve_limits(s: &ServerSection) -> anyhow::Result<Limits> {
    let d = Limits::default();
    let limits = Limits {
        line_bytes_max: s.line_bytes_max.unwrap_or(d.line_bytes_max),
        item_size_bytes_max: s.item_size_bytes_max.unwrap_or(d.item_size_bytes_max),
        max_open_reads: s.max_open_reads.unwrap_or(d.max_open_reads),
        request_timeout_ms: s.request_timeout_ms.unwrap_or(d.request_timeout_ms),
        wait_ms_max: s.wait_ms_max.unwrap_or(d.wait_ms_max),
        max_queues: s.max_queues.unwrap_or(d.max_queues),
        shutdown_enabled: s.shutdown_enabled.unwrap_or(d.shutdown_enabled),
        get_keys_max: s.get_keys_max.unwrap_or(d.get_keys_max),
        flush_all_kestrel: match s.flush_all_reply.as_deref() {
            None | Some("ok") => false,
            Some("kestrel") => true,
            Some(other) => bail!("flush_all_reply must be \"ok\" or \"kestrel\", not {other:?}"),
        },
        reserved_queues_writable: s
            .reserved_queues_writable
            .unwrap_or(d.reserved_queues_writable),
    };
    if !(1..=GET_KEYS_MAX_MAX).contains(&limits.get_keys_max) {
        bail!("get_keys_max must be 1 to {GET_KEYS_MAX_MAX}");
    }
    if !(LINE_BYTES_MAX_MIN..=LINE_BYTES_MAX_MAX).contains(&limits.line_bytes_max) {
        bail!("line_bytes_max must be {LINE_BYTES_MAX_MIN} to {LINE_BYTES_MAX_MAX}");
    }
    // The whole item sits in one connection's buffer, so it must fit in memory.
    if limits.item_size_bytes_max > 1 << 30 {
        bail!("item_size_bytes_max must be at most 1 GiB");
    }
    if !(1..=OPEN_READS_MAX_MAX).contains(&limits.max_open_reads) {
        bail!("max_open_reads must be 1 to {OPEN_READS_MAX_MAX}");
    }
    if limits.request_timeout_ms == 0 {
        bail!("request_timeout_ms must be at least 1");
    }
    if limits.max_queues == 0 {
        bail!("max_queues must be at least 1");
    }
    Ok(limits)
}

/// The engine's options: `[defaults]` over the engine's defaults, a function that
/// picks the most specific `[queues."PATTERN"]` section for each queue, and
/// `max_queues` as the store's `queues_max`. `files_open_max` is left at the engine's
/// default: the server derives it at start (see `server::run`).
pub fn store_options(file: &FileConfig) -> anyhow::Result<StoreOptions> {
    let defaults =
        apply_section(&QueueConfig::default(), &file.defaults).context("in [defaults]")?;
    let mut sections = Vec::with_capacity(file.queues.len());
    for (pattern, section) in &file.queues {
        check_pattern(pattern)?;
        let config = apply_section(&defaults, section)
            .with_context(|| format!("in [queues.{pattern:?}]"))?;
        sections.push((pattern.clone(), config));
    }
    // Most specific first: exact names, then more literal characters, then by name.
    sections.sort_by(|(a, _), (b, _)| {
        let exact = |p: &str| !p.contains(['*', '?']);
        let literal = |p: &str| p.chars().filter(|c| *c != '*' && *c != '?').count();
        exact(b)
            .cmp(&exact(a))
            .then(literal(b).cmp(&literal(a)))
            .then(a.cmp(b))
    });
    let config_for = if sections.is_empty() && defaults.open_timeout.is_none() {
        None
    } else {
        let defaults = defaults.clone();
        let f: weir::ConfigFn = Arc::new(move |name: &str| {
            let mut config = sections
                .iter()
                .find(|(pattern, _)| glob_match(pattern.as_bytes(), name.as_bytes()))
                .map(|(_, config)| config.clone())
                .unwrap_or_else(|| defaults.clone());
            // The bus's and the proxy's workers hold a lease while a receiver or a
            // shadow is down, for as long as it takes: a lease timeout would deliver
            // the item twice. Their queues never get one.
            if name.starts_with("bus:") || name.starts_with("proxy:capture:") {
                config.open_timeout = None;
            }
            config
        });
        Some(f)
    };
    Ok(StoreOptions {
        defaults,
        config_for,
        queues_max: file.server.max_queues.unwrap_or(QUEUES_MAX_DEFAULT),
        ..StoreOptions::default()
    })
}

fn check_pattern(pattern: &str) -> anyhow::Result<()> {
    if pattern.is_empty() || pattern.len() > weir::NAME_LENGTH_MAX {
        bail!(
            "queue pattern {pattern:?} must be 1 to {} bytes",
            weir::NAME_LENGTH_MAX
        );
    }
    if !pattern
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_:-*?".contains(&b))
    {
        bail!("queue pattern {pattern:?} may hold only A-Z a-z 0-9 _ : - * ?");
    }
    Ok(())
}

/// Glob match: `*` any run (empty included), `?` exactly one byte.
pub fn glob_match(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == name[n]) {
            p += 1;
            n += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, n));
            p += 1;
        } else if let Some((sp, sn)) = star {
            p = sp + 1;
            n = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

/// `base` with the keys `section` sets.
fn apply_section(base: &QueueConfig, section: &QueueSection) -> anyhow::Result<QueueConfig> {
    let mut c = base.clone();
    let interval = match section.sync_interval_ms {
        Some(0) => bail!("sync_interval_ms must be at least 1"),
        Some(ms) => Some(Duration::from_millis(ms)),
        None => None,
    };
    match section.durability.as_deref() {
        None => {
            if let (Some(interval), Durability::Periodic(_)) = (interval, c.durability) {
                c.durability = Durability::Periodic(interval);
            }
        }
        Some("buffered") => c.durability = Durability::Buffered,
        Some("periodic") => {
            let previous = match c.durability {
                Durability::Periodic(i) => i,
                _ => Durability::PERIODIC_INTERVAL_DEFAULT,
            };
            c.durability = Durability::Periodic(interval.unwrap_or(previous));
        }
        Some("synced") => c.durability = Durability::Synced,
        Some(other) => {
            bail!("durability must be \"buffered\", \"periodic\" or \"synced\", not {other:?}")
        }
    }
    if let Some(v) = section.max_items {
        c.max_items = v;
    }
    if let Some(v) = section.max_bytes {
        c.max_bytes = v;
    }
    if let Some(v) = section.max_item_size_bytes {
        c.max_item_size_bytes = v;
    }
    if let Some(v) = section.max_age_ms {
        c.max_age = (v > 0).then(|| Duration::from_millis(v));
    }
    if let Some(v) = section.discard_old_when_full {
        c.discard_old_when_full = v;
    }
    if let Some(v) = &section.expire_to {
        if v.is_empty() {
            c.expire_to = None;
        } else {
            weir::validate_queue_name(v).map_err(|e| anyhow::anyhow!("expire_to: {e}"))?;
            c.expire_to = Some(v.clone());
        }
    }
    if let Some(v) = section.open_timeout_ms {
        c.open_timeout = (v > 0).then(|| Duration::from_millis(v));
    }
    if let Some(v) = section.segment_size_bytes {
        if v < 4096 {
            bail!("segment_size_bytes must be at least 4096");
        }
        c.segment_size_bytes = v;
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_doors_share_the_cores() {
        let shares = |cpus, doors| {
            let s = CoreShare::new(cpus, doors);
            (s.memcache, s.other)
        };
        assert_eq!(shares(8, 1), (8, 8));
        assert_eq!(shares(8, 2), (4, 4));
        assert_eq!(shares(8, 3), (4, 2));
        assert_eq!(shares(16, 3), (6, 5));
        // Fewer cores than doors: one thread each, never none.
        assert_eq!(shares(2, 3), (1, 1));
        assert_eq!(shares(1, 3), (1, 1));
        for cpus in 1..=64 {
            for doors in 1..=3 {
                let (memcache, other) = shares(cpus, doors);
                assert!(memcache >= 1 && other >= 1);
                assert!(memcache + other * (doors - 1) <= cpus.max(doors));
            }
        }
    }

    #[test]
    fn threads_set_in_the_config_are_kept_and_the_rest_shared() {
        let text = "[bus]\nthreads = 3\n[[proxy.listen]]\nname = \"p\"\naddr = \"127.0.0.1:0\"\n[[proxy.routes]]\nname = \"a\"\npath = \"/\"\ntargets = [\"http://127.0.0.1:1\"]\n";
        let file: FileConfig = toml::from_str(text).unwrap();
        let s = resolve(&file, &Overrides::default()).unwrap();
        let share = CoreShare::new(cpus(), 3);
        assert_eq!(s.bus.as_ref().unwrap().threads, 3, "set: kept");
        assert_eq!(s.proxy.as_ref().unwrap().threads, share.other);
        assert_eq!(s.threads, share.memcache);
        let o = Overrides {
            threads: Some(7),
            ..Overrides::default()
        };
        assert_eq!(resolve(&file, &o).unwrap().threads, 7, "--threads wins");
        // The memcache door alone keeps every core.
        let alone = resolve(&FileConfig::default(), &Overrides::default()).unwrap();
        assert_eq!(alone.threads, cpus());
    }

    #[test]
    fn globs() {
        assert!(glob_match(b"jobs_*", b"jobs_1"));
        assert!(glob_match(b"jobs_*", b"jobs_"));
        assert!(!glob_match(b"jobs_*", b"job"));
        assert!(glob_match(b"*", b"anything"));
        assert!(glob_match(b"a?c", b"abc"));
        assert!(!glob_match(b"a?c", b"ac"));
        assert!(glob_match(b"*_x_*", b"q_x_y"));
        assert!(!glob_match(b"a", b"ab"));
    }

    #[test]
    fn file_and_patterns() {
        let file: FileConfig = toml::from_str(
            r#"
            [server]
            max_open_reads = 4
            max_queues = 7
            shutdown_enabled = true
            [defaults]
            durability = "periodic"
            sync_interval_ms = 50
            max_items = 1000
            [queues."jobs_*"]
            durability = "synced"
            open_timeout_ms = 30000
            [queues."jobs_special"]
            max_items = 5
            expire_to = "dead"
            [queues."*"]
            discard_old_when_full = true
            "#,
        )
        .unwrap();
        let settings = resolve(&file, &Overrides::default()).unwrap();
        assert_eq!(settings.limits.max_open_reads, 4);
        assert_eq!(settings.limits.max_queues, 7);
        assert_eq!(Limits::default().max_queues, QUEUES_MAX_DEFAULT);
        assert!(settings.limits.shutdown_enabled);
        assert_eq!(settings.listen, LISTEN_DEFAULT);
        let d = settings.store.config("other");
        assert_eq!(
            d.durability,
            Durability::Periodic(Duration::from_millis(50))
        );
        assert_eq!(d.max_items, 1000);
        assert!(d.discard_old_when_full);
        let j = settings.store.config("jobs_1");
        assert_eq!(j.durability, Durability::Synced);
        assert_eq!(j.open_timeout, Some(Duration::from_secs(30)));
        assert!(!j.discard_old_when_full);
        let s = settings.store.config("jobs_special");
        assert_eq!(s.max_items, 5);
        assert_eq!(s.expire_to.as_deref(), Some("dead"));
        assert_eq!(
            s.durability,
            Durability::Periodic(Duration::from_millis(50))
        );
    }

    #[test]
    fn refusals() {
        for bad in [
            "[server]\nnope = 1",
            "[defaults]\ndurability = \"fast\"",
            "[defaults]\nsync_interval_ms = 0",
            "[defaults]\nexpire_to = \"a/b\"",
            "[queues.\"a/b\"]\nmax_items = 1",
            "[server]\nline_bytes_max = 10",
            "[server]\nmax_open_reads = 0",
            "[server]\nmax_queues = 0",
            "[server]\nadmin_key = \"short\"",
            "[server]\nadmin_key = \"sixteen chars with spaces\"",
        ] {
            let parsed: Result<FileConfig, _> = toml::from_str(bad);
            let resolved = parsed
                .map_err(anyhow::Error::from)
                .and_then(|f| resolve(&f, &Overrides::default()));
            assert!(resolved.is_err(), "{bad}");
        }
    }

    /// A build without the cargo feature `jetstream` refuses the JetStream backend,
    /// asked for in the file or by the flag, with an error that says why; a build
    /// with it takes it.
    #[test]
    fn the_jetstream_backend_needs_the_feature() {
        let text = "[backend]\nkind = \"jetstream\"\n[backend.jetstream]\nservers = [\"nats://127.0.0.1:4222\"]\n";
        let by_file: FileConfig = toml::from_str(text).unwrap();
        let flag = Overrides {
            backend: Some("jetstream".into()),
            nats_servers: Some("nats://127.0.0.1:4222".into()),
            ..Overrides::default()
        };
        let asked = [
            resolve(&by_file, &Overrides::default()),
            resolve(&FileConfig::default(), &flag),
        ];
        for resolved in asked {
            if cfg!(feature = "jetstream") {
                let settings = resolved.unwrap();
                assert!(matches!(settings.backend, BackendSettings::JetStream(_)));
            } else {
                let error = format!("{:#}", resolved.unwrap_err());
                assert!(error.contains("no JetStream support"), "{error}");
                assert!(error.contains("cargo feature `jetstream`"), "{error}");
            }
        }
        let embedded = resolve(&FileConfig::default(), &Overrides::default()).unwrap();
        assert_eq!(embedded.backend, BackendSettings::Embedded);
    }

    #[cfg(feature = "jetstream")]
    #[test]
    fn on_jetstream_a_proxy_may_shadow_and_record_and_the_bus_runs() {
        let backend = "[backend]\nkind = \"jetstream\"\n[backend.jetstream]\nservers = [\"nats://127.0.0.1:4222\"]\n";
        let route = |extra: &str| {
            format!(
                "{backend}[[proxy.listen]]\nname = \"m\"\naddr = \"127.0.0.1:0\"\n[[proxy.routes]]\nname = \"api\"\ntargets = [\"http://127.0.0.1:1\"]\n{extra}[[proxy.routes.shadows]]\nname = \"s\"\nurl = \"http://127.0.0.1:2\"\n"
            )
        };
        let resolved = |text: &str| {
            let file: FileConfig = toml::from_str(text)?;
            resolve(&file, &Overrides::default())
        };
        let shadowing = resolved(&route("")).unwrap();
        assert!(matches!(shadowing.backend, BackendSettings::JetStream(_)));
        assert!(shadowing.proxy.is_some());
        let recording = resolved(&route("record = true\n")).unwrap();
        let proxy = recording.proxy.as_ref().unwrap();
        assert!(proxy.routes[0].record);
        let bus = resolved(&format!("{backend}[bus]\ntakeover_ms = 3000\n")).unwrap();
        let bus = bus.bus.as_ref().unwrap();
        assert_eq!(bus.takeover, Duration::from_millis(3000));
        let short = resolved(&format!("{backend}[bus]\ntakeover_ms = 999\n")).unwrap_err();
        assert!(format!("{short:#}").contains("takeover_ms"), "{short:#}");
    }

    #[test]
    fn the_admin_key_is_checked_and_never_shown() {
        let file: FileConfig =
            toml::from_str("[server]\nadmin_key = \"0123456789abcdef-xyz\"").unwrap();
        let settings = resolve(&file, &Overrides::default()).unwrap();
        let key = settings.admin_key.as_ref().unwrap();
        assert_eq!(key.expose(), "0123456789abcdef-xyz");
        assert!(!format!("{settings:?}").contains("0123456789abcdef"));
    }

    #[test]
    fn flags_override_the_file() {
        let file: FileConfig = toml::from_str("[server]\nlisten = \"0.0.0.0:1\"").unwrap();
        let o = Overrides {
            listen: Some("127.0.0.1:2".into()),
            ..Overrides::default()
        };
        assert_eq!(resolve(&file, &o).unwrap().listen, "127.0.0.1:2");
        assert_eq!(
            resolve(&file, &Overrides::default()).unwrap().listen,
            "0.0.0.0:1"
        );
    }
}
