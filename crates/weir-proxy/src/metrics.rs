//! The proxy's figures on weir's `/metrics`: per route, requests and answers by
//! status class and what was captured; per shadow, replays done, given up, and the
//! backlog (from the backend's figures at scrape time); per diffing shadow, answers
//! compared and the fields that differed. Read into a [`Snapshot`] at scrape time and
//! encoded by `weir_backend::exposition`, the page's one encoder.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use hyper::StatusCode;
use weir_backend::exposition::{self, Collector, DescriptorEncoder};

/// Counters of one route.
#[derive(Default)]
pub struct RouteCounters {
    pub requests: AtomicU64,
    /// Answers by class: 1xx .. 5xx.
    pub status: [AtomicU64; 5],
    pub shared: Arc<CaptureCounters>,
}

impl RouteCounters {
    pub fn count_status(&self, status: StatusCode) {
        let class = usize::from(status.as_u16() / 100).clamp(1, 5) - 1;
        self.status[class].fetch_add(1, Relaxed);
    }
}

/// What became of requests to capture.
#[derive(Default)]
pub struct CaptureCounters {
    pub captured: AtomicU64,
    /// Bodies over `capture_bytes_max`: forwarded, not replayed.
    pub too_large: AtomicU64,
    /// Bodies that did not arrive whole.
    pub incomplete: AtomicU64,
    /// Appends the engine refused (a full queue, a full disk).
    pub failed: AtomicU64,
    /// Requests forwarded but not captured: no room in `body_memory_max` for their
    /// copy and no spill file (a spill file that could not be made, or a spilled body
    /// larger than the whole budget).
    pub over_budget: AtomicU64,
    /// Requests not captured because the route's capture queue was not set up yet
    /// (a JetStream cluster unreachable since the proxy started).
    pub not_ready: AtomicU64,
}

/// Counters of one shadow.
#[derive(Default)]
pub struct ShadowCounters {
    /// Replays the shadow answered, by class 1xx .. 5xx.
    pub status: [AtomicU64; 5],
    /// Replays out of attempts, kept as dead letters.
    pub failed: AtomicU64,
    /// Attempts that were not delivered and are tried again.
    pub retried: AtomicU64,
    /// Captured requests left out by `sample_percent`.
    pub skipped: AtomicU64,
}

/// The figures of one shadow at a scrape.
#[derive(Debug)]
pub struct ShadowRow {
    pub route: String,
    pub shadow: String,
    /// Replays answered, by class 1xx .. 5xx; failed, retried and skipped ones.
    pub status: [u64; 5],
    pub failed: u64,
    pub retried: u64,
    pub skipped: u64,
    /// `None` when the backend's figures were not to be had: the series leaves it out.
    pub backlog: Option<u64>,
    /// The shadow's dead letters not yet re-driven (`None`: no figure, or none made).
    pub dead_letters: Option<u64>,
    pub up: bool,
}

impl ShadowRow {
    /// The counters of `counters` now, with the figures read elsewhere.
    pub fn new(route: &str, shadow: &str, counters: &ShadowCounters) -> ShadowRow {
        ShadowRow {
            route: route.to_string(),
            shadow: shadow.to_string(),
            status: counters.status.each_ref().map(|n| n.load(Relaxed)),
            failed: counters.failed.load(Relaxed),
            retried: counters.retried.load(Relaxed),
            skipped: counters.skipped.load(Relaxed),
            backlog: None,
            dead_letters: None,
            up: false,
        }
    }

    fn labels(&self) -> [(&str, &str); 2] {
        [("route", &self.route), ("shadow", &self.shadow)]
    }
}

/// The figures of one route at a scrape: requests, answers by class, and what
/// became of the requests to capture.
#[derive(Debug)]
pub struct RouteRow {
    pub route: String,
    pub requests: u64,
    pub status: [u64; 5],
    /// By outcome: captured, too large, incomplete, failed, not ready, over budget.
    pub captures: [u64; 6],
}

/// The outcomes of `weir_proxy_captures_total`.
const CAPTURE_OUTCOMES: [&str; 6] = [
    "captured",
    "too_large",
    "incomplete",
    "failed",
    "not_ready",
    "over_budget",
];

impl RouteRow {
    pub fn new(route: &str, c: &RouteCounters) -> RouteRow {
        let s = &c.shared;
        RouteRow {
            route: route.to_string(),
            requests: c.requests.load(Relaxed),
            status: c.status.each_ref().map(|n| n.load(Relaxed)),
            captures: [
                &s.captured,
                &s.too_large,
                &s.incomplete,
                &s.failed,
                &s.not_ready,
                &s.over_budget,
            ]
            .map(|n| n.load(Relaxed)),
        }
    }
}

/// The proxy's figures at one scrape, ready to encode.
#[derive(Debug)]
pub struct Snapshot {
    pub routes: Vec<RouteRow>,
    pub shadows: Vec<ShadowRow>,
    /// Per listener, the idle connections closed at `connections_max` for a new one.
    pub evicted: Vec<(String, u64)>,
    /// The body memory budget: in use, peak, the budget, bodies spilled.
    pub budget: [u64; 4],
    pub diffs: Vec<crate::differ::RouteReport>,
}

impl Snapshot {
    /// Encodes the proxy's series onto a `/metrics` page.
    pub fn encode(&self, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
        self.encode_routes(enc)?;
        self.encode_shadows(enc)?;
        exposition::counters(
            enc,
            "weir_proxy_connections_evicted_total",
            "Idle client connections closed at connections_max for a new one, per listener.",
            self.evicted
                .iter()
                .map(|(name, n)| ([("listener", name.as_str())], *n)),
        )?;
        self.encode_budget(enc)?;
        encode_diffs(&self.diffs, enc)
    }

    fn encode_budget(&self, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let [used, peak, max, spilled] = self.budget;
        let gauges = [
            (
                "weir_proxy_body_bytes_in_memory",
                "Body bytes held in memory now (reserved in body_memory_max).",
                used,
            ),
            (
                "weir_proxy_body_bytes_in_memory_max",
                "The most body bytes held in memory at once since the start.",
                peak,
            ),
            (
                "weir_proxy_body_memory_max_bytes",
                "The budget of body bytes held in memory (body_memory_max).",
                max,
            ),
        ];
        for (m, help, v) in gauges {
            exposition::gauge(enc, m, help, v)?;
        }
        exposition::counter(
            enc,
            "weir_proxy_bodies_spilled_total",
            "Request bodies whose capture copy went to a spill file past the budget.",
            spilled,
        )
    }

    fn encode_routes(&self, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
        exposition::counters(
            enc,
            "weir_proxy_requests_total",
            "Requests routed, per route.",
            self.routes
                .iter()
                .map(|r| ([("route", r.route.as_str())], r.requests)),
        )?;
        let answers = self.routes.iter().flat_map(|r| {
            r.status
                .iter()
                .zip(CLASSES)
                .map(|(n, class)| ([("route", r.route.as_str()), ("class", class)], *n))
        });
        exposition::counters(
            enc,
            "weir_proxy_responses_total",
            "Answers to clients, per route and status class.",
            answers,
        )?;
        let captures = self.routes.iter().flat_map(|r| {
            r.captures
                .iter()
                .zip(CAPTURE_OUTCOMES)
                .map(|(n, outcome)| ([("route", r.route.as_str()), ("outcome", outcome)], *n))
        });
        exposition::counters(
            enc,
            "weir_proxy_captures_total",
            "Requests captured for replay, or why not.",
            captures,
        )
    }

    fn encode_shadows(&self, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let replays = self.shadows.iter().flat_map(|r| {
            r.status.iter().zip(CLASSES).map(|(n, class)| {
                let [route, shadow] = r.labels();
                ([route, shadow, ("class", class)], *n)
            })
        });
        exposition::counters(
            enc,
            "weir_proxy_replays_total",
            "Replays answered by the shadow, per status class.",
            replays,
        )?;
        for (metric, help, counter, value) in SHADOW_SERIES {
            let samples = self
                .shadows
                .iter()
                .filter_map(|r| value(r).map(|v| (r.labels(), v)));
            match counter {
                true => exposition::counters(enc, metric, help, samples)?,
                false => exposition::gauges(enc, metric, help, samples)?,
            }
        }
        Ok(())
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        Snapshot::encode(self, &mut enc)
    }
}

/// The status classes' label values, 1xx .. 5xx.
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// A shadow's metric: name, help, whether it is a counter (else a gauge), and how to
/// read it (`None`: left out).
type ShadowSeries = (
    &'static str,
    &'static str,
    bool,
    fn(&ShadowRow) -> Option<u64>,
);

const SHADOW_SERIES: [ShadowSeries; 6] = [
    (
        "weir_proxy_replays_failed_total",
        "Replays out of attempts, kept as dead letters.",
        true,
        |r| Some(r.failed),
    ),
    (
        "weir_proxy_replay_retries_total",
        "Replay attempts not delivered, tried again.",
        true,
        |r| Some(r.retried),
    ),
    (
        "weir_proxy_replay_dead_letters",
        "Dead letters of the shadow not yet re-driven.",
        false,
        |r| r.dead_letters,
    ),
    (
        "weir_proxy_shadow_up",
        "1 while the shadow is up, 0 while it is down (probed).",
        false,
        |r| Some(u64::from(r.up)),
    ),
    (
        "weir_proxy_replays_skipped_total",
        "Captured requests left out by sample_percent.",
        true,
        |r| Some(r.skipped),
    ),
    (
        "weir_proxy_replay_backlog",
        "Captured requests not yet replayed to the shadow.",
        false,
        |r| r.backlog,
    ),
];

/// The diffing series: comparisons by outcome, differences by field and kind, and
/// the noise fields learned per route (none at all without a diffing shadow).
fn encode_diffs(
    report: &[crate::differ::RouteReport],
    enc: &mut DescriptorEncoder<'_>,
) -> fmt::Result {
    if report.is_empty() {
        return Ok(());
    }
    let shadows = || {
        report
            .iter()
            .flat_map(|r| r.shadows.iter().map(move |s| (r.route.as_str(), s)))
    };
    let compared = shadows().flat_map(|(route, s)| {
        let t = &s.stats;
        [
            ("same", t.same),
            ("different", t.different),
            ("noise", t.noise_only),
            ("skipped", t.skipped),
        ]
        .map(|(outcome, n)| {
            let labels = [
                ("route", route),
                ("shadow", s.shadow.as_str()),
                ("outcome", outcome),
            ];
            (labels, n)
        })
    });
    exposition::counters(
        enc,
        "weir_proxy_diff_compared_total",
        "Shadow answers compared with the primary's, by outcome.",
        compared,
    )?;
    let fields = shadows().flat_map(|(route, s)| {
        s.stats.fields.iter().flat_map(move |(field, kinds)| {
            kinds.iter().map(move |(kind, f)| {
                let labels = [
                    ("route", route),
                    ("shadow", s.shadow.as_str()),
                    ("field", field.as_str()),
                    ("kind", kind.as_str()),
                ];
                (labels, f.count)
            })
        })
    });
    exposition::counters(
        enc,
        "weir_proxy_diffs_total",
        "Compared answers that differed in a field (not noise), by field and kind.",
        fields,
    )?;
    exposition::gauges(
        enc,
        "weir_proxy_diff_noise_fields",
        "Fields learned as noise from the reference, per route.",
        report
            .iter()
            .map(|r| ([("route", r.route.as_str())], r.noise_fields.len() as u64)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped() {
        let snapshot = Snapshot {
            routes: Vec::new(),
            shadows: Vec::new(),
            evicted: vec![("a\"b\\c\nd".to_string(), 2)],
            budget: [0; 4],
            diffs: Vec::new(),
        };
        let page = exposition::text(snapshot);
        let line = r#"weir_proxy_connections_evicted_total{listener="a\"b\\c\nd"} 2"#;
        assert!(page.lines().any(|l| l == line), "{page}");
    }
}
