//! The `[proxy]` section of weir's config file: listeners and routes, each route's
//! targets, limits and timeouts, and its shadows (where captured requests are
//! replayed). `resolve` applies the defaults and refuses values that cannot work,
//! naming the key.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use weir_backend::ConfigError;

pub const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 2_000;
pub const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 30_000;
pub const RETRIES_DEFAULT: u32 = 1;
pub const RETRY_BACKOFF_MS_DEFAULT: u64 = 50;
/// Retries and their pause are capped at these (larger values are taken as these).
pub const RETRIES_MAX: u32 = 10;
pub const RETRY_BACKOFF_MS_MAX: u64 = 60_000;
pub const BODY_BYTES_MAX_DEFAULT: u64 = 10 * 1024 * 1024;
pub const CAPTURE_BYTES_MAX_DEFAULT: u64 = 1024 * 1024;
pub const DOWN_MS_DEFAULT: u64 = 10_000;
pub const HEALTH_INTERVAL_MS_DEFAULT: u64 = 5_000;
pub const WEBSOCKET_IDLE_MS_DEFAULT: u64 = 300_000;
pub const CONNECTIONS_MAX_DEFAULT: usize = 4_096;
pub const HEADER_BYTES_MAX_DEFAULT: usize = 64 * 1024;
/// Body bytes held in memory at once, proxy-wide (`budget.rs`).
pub const BODY_MEMORY_MAX_DEFAULT: u64 = 64 * 1024 * 1024;
/// Header fields in an HTTP/1.1 request head (hyper's own default); more is 431.
pub const HEADERS_MAX_DEFAULT: usize = 100;
/// `headers_max` at most: hyper sets aside room for that many fields per request.
pub const HEADERS_MAX_MAX: usize = 10_000;
pub const HEADER_TIMEOUT_MS_DEFAULT: u64 = 10_000;
pub const SHADOW_TIMEOUT_MS_DEFAULT: u64 = 10_000;
pub const SHADOW_ATTEMPTS_MAX_DEFAULT: u32 = 10;
/// Attempts of a replay at most (`attempts_max`).
pub const SHADOW_ATTEMPTS_MAX_MAX: u32 = 1_000;
pub const SHADOW_RETRY_BACKOFF_MS_DEFAULT: u64 = 500;
pub const SHADOW_RETRY_BACKOFF_MAX_MS_DEFAULT: u64 = 30_000;
pub const SHADOW_RETRY_AFTER_MAX_MS_DEFAULT: u64 = 60_000;
/// The longest pause a shadow's retry settings may ask for (an hour).
pub const SHADOW_PAUSE_MS_MAX: u64 = 3_600_000;
pub const SHADOW_PROBE_PATH_DEFAULT: &str = "/";
pub const SHADOW_PROBE_INTERVAL_MS_DEFAULT: u64 = 500;
pub const SHADOW_CONCURRENCY_DEFAULT: usize = 4;
/// Shadows per route: each is a reader of the route's capture queue.
pub const SHADOWS_MAX: usize = 16;
/// Headers left out of response diffs unless `diff_ignore_headers` says otherwise:
/// they differ between any two servers, or with the body, which is compared itself.
pub const DIFF_IGNORE_HEADERS_DEFAULT: &[&str] = &[
    "date",
    "server",
    "content-length",
    "age",
    "expires",
    "last-modified",
    "etag",
    "set-cookie",
    "x-request-id",
    "x-weir-replay",
];
/// Entries in `diff_ignore_headers` and `diff_ignore_fields`, each.
pub const DIFF_IGNORE_MAX: usize = 256;

/// `[proxy]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyConfig {
    #[serde(default)]
    pub listen: Vec<ListenConfig>,
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// Client connections open at once, per listener.
    pub connections_max: Option<usize>,
    /// Largest request head (request line and headers) taken from a client.
    pub header_bytes_max: Option<usize>,
    /// Most header fields in an HTTP/1.1 request head (more is 431).
    pub headers_max: Option<usize>,
    /// Time a client has to send a request head.
    pub header_timeout_ms: Option<u64>,
    /// Threads of the proxy's own runtime (default: the CPU count).
    pub threads: Option<usize>,
    /// Body bytes held in memory at once, all routes together: bodies read whole
    /// and capture copies; past it bodies stream and captures spill to disk. Read
    /// from `body_memory_max` too, its old name.
    #[serde(alias = "body_memory_max")]
    pub body_memory_bytes_max: Option<u64>,
    /// A PEM file of CA certificates trusted for `https://` targets, besides the
    /// built-in Mozilla roots.
    pub tls_ca_file: Option<PathBuf>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenConfig {
    pub name: String,
    pub addr: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Names the route in metrics and its capture queue `proxy:capture:NAME`.
    pub name: String,
    /// The listeners it serves (default: all).
    pub listen: Option<Vec<String>>,
    /// Methods it matches (default: all).
    pub methods: Option<Vec<String>>,
    /// Path pattern: `/exact`, `/prefix/*`, `/users/:id`.
    pub path: Option<String>,
    /// Host it matches (the `Host` header without the port; default: any).
    pub host: Option<String>,
    /// Where requests go: one URL, or several balanced in turn.
    pub targets: Vec<String>,
    pub connect_timeout_ms: Option<u64>,
    pub request_timeout_ms: Option<u64>,
    /// Attempts after the first, for idempotent requests without a body, on a
    /// connection failure or a timeout.
    pub retries: Option<u32>,
    pub retry_backoff_ms: Option<u64>,
    /// A target that failed to connect is skipped for this long.
    pub down_ms: Option<u64>,
    pub body_bytes_max: Option<u64>,
    /// Bodies up to this size are captured for replay; larger requests are
    /// forwarded but not replayed.
    pub capture_bytes_max: Option<u64>,
    /// Keep the client's `Host` header (default: the target's host).
    pub preserve_host: Option<bool>,
    /// Send this `Host` instead.
    pub host_rewrite: Option<String>,
    #[serde(default)]
    pub set_headers: BTreeMap<String, String>,
    #[serde(default)]
    pub remove_headers: Vec<String>,
    /// Query parameters set (replacing any of that name), written as they go on the
    /// wire (already percent-encoded).
    #[serde(default)]
    pub set_query: BTreeMap<String, String>,
    /// Query parameters removed.
    #[serde(default)]
    pub remove_query: Vec<String>,
    /// Active health check: `GET` this path on each target every
    /// `health_interval_ms`; a target that does not answer 2xx is left out until it
    /// does.
    pub health_path: Option<String>,
    pub health_interval_ms: Option<u64>,
    /// Forward `Upgrade: websocket` (default false: an upgrade is dropped, the
    /// request forwarded as a plain one).
    pub websocket: Option<bool>,
    /// An upgraded (WebSocket) connection with no byte either way for this long is
    /// closed.
    pub websocket_idle_ms: Option<u64>,
    /// `concurrent` (each shadow on its own) or `sequential` (shadows in order, the
    /// next only after the previous answered).
    pub replay: Option<String>,
    #[serde(default)]
    pub shadows: Vec<ShadowConfig>,
    /// Capture every request (even with no shadow) and keep it for `weir capture
    /// export` and `weir replay`: a reader `record` that nothing consumes holds the
    /// captures until the queue's own limits drop the oldest.
    #[serde(default)]
    pub record: bool,
    /// A second instance of the primary's version: each request a diffing shadow
    /// replays also goes here, and what differs between the primary's answer and
    /// this one is learned as noise, not reported.
    pub reference: Option<String>,
    /// Response headers not compared (replaces the default list).
    pub diff_ignore_headers: Option<Vec<String>>,
    /// Fields not compared: `status`, `header.NAME`, `body`, `body.a.b` (`*` for
    /// any array index); a field ignores everything under it.
    #[serde(default)]
    pub diff_ignore_fields: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowConfig {
    /// Names the shadow (its reader of the capture queue, its metrics).
    pub name: String,
    pub url: String,
    /// Replays per second at most (0 or absent: no limit).
    pub rate: Option<f64>,
    /// Percentage of captured requests replayed (default 100).
    pub sample_percent: Option<f64>,
    /// Replays in flight at once (default 4; 1 keeps the order).
    pub concurrency: Option<usize>,
    pub timeout_ms: Option<u64>,
    /// The older spelling of `attempts_max - 1` (used when `attempts_max` is absent).
    pub retries: Option<u32>,
    /// Statuses that count as delivered (`2xx`, `404`, `!429`); the others, resets
    /// and timeouts are tried again.
    pub delivered: Option<Vec<String>>,
    /// Attempts of a replay before it goes to the shadow's dead letters (default 10).
    pub attempts_max: Option<u32>,
    /// The first pause before a replay is tried again, doubling (default 500).
    pub retry_backoff_ms: Option<u64>,
    /// The longest such pause (default 30000).
    #[serde(alias = "retry_backoff_max_ms")]
    pub retry_backoff_ms_max: Option<u64>,
    /// The longest wait a `Retry-After` gets (default 60000).
    #[serde(alias = "retry_after_max_ms")]
    pub retry_after_ms_max: Option<u64>,
    /// The path `HEAD` asks while the shadow is down (default `/`).
    pub probe_path: Option<String>,
    /// How often a shadow that is down is probed (default 500).
    pub probe_interval_ms: Option<u64>,
    /// Compare the shadow's answers with the primary's (the primary's answer is then
    /// captured with the request).
    #[serde(default)]
    pub diff: bool,
}

/// Everything resolved and checked.
#[derive(Clone, Debug)]
pub struct ProxySettings {
    pub listen: Vec<ListenConfig>,
    pub routes: Vec<RouteSettings>,
    pub connections_max: usize,
    pub header_bytes_max: usize,
    pub headers_max: usize,
    pub header_timeout: Duration,
    pub threads: usize,
    pub body_memory_max: u64,
    pub tls: Arc<rustls::ClientConfig>,
}

#[derive(Clone, Debug)]
pub struct RouteSettings {
    pub name: String,
    pub listen: Option<Vec<String>>,
    pub methods: Option<Vec<String>>,
    pub path: String,
    pub host: Option<String>,
    pub targets: Vec<Target>,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub retries: u32,
    pub retry_backoff: Duration,
    pub down: Duration,
    pub body_bytes_max: u64,
    pub capture_bytes_max: u64,
    pub preserve_host: bool,
    pub host_rewrite: Option<String>,
    pub set_headers: Vec<(String, String)>,
    pub remove_headers: Vec<String>,
    pub set_query: Vec<(String, String)>,
    pub remove_query: Vec<String>,
    pub health_path: Option<String>,
    pub health_interval: Duration,
    /// `Upgrade: websocket` is forwarded (no other upgrade ever is).
    pub websocket: bool,
    pub websocket_idle: Duration,
    pub sequential: bool,
    pub shadows: Vec<ShadowSettings>,
    /// TLS to the route's `https://` targets, shadows and reference.
    pub tls: Arc<rustls::ClientConfig>,
    /// Keep every capture (the `record` reader) for export and replay.
    pub record: bool,
    pub diff: DiffSettings,
}

/// How a route's diffing shadows compare answers.
#[derive(Clone, Debug, Default)]
pub struct DiffSettings {
    pub reference: Option<Target>,
    /// Lower-case header names.
    pub ignore_headers: Vec<String>,
    pub ignore_fields: Vec<String>,
}

impl RouteSettings {
    /// Whether some shadow compares answers (so the primary's answer is captured).
    pub fn diffs(&self) -> bool {
        self.shadows.iter().any(|s| s.diff)
    }
}

/// A target's base: scheme, authority and a path prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// `https://` (TLS) rather than `http://`.
    pub https: bool,
    pub authority: String,
    pub base_path: String,
}

impl Target {
    /// The URL of a path (and query) on the target: under its base path.
    pub fn url(&self, path_and_query: &str) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!(
            "{scheme}://{}{}{path_and_query}",
            self.authority, self.base_path
        )
    }
}

#[derive(Clone, Debug)]
pub struct ShadowSettings {
    pub name: String,
    pub target: Target,
    pub rate: Option<f64>,
    pub sample_percent: f64,
    pub concurrency: usize,
    pub timeout: Duration,
    pub diff: bool,
    pub retry: RetrySettings,
}

/// When a replay is delivered, and how one that was not is tried again.
#[derive(Clone, Debug)]
pub struct RetrySettings {
    pub delivered: crate::deliver::StatusSet,
    pub attempts_max: u32,
    pub backoff: Duration,
    pub backoff_max: Duration,
    pub retry_after_max: Duration,
    /// Path and query `HEAD` asks while the shadow is down.
    pub probe_path: String,
    pub probe_interval: Duration,
}

impl ProxyConfig {
    pub fn resolve(&self) -> Result<ProxySettings, ConfigError> {
        if self.listen.is_empty() {
            return Err(ConfigError::new(
                "proxy.listen",
                "needs at least one [[proxy.listen]]",
            ));
        }
        for l in &self.listen {
            check_name("proxy.listen.name", &l.name)?;
        }
        let tls = crate::tls::client_config(self.tls_ca_file.as_deref())
            .map_err(|e| ConfigError::new("proxy.tls_ca_file", e))?;
        let routes = self.resolve_routes(&tls)?;
        let positive = |name: &str, v: usize| {
            if v == 0 {
                Err(ConfigError::at_least(format!("proxy.{name}"), 1))
            } else {
                Ok(v)
            }
        };
        Ok(ProxySettings {
            listen: self.listen.clone(),
            routes,
            connections_max: positive(
                "connections_max",
                self.connections_max.unwrap_or(CONNECTIONS_MAX_DEFAULT),
            )?,
            header_bytes_max: positive(
                "header_bytes_max",
                self.header_bytes_max.unwrap_or(HEADER_BYTES_MAX_DEFAULT),
            )?,
            headers_max: headers_max(self.headers_max)?,
            header_timeout: Duration::from_millis(positive(
                "header_timeout_ms",
                self.header_timeout_ms.unwrap_or(HEADER_TIMEOUT_MS_DEFAULT) as usize,
            )? as u64),
            threads: positive(
                "threads",
                self.threads
                    .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())),
            )?,
            body_memory_max: match self
                .body_memory_bytes_max
                .unwrap_or(BODY_MEMORY_MAX_DEFAULT)
            {
                0 => return Err(ConfigError::at_least("proxy.body_memory_bytes_max", 1)),
                n => n,
            },
            tls,
        })
    }

    /// Every route, checked: each names only listeners there are, no two alike.
    fn resolve_routes(
        &self,
        tls: &Arc<rustls::ClientConfig>,
    ) -> Result<Vec<RouteSettings>, ConfigError> {
        let mut routes = Vec::with_capacity(self.routes.len());
        for r in &self.routes {
            let route = resolve_route(r, tls)?;
            if let Some(list) = &route.listen {
                if let Some(bad) = list
                    .iter()
                    .find(|n| !self.listen.iter().any(|l| &l.name == *n))
                {
                    return Err(ConfigError::new(
                        route_key(&route.name, "listen"),
                        format!("names no listener {bad:?}"),
                    ));
                }
            }
            if routes.iter().any(|x: &RouteSettings| x.name == route.name) {
                return Err(ConfigError::new(
                    "proxy.routes",
                    format!("names two routes {:?}", route.name),
                ));
            }
            routes.push(route);
        }
        Ok(routes)
    }
}

/// `headers_max`: 1 to [`HEADERS_MAX_MAX`], [`HEADERS_MAX_DEFAULT`] when absent.
fn headers_max(v: Option<usize>) -> Result<usize, ConfigError> {
    match v.unwrap_or(HEADERS_MAX_DEFAULT) {
        n @ 1..=HEADERS_MAX_MAX => Ok(n),
        _ => Err(ConfigError::range("proxy.headers_max", 1, HEADERS_MAX_MAX)),
    }
}

/// A key of the route `route`, as a message names it.
fn route_key(route: &str, key: &str) -> String {
    format!("proxy.routes.{route:?}.{key}")
}

/// Names of routes, listeners and shadows: 1 to 64 of `a-z 0-9 _ -`.
fn check_name(key: &str, name: &str) -> Result<(), ConfigError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(
            key,
            format!("{name:?} must be 1 to 64 of a-z, 0-9, _ and -"),
        ))
    }
}

/// `http://host:port/base` or `https://host:port/base`.
pub fn parse_target(key: &str, url: &str) -> Result<Target, ConfigError> {
    let (https, rest) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
        (Some(rest), _) => (false, rest),
        (_, Some(rest)) => (true, rest),
        _ => {
            return Err(ConfigError::new(
                key,
                format!("{url:?} must be an http:// or https:// URL"),
            ))
        }
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.is_empty() || authority.contains('@') || path.contains('?') {
        return Err(ConfigError::new(
            key,
            format!("{url:?} must be host[:port] and an optional path, no credentials or query"),
        ));
    }
    authority
        .parse::<hyper::http::uri::Authority>()
        .map_err(|e| ConfigError::new(key, format!("{url:?}: {e}")))?;
    Ok(Target {
        https,
        authority: authority.to_string(),
        base_path: path.trim_end_matches('/').to_string(),
    })
}

fn resolve_route(
    r: &RouteConfig,
    tls: &Arc<rustls::ClientConfig>,
) -> Result<RouteSettings, ConfigError> {
    check_name("proxy.routes.name", &r.name)?;
    let key = |k: &str| route_key(&r.name, k);
    let targets = resolve_targets(r)?;
    let path = r.path.clone().unwrap_or_else(|| "/*".to_string());
    if !path.starts_with('/') {
        return Err(ConfigError::new(
            key("path"),
            format!("{path:?}: a pattern starts with /"),
        ));
    }
    let sequential = replay_mode(r)?;
    let shadows = resolve_shadows(r)?;
    let diff = resolve_diff(r, &shadows)?;
    let ms = |v: Option<u64>, d: u64| Duration::from_millis(v.unwrap_or(d).max(1));
    Ok(RouteSettings {
        name: r.name.clone(),
        listen: r.listen.clone(),
        methods: r
            .methods
            .as_ref()
            .map(|m| m.iter().map(|x| x.to_ascii_uppercase()).collect()),
        path,
        host: r.host.as_ref().map(|h| h.to_ascii_lowercase()),
        targets,
        connect_timeout: ms(r.connect_timeout_ms, CONNECT_TIMEOUT_MS_DEFAULT),
        request_timeout: ms(r.request_timeout_ms, REQUEST_TIMEOUT_MS_DEFAULT),
        retries: r.retries.unwrap_or(RETRIES_DEFAULT).min(RETRIES_MAX),
        retry_backoff: Duration::from_millis(
            r.retry_backoff_ms
                .unwrap_or(RETRY_BACKOFF_MS_DEFAULT)
                .min(RETRY_BACKOFF_MS_MAX),
        ),
        down: Duration::from_millis(r.down_ms.unwrap_or(DOWN_MS_DEFAULT)),
        body_bytes_max: r.body_bytes_max.unwrap_or(BODY_BYTES_MAX_DEFAULT),
        capture_bytes_max: r.capture_bytes_max.unwrap_or(CAPTURE_BYTES_MAX_DEFAULT),
        preserve_host: r.preserve_host.unwrap_or(false),
        host_rewrite: r.host_rewrite.clone(),
        set_headers: r
            .set_headers
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
            .collect(),
        remove_headers: r
            .remove_headers
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect(),
        set_query: r
            .set_query
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        remove_query: r.remove_query.clone(),
        health_path: r.health_path.clone(),
        health_interval: ms(r.health_interval_ms, HEALTH_INTERVAL_MS_DEFAULT),
        websocket: r.websocket.unwrap_or(false),
        websocket_idle: ms(r.websocket_idle_ms, WEBSOCKET_IDLE_MS_DEFAULT),
        sequential,
        shadows,
        record: r.record,
        diff,
        tls: Arc::clone(tls),
    })
}

/// `reference`, `diff_ignore_headers` and `diff_ignore_fields`, checked.
fn resolve_diff(r: &RouteConfig, shadows: &[ShadowSettings]) -> Result<DiffSettings, ConfigError> {
    let key = |k: &str| route_key(&r.name, k);
    let reference = r
        .reference
        .as_deref()
        .map(|u| parse_target(&key("reference"), u))
        .transpose()?;
    if reference.is_some() && !shadows.iter().any(|s| s.diff) {
        return Err(ConfigError::new(
            key("reference"),
            "is only used by a shadow with diff = true",
        ));
    }
    let ignore_headers: Vec<String> = match &r.diff_ignore_headers {
        Some(list) => list.iter().map(|h| h.to_ascii_lowercase()).collect(),
        None => DIFF_IGNORE_HEADERS_DEFAULT
            .iter()
            .map(|h| h.to_string())
            .collect(),
    };
    if ignore_headers.len() > DIFF_IGNORE_MAX || r.diff_ignore_fields.len() > DIFF_IGNORE_MAX {
        return Err(ConfigError::new(
            key("diff_ignore_headers"),
            format!("and diff_ignore_fields hold at most {DIFF_IGNORE_MAX} entries each"),
        ));
    }
    if let Some(bad) = r.diff_ignore_fields.iter().find(|f| {
        !(*f == "status" || *f == "body" || f.starts_with("header.") || f.starts_with("body."))
    }) {
        return Err(ConfigError::new(
            key("diff_ignore_fields"),
            format!("{bad:?}: status, body, header.NAME or body.PATH"),
        ));
    }
    // Header fields are compared by their lower-case names.
    let ignore_fields = r
        .diff_ignore_fields
        .iter()
        .map(|f| match f.strip_prefix("header.") {
            Some(name) => format!("header.{}", name.to_ascii_lowercase()),
            None => f.clone(),
        })
        .collect();
    Ok(DiffSettings {
        reference,
        ignore_headers,
        ignore_fields,
    })
}

/// A route's targets: at least one, each a URL `parse_target` takes.
fn resolve_targets(r: &RouteConfig) -> Result<Vec<Target>, ConfigError> {
    let key = route_key(&r.name, "targets");
    if r.targets.is_empty() {
        return Err(ConfigError::new(key, "needs at least one target"));
    }
    r.targets.iter().map(|t| parse_target(&key, t)).collect()
}

/// `replay`: false for concurrent (the default), true for sequential.
fn replay_mode(r: &RouteConfig) -> Result<bool, ConfigError> {
    match r.replay.as_deref() {
        None | Some("concurrent") => Ok(false),
        Some("sequential") => Ok(true),
        Some(other) => Err(ConfigError::one_of(
            route_key(&r.name, "replay"),
            &["concurrent", "sequential"],
            other,
        )),
    }
}

/// A route's shadows, checked.
fn resolve_shadows(r: &RouteConfig) -> Result<Vec<ShadowSettings>, ConfigError> {
    let key = |k: &str| route_key(&r.name, k);
    if r.shadows.len() > SHADOWS_MAX {
        return Err(ConfigError::new(
            key("shadows"),
            format!("holds at most {SHADOWS_MAX}"),
        ));
    }
    let mut shadows = Vec::new();
    for s in &r.shadows {
        check_name(&key("shadows.name"), &s.name)?;
        if shadows.iter().any(|x: &ShadowSettings| x.name == s.name) {
            return Err(ConfigError::new(
                key("shadows"),
                format!("names two shadows {:?}", s.name),
            ));
        }
        let sample = s.sample_percent.unwrap_or(100.0);
        if !(0.0..=100.0).contains(&sample) {
            return Err(ConfigError::range(key("shadows.sample_percent"), 0, 100));
        }
        let rate = s.rate.filter(|r| *r > 0.0);
        if s.rate
            .is_some_and(|r| !r.is_finite() || r < 0.0 || (r > 0.0 && r < 0.001))
        {
            return Err(ConfigError::new(
                key("shadows.rate"),
                "must be a positive number of requests per second",
            ));
        }
        let dead = crate::queues::dead_queue(&r.name, &s.name);
        if weir_backend::validate_queue_name(&dead).is_err() {
            return Err(ConfigError::new(
                key("shadows.name"),
                format!("and the route's name make a dead-letter queue name ({dead}) over 100 characters"),
            ));
        }
        shadows.push(ShadowSettings {
            name: s.name.clone(),
            target: parse_target(&key("shadows.url"), &s.url)?,
            rate,
            sample_percent: sample,
            concurrency: s
                .concurrency
                .unwrap_or(SHADOW_CONCURRENCY_DEFAULT)
                .clamp(1, 1024),
            timeout: Duration::from_millis(
                s.timeout_ms.unwrap_or(SHADOW_TIMEOUT_MS_DEFAULT).max(1),
            ),
            diff: s.diff,
            retry: resolve_retry(s).map_err(|(k, why)| ConfigError::new(key(k), why))?,
        });
    }
    Ok(shadows)
}

/// A shadow's retry settings, checked; an error names the key (under `shadows.`).
fn resolve_retry(s: &ShadowConfig) -> Result<RetrySettings, (&'static str, String)> {
    let delivered = match &s.delivered {
        Some(list) => {
            crate::deliver::StatusSet::parse(list).map_err(|e| ("shadows.delivered", e))?
        }
        None => crate::deliver::StatusSet::default_set(),
    };
    let attempts_max = match (s.attempts_max, s.retries) {
        (Some(n), _) => n,
        (None, Some(r)) => r.saturating_add(1),
        (None, None) => SHADOW_ATTEMPTS_MAX_DEFAULT,
    };
    if !(1..=SHADOW_ATTEMPTS_MAX_MAX).contains(&attempts_max) {
        return Err((
            "shadows.attempts_max",
            format!("must be 1 to {SHADOW_ATTEMPTS_MAX_MAX}"),
        ));
    }
    let pause = |k: &'static str, v: Option<u64>, default: u64| match v.unwrap_or(default) {
        ms @ 1..=SHADOW_PAUSE_MS_MAX => Ok(Duration::from_millis(ms)),
        _ => Err((k, format!("must be 1 to {SHADOW_PAUSE_MS_MAX} ms"))),
    };
    let probe_path = s
        .probe_path
        .clone()
        .unwrap_or_else(|| SHADOW_PROBE_PATH_DEFAULT.into());
    if !probe_path.starts_with('/') || probe_path.parse::<hyper::Uri>().is_err() {
        return Err((
            "shadows.probe_path",
            "must be a path, such as /health".into(),
        ));
    }
    Ok(RetrySettings {
        delivered,
        attempts_max,
        backoff: pause(
            "shadows.retry_backoff_ms",
            s.retry_backoff_ms,
            SHADOW_RETRY_BACKOFF_MS_DEFAULT,
        )?,
        backoff_max: pause(
            "shadows.retry_backoff_ms_max",
            s.retry_backoff_ms_max,
            SHADOW_RETRY_BACKOFF_MAX_MS_DEFAULT,
        )?,
        retry_after_max: pause(
            "shadows.retry_after_ms_max",
            s.retry_after_ms_max,
            SHADOW_RETRY_AFTER_MAX_MS_DEFAULT,
        )?,
        probe_path,
        probe_interval: pause(
            "shadows.probe_interval_ms",
            s.probe_interval_ms,
            SHADOW_PROBE_INTERVAL_MS_DEFAULT,
        )?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_parsed_and_bad_ones_refused() {
        let t = parse_target("k", "http://127.0.0.1:9000/base/").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.base_path.as_str()),
            ("127.0.0.1:9000", "/base")
        );
        assert_eq!(parse_target("k", "http://svc").unwrap().base_path, "");
        let t = parse_target("k", "https://svc:8443/v1").unwrap();
        assert!(t.https);
        assert_eq!(t.url("/a?b"), "https://svc:8443/v1/a?b");
        for bad in [
            "ftp://a",
            "http://",
            "http://u:p@a",
            "http://a/?q=1",
            "http://a b",
        ] {
            assert!(parse_target("k", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_config_resolves_and_mistakes_are_named() {
        let text = r#"
            [[listen]]
            name = "public"
            addr = "127.0.0.1:0"
            [[routes]]
            name = "api"
            path = "/api/*"
            targets = ["http://127.0.0.1:9000"]
            [[routes.shadows]]
            name = "staging"
            url = "http://127.0.0.1:9100"
            rate = 50
        "#;
        let c: ProxyConfig = toml_like(text);
        let s = c.resolve().unwrap();
        assert_eq!(s.routes[0].shadows[0].rate, Some(50.0));
        let mut bad = c.clone();
        bad.routes[0].listen = Some(vec!["nope".into()]);
        let e = bad.resolve().unwrap_err();
        assert_eq!(e.key(), "proxy.routes.\"api\".listen");
        assert!(e.to_string().contains("nope"), "{e}");
        let mut bad = c.clone();
        bad.routes[0].replay = Some("random".into());
        assert!(bad.resolve().unwrap_err().key().ends_with(".replay"));
        let mut bad = c.clone();
        bad.routes[0].name = "Bad Name".into();
        assert_eq!(bad.resolve().unwrap_err().key(), "proxy.routes.name");
        // A reference needs a diffing shadow; ignored fields are named by kind.
        let mut bad = c.clone();
        bad.routes[0].reference = Some("http://127.0.0.1:9200".into());
        assert!(bad.resolve().unwrap_err().key().ends_with(".reference"));
        bad.routes[0].shadows[0].diff = true;
        let s = bad.resolve().unwrap();
        assert!(s.routes[0].diffs());
        assert!(s.routes[0]
            .diff
            .ignore_headers
            .contains(&"date".to_string()));
        bad.routes[0].diff_ignore_fields = vec!["header.X-Trace".into()];
        let s = bad.resolve().unwrap();
        assert_eq!(s.routes[0].diff.ignore_fields, vec!["header.x-trace"]);
        bad.routes[0].diff_ignore_fields = vec!["cookie".into()];
        assert!(bad
            .resolve()
            .unwrap_err()
            .key()
            .ends_with(".diff_ignore_fields"));
    }

    #[test]
    fn a_shadows_retry_settings_resolve_and_mistakes_are_named() {
        let text = r#"
            [[listen]]
            name = "public"
            addr = "127.0.0.1:0"
            [[routes]]
            name = "api"
            targets = ["http://127.0.0.1:9000"]
            [[routes.shadows]]
            name = "staging"
            url = "http://127.0.0.1:9100"
        "#;
        let c: ProxyConfig = toml_like(text);
        let r = &c.resolve().unwrap().routes[0].shadows[0].retry;
        assert_eq!(r.attempts_max, SHADOW_ATTEMPTS_MAX_DEFAULT);
        assert!(r.delivered.contains(404) && !r.delivered.contains(503));
        assert_eq!(r.probe_path, "/");
        assert_eq!(r.probe_interval, Duration::from_millis(500));
        let mut old = c.clone();
        old.routes[0].shadows[0].retries = Some(2);
        assert_eq!(
            old.resolve().unwrap().routes[0].shadows[0]
                .retry
                .attempts_max,
            3
        );
        let mut set = c.clone();
        set.routes[0].shadows[0].delivered = Some(vec!["2xx".into(), "503".into()]);
        let r = &set.resolve().unwrap().routes[0].shadows[0].retry;
        assert!(r.delivered.contains(503) && !r.delivered.contains(404));
        type Spoil = fn(&mut ShadowConfig);
        let cases: [(&str, Spoil); 5] = [
            ("attempts_max", |s: &mut ShadowConfig| {
                s.attempts_max = Some(0)
            }),
            ("delivered", |s: &mut ShadowConfig| {
                s.delivered = Some(vec!["2x".into()])
            }),
            ("retry_backoff_ms", |s: &mut ShadowConfig| {
                s.retry_backoff_ms = Some(0)
            }),
            ("probe_path", |s: &mut ShadowConfig| {
                s.probe_path = Some("health".into())
            }),
            ("name", |s: &mut ShadowConfig| s.name = "x".repeat(64)),
        ];
        for (field, bad) in cases {
            let mut c = c.clone();
            c.routes[0].name = "r".repeat(40);
            bad(&mut c.routes[0].shadows[0]);
            let e = c.resolve().unwrap_err();
            assert!(e.key().ends_with(&format!(".shadows.{field}")), "{e}");
        }
    }

    fn toml_like(text: &str) -> ProxyConfig {
        toml::from_str(text).unwrap()
    }
}
