//! The connection to the cluster: its own small runtime, the client's options and
//! credentials, and what the client reports about the link.
//!
//! A weir instance runs several single-threaded event loops; the NATS client's
//! connection task, the keep-alive and nak pumps and the reapers of abandoned waits
//! run on a runtime of their own ([`RUNTIME_THREADS`] threads named `weir-nats`), so
//! none of them competes with a loop's connections or depends on a loop staying
//! alive. The loops call the client across runtimes (its calls are channel sends and
//! waits on replies, which work from any runtime). [`OwnedRuntime`] shuts the runtime
//! down without blocking, wherever it is dropped (an async context included).
//!
//! The client is started with `retry_on_initial_connect`: weir comes up even while
//! the cluster is unreachable, answers `backend unavailable` until it is there, and
//! the client reconnects by itself, for ever (`max_reconnects(None)`).
//!
//! A server that stops answering is left in seconds, two ways:
//! - it is silent (hung, stopped, cut off from the instance): the client pings it after
//!   `ping_interval_ms` of silence and drops the connection when three pings in a row
//!   go unanswered, so after three `ping_interval_ms` (6 s by default; the client's
//!   own default, 60 s, made an instance wait three minutes);
//! - it answers pings but not requests (cut off from its peers: JetStream answers
//!   "temporarily unavailable", or nothing): when no request of this instance has been
//!   answered for `failover_ms` while they kept failing ([`super::failover::failover_watch`]), the
//!   instance reconnects to another server: for two `failover_ms` after, reconnections
//!   skip the servers left ([`super::left::Left`]; the client alone picks at random, and went
//!   back to the same server about one time in three). Direct Gets and the
//!   instances' pings do not count: a server cut off from its peers still answers those
//!   from its own copy and its own clients.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::{ConnectOptions, Event, ReconnectToServer, Server, ServerAddr};
use tokio::runtime::Runtime;

use super::api::Health;
use super::metrics::Metrics;
use crate::error::{Error, Kind, Result};
use crate::jetstream_config::JetStreamConfig;

pub(crate) const RUNTIME_THREADS: usize = 2;

/// The longest pause between two reconnection attempts.
const RECONNECT_DELAY_MAX: Duration = Duration::from_secs(2);

/// A runtime shut down in the background when dropped: dropping a tokio runtime
/// where blocking is not allowed would panic.
pub(crate) struct OwnedRuntime(Option<Runtime>);

impl OwnedRuntime {
    pub fn new() -> Result<OwnedRuntime> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_THREADS)
            .thread_name("weir-nats")
            .enable_all()
            .build()
            .map(|rt| OwnedRuntime(Some(rt)))
            .map_err(|e| Error::new(Kind::Other, format!("jetstream: starting its runtime: {e}")))
    }

    pub fn handle(&self) -> Option<tokio::runtime::Handle> {
        self.0.as_ref().map(|rt| rt.handle().clone())
    }

    pub fn shutdown(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The last problem the client reported, for the `backend unavailable` message, and
/// what the log has said of the link: a streak of failed connection attempts is
/// logged once, naming the servers, and its end once.
#[derive(Default)]
pub(crate) struct LinkState {
    last_problem: Mutex<String>,
    /// The configured servers, as the log names them.
    servers: String,
    /// A streak of failures is under way (its first one was logged).
    failing: std::sync::atomic::AtomicBool,
    /// Failures of the streak not logged.
    unlogged: std::sync::atomic::AtomicU64,
}

impl LinkState {
    pub fn new(config: &JetStreamConfig) -> LinkState {
        LinkState {
            servers: config.servers.join(","),
            ..LinkState::default()
        }
    }

    /// A failure of the link: logged when it starts a streak, counted otherwise.
    fn failed(&self, what: &str) {
        use std::sync::atomic::Ordering::Relaxed;
        self.set(format!("{what} (NATS servers {})", self.servers));
        if self.failing.swap(true, Relaxed) {
            self.unlogged.fetch_add(1, Relaxed);
            tracing::debug!("jetstream: {what}");
            return;
        }
        tracing::warn!(
            servers = %self.servers,
            "jetstream: {what}; the client keeps trying (each attempt is logged at debug level until it connects)"
        );
    }

    /// Connected: ends a streak of failures, saying how long it was.
    fn connected(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.failing.swap(false, Relaxed) {
            let attempts = self.unlogged.swap(0, Relaxed).saturating_add(1);
            tracing::info!(servers = %self.servers, failures = attempts, "jetstream: connected again");
        } else {
            tracing::info!("jetstream: connected");
        }
    }

    fn set(&self, problem: String) {
        *self
            .last_problem
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = problem;
    }

    pub fn last_problem(&self) -> String {
        self.last_problem
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// `servers` as the client takes them (one string each: a comma-separated string
/// does not parse).
pub(crate) fn server_addrs(config: &JetStreamConfig) -> Result<Vec<ServerAddr>> {
    if config.servers.is_empty() {
        return Err(Error::new(
            Kind::InvalidArgument,
            "[backend.jetstream] servers: give at least one nats:// URL",
        ));
    }
    config
        .servers
        .iter()
        .map(|s| {
            s.parse::<ServerAddr>().map_err(|e| {
                Error::new(
                    Kind::InvalidArgument,
                    format!("[backend.jetstream] servers: {s:?}: {e}"),
                )
            })
        })
        .collect()
}

/// The client's options, credentials included (read here: the file, the environment).
pub(crate) async fn options(
    config: &JetStreamConfig,
    metrics: Arc<Metrics>,
    link: Arc<LinkState>,
    health: Arc<Health>,
    instance_id: &str,
) -> Result<ConnectOptions> {
    let timeout = Duration::from_millis(config.request_timeout_ms.max(1));
    let mut options = ConnectOptions::new()
        // The instance's id (`weir-<pid>-<start>`, hex): which instance a connection on a
        // server's `/connz` is.
        .name(instance_id)
        .max_reconnects(None)
        .retry_on_initial_connect()
        .connection_timeout(timeout)
        .request_timeout(Some(timeout))
        .ping_interval(Duration::from_millis(config.ping_interval_ms.max(100)))
        .reconnect_delay_callback(|attempts| {
            let ms = 100u64.saturating_mul(u64::try_from(attempts).unwrap_or(u64::MAX));
            Duration::from_millis(ms).min(RECONNECT_DELAY_MAX)
        })
        .reconnect_to_server_callback({
            let health = health.clone();
            move |servers, _| {
                let addr = leaving_choice(&health, &servers);
                std::future::ready(addr.map(|addr| ReconnectToServer { addr, delay: None }))
            }
        })
        .event_callback(move |event| {
            let (metrics, link, health) = (metrics.clone(), link.clone(), health.clone());
            async move { on_event(event, &metrics, &link, &health) }
        });
    if let Some(path) = &config.credentials_file {
        options = options.credentials_file(path).await.map_err(|e| {
            Error::new(
                Kind::InvalidArgument,
                format!("[backend.jetstream] credentials_file {path:?}: {e}"),
            )
        })?;
    }
    if let Some(user) = &config.user {
        let password = match &config.password_env {
            Some(var) => env(var, "password_env")?,
            None => String::new(),
        };
        options = options.user_and_password(user.clone(), password);
    }
    if let Some(var) = &config.token_env {
        options = options.token(env(var, "token_env")?);
    }
    Ok(options)
}

/// The choice of a reconnection ([`super::left::Left::choose`]).
pub(super) fn leaving_choice(health: &Health, servers: &[Server]) -> Option<ServerAddr> {
    health
        .left
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .choose(servers)
}

fn env(var: &str, setting: &str) -> Result<String> {
    std::env::var(var).map_err(|e| {
        Error::new(
            Kind::InvalidArgument,
            format!("[backend.jetstream] {setting}: environment variable {var}: {e}"),
        )
    })
}

fn on_event(event: Event, metrics: &Metrics, link: &LinkState, health: &Health) {
    match event {
        Event::Connected => {
            // A new server: its requests are counted from now.
            health.answered();
            health.link_up();
            metrics.connected();
            link.connected();
        }
        Event::Disconnected => {
            health.link_down();
            link.failed("disconnected from NATS; reconnecting");
        }
        Event::ServerError(e) => {
            link.set(format!("NATS server error: {e}"));
            tracing::warn!("jetstream: server error: {e}");
        }
        Event::ClientError(e) => {
            health.link_down();
            link.failed(&format!("cannot reach NATS: {e}"));
        }
        other => tracing::info!("jetstream: {other}"),
    }
}
