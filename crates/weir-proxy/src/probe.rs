//! A shadow's health, as its replays see it. A shadow is down from the moment a
//! replay finds its connection refused, broken or timed out, or gets a 5xx that does
//! not count as delivered; from then on, one task probes it (`HEAD probe_path`,
//! every `probe_interval_ms`, the first at once) and no replay is sent to it until a
//! probe is answered with a status other than 502, 503 and 504 (what a gateway or
//! load balancer answers for an application that is not there; any other answer,
//! even a 404, 405 or 501 to the `HEAD`, is the application answering). Replays waiting out a backoff are
//! woken as soon as a probe finds the shadow back after it failed at least once (an
//! outage, not one failing request), so replay resumes within a probe interval of
//! the shadow's return rather than after a long backoff; a wait `Retry-After` asked
//! for is kept in full.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::header::{HeaderValue, HOST};
use hyper::{Method, Request};
use tokio::sync::watch;

use crate::body::empty;
use crate::client::HttpClient;
use crate::config::ShadowSettings;
use crate::replay_request::REPLAY_HEADER;

/// A probe waits at most this long for its answer (or the shadow's `timeout_ms`).
const PROBE_TIMEOUT_MAX: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug)]
struct State {
    up: bool,
    /// Outages ended: a probe found the shadow back after one failed.
    recoveries: u64,
}

/// Whether a shadow is up, and how many outages it came back from; with what
/// probing the shadow takes while it is down.
pub struct Health {
    probed: Arc<Probed>,
}

/// A shadow as its probe sees it.
struct Probed {
    state: watch::Sender<State>,
    route: String,
    settings: ShadowSettings,
    /// The shadow's client (its replays' pool).
    client: HttpClient,
    shutdown: watch::Receiver<bool>,
}

impl Health {
    /// A shadow of `route`, up until a replay finds it down.
    pub fn new(
        route: &str,
        settings: &ShadowSettings,
        client: HttpClient,
        shutdown: watch::Receiver<bool>,
    ) -> Health {
        let state = watch::Sender::new(State {
            up: true,
            recoveries: 0,
        });
        let probed = Probed {
            state,
            route: route.to_string(),
            settings: settings.clone(),
            client,
            shutdown,
        };
        Health {
            probed: Arc::new(probed),
        }
    }

    pub fn is_up(&self) -> bool {
        self.probed.state.borrow().up
    }

    /// Outages the shadow came back from so far.
    pub fn recoveries(&self) -> u64 {
        self.probed.state.borrow().recoveries
    }

    /// Waits until the shadow is up; false when the proxy stops first.
    pub async fn wait_up(&self, shutdown: &mut watch::Receiver<bool>) -> bool {
        if self.is_up() {
            return true;
        }
        let mut state = self.probed.state.subscribe();
        tokio::select! {
            r = state.wait_for(|s| s.up) => r.is_ok(),
            _ = shutdown.wait_for(|stop| *stop) => false,
        }
    }

    /// Waits until the shadow has come back from an outage after `seen` of them
    /// (never returns otherwise).
    pub async fn recovered_after(&self, seen: u64) {
        let mut state = self.probed.state.subscribe();
        if state.wait_for(|s| s.recoveries > seen).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Marks the shadow down, and starts probing it unless that is going on already.
    pub fn mark_down(&self, why: &str) {
        let s = &self.probed;
        let went_down = s.state.send_if_modified(|st| {
            let was_up = st.up;
            st.up = false;
            was_up
        });
        if went_down {
            tracing::warn!(route = %s.route, shadow = %s.settings.name, reason = why, "the shadow is down; its replays wait for a probe to find it back");
            tokio::spawn(probe_until_up(Arc::clone(s)));
        }
    }
}

/// Probes the shadow until a probe passes (it is then up) or the proxy stops.
async fn probe_until_up(s: Arc<Probed>) {
    let mut failed = false;
    let mut shutdown = s.shutdown.clone();
    loop {
        if probe(&s).await {
            // Only this task brings the shadow back up, and one runs per outage.
            assert!(!s.state.borrow().up, "a shadow being probed is down");
            s.state.send_modify(|st| {
                st.up = true;
                st.recoveries += u64::from(failed);
            });
            tracing::info!(route = %s.route, shadow = %s.settings.name, "the shadow answers again: its replays go on");
            return;
        }
        failed = true;
        tokio::select! {
            _ = tokio::time::sleep(s.settings.retry.probe_interval) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}

/// Statuses a probe does not take as the shadow's answer: a gateway's.
const GATEWAY_STATUSES: [u16; 3] = [502, 503, 504];

/// One probe: whether `HEAD probe_path` is answered, not by a gateway.
async fn probe(s: &Probed) -> bool {
    let target = &s.settings.target;
    let Ok(uri) = target
        .url(&s.settings.retry.probe_path)
        .parse::<hyper::Uri>()
    else {
        return false;
    };
    let mut req = Request::new(empty());
    *req.method_mut() = Method::HEAD;
    *req.uri_mut() = uri;
    let tag = format!("{}/{}/probe", s.route, s.settings.name);
    if let (Ok(host), Ok(tag)) = (
        HeaderValue::from_str(&target.authority),
        HeaderValue::from_str(&tag),
    ) {
        req.headers_mut().insert(HOST, host);
        req.headers_mut().insert(REPLAY_HEADER, tag);
    }
    let within = s.settings.timeout.min(PROBE_TIMEOUT_MAX);
    match tokio::time::timeout(within, s.client.request(req)).await {
        Ok(Ok(response)) => {
            let status = response.status().as_u16();
            let _ = tokio::time::timeout(within, response.into_body().collect()).await;
            !GATEWAY_STATUSES.contains(&status)
        }
        _ => false,
    }
}
