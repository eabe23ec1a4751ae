//! Everything `weir` runs with, resolved from the file, the flags and the
//! environment: a flag wins over the environment, the environment over the file,
//! the file over the defaults. Secrets (the admin key, the bus's root key, the
//! cluster's password or token) follow that rule too: one given in the environment
//! wins over the file's.

use std::path::PathBuf;
use std::sync::Arc;

use weir::StoreOptions;
use weir_backend::ConfigError;
use weir_memcache::settings::Limits;

use super::backend::BackendSettings;
use super::file::{read_file, FileConfig};
use super::flags::Overrides;
use super::queues::store_options;
use super::server::{
    check_connections_max, check_threads, AdminKey, ADMIN_KEY_ENV, CONNECTIONS_MAX_DEFAULT,
    DATA_DIR_DEFAULT, HTTP_CONNECTIONS_MAX_DEFAULT, HTTP_HEADER_TIMEOUT_MS_DEFAULT,
    HTTP_LISTEN_DEFAULT, LISTEN_DEFAULT, LOG_LEVEL_DEFAULT, SHUTDOWN_GRACE_MS_DEFAULT,
};

/// The environment variables the bus's root key may come from, first set first.
pub const BUS_ROOT_KEY_ENV: [&str; 2] = ["WEIR_BUS_ROOT_KEY", "ROUTEMASTER_ROOT_KEY"];

/// Everything the server runs with, resolved.
#[derive(Clone, Debug)]
pub struct Settings {
    pub listen: String,
    pub http_listen: String,
    pub data_dir: PathBuf,
    pub log_level: String,
    /// Event-loop threads (each a single-threaded runtime) serving connections.
    pub threads: usize,
    pub connections_max: usize,
    pub shutdown_grace_ms: u64,
    /// HTTP connections open at once; one more is closed at once.
    pub http_connections_max: usize,
    /// Time an HTTP client has to send its request head; then it is closed.
    pub http_header_timeout_ms: u64,
    /// The HTTP port's admin endpoints are off without it.
    pub admin_key: Option<AdminKey>,
    pub limits: Limits,
    pub store: StoreOptions,
    /// The event bus's settings when it is enabled.
    pub bus: Option<weir_bus::BusSettings>,
    /// The beanstalkd door's settings when it is enabled.
    pub beanstalk: Option<weir_beanstalk::BeanstalkSettings>,
    /// The proxy's settings when it is configured.
    pub proxy: Option<weir_proxy::ProxySettings>,
    pub backend: BackendSettings,
    /// Settings the file gives that the chosen backend ignores: logged at start.
    pub ignored: Vec<&'static str>,
}

impl Settings {
    /// What the memcache door runs with; `files_open_max` is the store's descriptor
    /// budget, derived at start.
    pub fn memcache(&self, files_open_max: usize) -> weir_memcache::MemcacheSettings {
        weir_memcache::MemcacheSettings {
            listen: self.listen.clone(),
            threads: self.threads,
            connections_max: self.connections_max,
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
        let limits = file.server.limits()?;
        let options = file_store_options(&file)?;
        Ok((limits, options))
    })
}

/// A non-empty environment variable.
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Resolves a file (or nothing) plus flags and the process's environment into
/// settings, checking every value.
pub fn resolve(file: &FileConfig, overrides: &Overrides) -> Result<Settings, ConfigError> {
    resolve_with_env(file, overrides, &env_var)
}

/// [`resolve`] with `env` answering for the environment.
pub fn resolve_with_env(
    file: &FileConfig,
    overrides: &Overrides,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Settings, ConfigError> {
    let s = &file.server;
    s.check_restart_only()?;
    // A flag's value replaces the file's, which is then not checked.
    let threads = overrides.threads.or(s.threads).unwrap_or_else(cpus);
    check_threads(threads, overrides.threads.is_some())?;
    let connections_max = overrides
        .connections_max
        .or(s.connections_max)
        .unwrap_or(CONNECTIONS_MAX_DEFAULT);
    check_connections_max(connections_max, overrides.connections_max.is_some())?;
    let pick = |flag: &Option<String>, file: &Option<String>, default: &str| {
        flag.clone()
            .or_else(|| file.clone())
            .unwrap_or_else(|| default.into())
    };
    let mut settings = Settings {
        listen: pick(&overrides.listen, &s.listen, LISTEN_DEFAULT),
        http_listen: pick(&overrides.http_listen, &s.http_listen, HTTP_LISTEN_DEFAULT),
        data_dir: overrides
            .data_dir
            .clone()
            .or_else(|| s.data_dir.clone())
            .unwrap_or_else(|| DATA_DIR_DEFAULT.into()),
        log_level: pick(&overrides.log_level, &s.log_level, LOG_LEVEL_DEFAULT),
        threads,
        connections_max,
        shutdown_grace_ms: s.shutdown_grace_ms.unwrap_or(SHUTDOWN_GRACE_MS_DEFAULT),
        http_connections_max: s
            .http_connections_max
            .unwrap_or(HTTP_CONNECTIONS_MAX_DEFAULT),
        http_header_timeout_ms: s
            .http_header_timeout_ms
            .unwrap_or(HTTP_HEADER_TIMEOUT_MS_DEFAULT),
        admin_key: s.admin_key(env(ADMIN_KEY_ENV))?,
        limits: s.limits()?,
        store: file_store_options(file)?,
        bus: resolve_bus(file, overrides, env)?,
        proxy: match &file.proxy {
            Some(p) => Some(p.resolve()?),
            None => None,
        },
        beanstalk: resolve_beanstalk(file, overrides)?,
        backend: file.backend.resolve(overrides, file.queue_sections())?,
        ignored: file.backend.ignored(overrides, file.queue_sections()),
    };
    share_cores(file, overrides, &mut settings);
    refuse_beanstalk_on_jetstream(&settings)?;
    Ok(settings)
}

/// The engine's options from `[defaults]`, `[queues]` and `[server] queues_max`.
fn file_store_options(file: &FileConfig) -> Result<StoreOptions, ConfigError> {
    let queues_max = file
        .server
        .queues_max
        .unwrap_or(weir_memcache::settings::QUEUES_MAX_DEFAULT);
    store_options(&file.defaults, &file.queues, queues_max)
}

/// The bus's settings when `[bus]` is in the file or `--bus-listen` was given; its
/// root key from the environment ([`BUS_ROOT_KEY_ENV`]) wins over the file's.
fn resolve_bus(
    file: &FileConfig,
    overrides: &Overrides,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<weir_bus::BusSettings>, ConfigError> {
    if file.bus.is_none() && overrides.bus_listen.is_none() {
        return Ok(None);
    }
    let env_key = BUS_ROOT_KEY_ENV.iter().find_map(|k| env(k));
    let section = file.bus.clone().unwrap_or_default();
    let settings = section.resolve(overrides.bus_listen.as_deref(), env_key)?;
    Ok(Some(settings))
}

/// The beanstalkd door's settings when `[beanstalk]` is in the file or
/// `--beanstalk-listen` was given.
fn resolve_beanstalk(
    file: &FileConfig,
    overrides: &Overrides,
) -> Result<Option<weir_beanstalk::BeanstalkSettings>, ConfigError> {
    if file.beanstalk.is_none() && overrides.beanstalk_listen.is_none() {
        return Ok(None);
    }
    let section = file.beanstalk.clone().unwrap_or_default();
    Ok(Some(
        section.resolve(overrides.beanstalk_listen.as_deref())?,
    ))
}

/// The beanstalkd door needs tubes, which only the embedded engine has: with the
/// JetStream backend it is refused before anything starts.
fn refuse_beanstalk_on_jetstream(settings: &Settings) -> Result<(), ConfigError> {
    let jetstream = !matches!(settings.backend, BackendSettings::Embedded);
    if settings.beanstalk.is_some() && jetstream {
        return Err(ConfigError::new(
            "beanstalk",
            "needs the embedded backend: tubes (priorities, bury, kick, jobs by id) are not supported on the jetstream backend",
        ));
    }
    Ok(())
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
pub(super) struct CoreShare {
    pub(super) memcache: usize,
    pub(super) other: usize,
}

impl CoreShare {
    pub(super) fn new(cpus: usize, doors: usize) -> CoreShare {
        let doors = doors.max(1);
        let other = (cpus / doors).max(1);
        let memcache = cpus.saturating_sub(other * (doors - 1)).max(1);
        CoreShare { memcache, other }
    }
}
