//! The connection to the cluster: its own small runtime, the client's options and
//! credentials, and what the client reports about the link.
//!
//! The front door runs several single-threaded event loops; the NATS client's
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

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::{ConnectOptions, Event, ServerAddr};
use tokio::runtime::Runtime;

use super::config::JetStreamConfig;
use super::metrics::Metrics;
use crate::{Error, Kind, Result};

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

/// The last problem the client reported, for the `backend unavailable` message.
#[derive(Default)]
pub(crate) struct LinkState {
    last_problem: Mutex<String>,
}

impl LinkState {
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
) -> Result<ConnectOptions> {
    let timeout = Duration::from_millis(config.request_timeout_ms.max(1));
    let mut options = ConnectOptions::new()
        .name("weir")
        .max_reconnects(None)
        .retry_on_initial_connect()
        .connection_timeout(timeout)
        .request_timeout(Some(timeout))
        .reconnect_delay_callback(|attempts| {
            let ms = 100u64.saturating_mul(u64::try_from(attempts).unwrap_or(u64::MAX));
            Duration::from_millis(ms).min(RECONNECT_DELAY_MAX)
        })
        .event_callback(move |event| {
            let (metrics, link) = (metrics.clone(), link.clone());
            async move { on_event(event, &metrics, &link) }
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

fn env(var: &str, setting: &str) -> Result<String> {
    std::env::var(var).map_err(|e| {
        Error::new(
            Kind::InvalidArgument,
            format!("[backend.jetstream] {setting}: environment variable {var}: {e}"),
        )
    })
}

fn on_event(event: Event, metrics: &Metrics, link: &LinkState) {
    match event {
        Event::Connected => {
            metrics.connected();
            tracing::info!("jetstream: connected");
        }
        Event::Disconnected => {
            link.set("disconnected from NATS".to_owned());
            tracing::warn!("jetstream: disconnected; reconnecting");
        }
        Event::ServerError(e) => {
            link.set(format!("NATS server error: {e}"));
            tracing::warn!("jetstream: server error: {e}");
        }
        Event::ClientError(e) => {
            link.set(format!("NATS client error: {e}"));
            tracing::warn!("jetstream: client error: {e}");
        }
        other => tracing::info!("jetstream: {other}"),
    }
}
