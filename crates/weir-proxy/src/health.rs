//! Active health checks: with `health_path` set, each target of the route gets a
//! `GET health_path` every `health_interval_ms`; a target that does not answer 2xx
//! within the interval (at most 2 s) is left out of the rotation until a check
//! passes again. Passive health (a refused connection) works without it.

use std::sync::Arc;
use std::time::Duration;

use hyper::{Request, Uri};
use tokio::sync::watch;

use crate::body::{drain, empty};
use crate::forward::Proxy;

const CHECK_TIMEOUT_MAX: Duration = Duration::from_secs(2);

/// Checks the targets of route `index` until the proxy stops.
pub async fn run(proxy: Arc<Proxy>, index: usize, mut shutdown: watch::Receiver<bool>) {
    let Some(route) = proxy.routes.get(index) else {
        return;
    };
    let s = &route.settings;
    let Some(path) = s.health_path.clone() else {
        return;
    };
    let mut tick = tokio::time::interval(s.health_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        for (i, target) in route.balancer.targets().enumerate() {
            let uri: Result<Uri, _> = target.url(&path).parse();
            let Ok(uri) = uri else { continue };
            let mut req = Request::new(empty());
            *req.uri_mut() = uri;
            let within = s.health_interval.min(CHECK_TIMEOUT_MAX);
            let healthy = match tokio::time::timeout(within, route.client.request(req)).await {
                Ok(Ok(r)) => {
                    let ok = r.status().is_success();
                    drain(r.into_body(), within).await;
                    ok
                }
                _ => false,
            };
            if healthy {
                route.balancer.mark_up(i);
            } else {
                route
                    .balancer
                    .mark_down(i, s.health_interval.saturating_mul(2).max(s.down));
            }
        }
    }
}
