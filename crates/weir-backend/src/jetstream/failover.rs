//! The failover watch: leaves a server that answers pings but not requests (cut off
//! from its peers), which the client alone would stay connected to. The connection
//! (`connect.rs`) says how the client reconnects; this task, one per backend, says when
//! to.
//!
//! It lives apart from `connect.rs` because it reads the backend's shared state
//! ([`Inner`]: its requests' health and link), which the connection itself is part of.

use std::sync::{PoisonError, Weak};
use std::time::Duration;

use super::inner::Inner;

/// Reconnects (to another server, most likely) when no request has been answered for
/// `every` while some failed; 0 turns this off. Ends with the backend.
pub(super) async fn failover_watch(inner: Weak<Inner>, every: Duration) {
    if every.is_zero() {
        return;
    }
    let tick = (every / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    loop {
        tokio::time::sleep(tick).await;
        let Some(inner) = inner.upgrade() else { return };
        let api = &inner.api;
        // A failure within the last tick: an instance that stopped asking is not stuck.
        let failing = api.health.failing_for(tick * 2);
        if failing < every || !inner.is_up() {
            continue;
        }
        let server = api.client.server_info();
        tracing::warn!(
            server_port = server.port,
            failing_ms = u64::try_from(failing.as_millis()).unwrap_or(u64::MAX),
            "jetstream: no request answered through this server; moving to another"
        );
        // Skipped for two failover periods: long enough that two servers cut off
        // together are not left for each other in turn, short enough that an instance
        // whose other servers are all gone comes back to it soon.
        let until = std::time::Instant::now() + every * 2;
        api.health
            .left
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add(server.host, server.port, until);
        api.health.answered();
        if let Err(e) = api.client.force_reconnect().await {
            tracing::warn!(error = %e, "jetstream: reconnecting");
        }
    }
}
