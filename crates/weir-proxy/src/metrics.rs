//! The proxy's figures on weir's `/metrics`: per route, requests and answers by
//! status class and what was captured; per shadow, replays done, given up, and the
//! backlog (from the backend's figures at scrape time); per diffing shadow, answers
//! compared and the fields that differed.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use hyper::StatusCode;

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

pub struct ShadowRow<'a> {
    pub route: &'a str,
    pub shadow: &'a str,
    pub counters: &'a ShadowCounters,
    /// `None` when the backend's figures were not to be had: the series leaves it out.
    pub backlog: Option<u64>,
    /// The shadow's dead letters not yet re-driven (`None`: no figure, or none made).
    pub dead_letters: Option<u64>,
    pub up: bool,
}

/// Appends the proxy's series to a `/metrics` body.
pub fn render(routes: &[(&str, &RouteCounters)], shadows: &[ShadowRow<'_>], out: &mut String) {
    render_routes(routes, out);
    render_shadows(shadows, out);
}

/// Appends, per listener, the idle connections closed at `connections_max` for a
/// new one.
pub fn render_evicted(listeners: &[(String, std::sync::Arc<AtomicU64>)], out: &mut String) {
    let m = "weir_proxy_connections_evicted_total";
    head(
        out,
        m,
        "Idle client connections closed at connections_max for a new one, per listener.",
        "counter",
    );
    for (name, n) in listeners {
        let _ = writeln!(
            out,
            "{m}{{listener=\"{}\"}} {}",
            label(name),
            n.load(Relaxed)
        );
    }
}

/// Appends the body memory budget's figures.
pub fn render_budget(b: &crate::budget::Budget, out: &mut String) {
    let series: [(&str, &str, &str, u64); 4] = [
        (
            "weir_proxy_body_bytes_in_memory",
            "Body bytes held in memory now (reserved in body_memory_max).",
            "gauge",
            b.used(),
        ),
        (
            "weir_proxy_body_bytes_in_memory_max",
            "The most body bytes held in memory at once since the start.",
            "gauge",
            b.peak(),
        ),
        (
            "weir_proxy_body_memory_max_bytes",
            "The budget of body bytes held in memory (body_memory_max).",
            "gauge",
            b.max(),
        ),
        (
            "weir_proxy_bodies_spilled_total",
            "Request bodies whose capture copy went to a spill file past the budget.",
            "counter",
            b.spilled.load(Relaxed),
        ),
    ];
    for (m, help, kind, v) in series {
        head(out, m, help, kind);
        let _ = writeln!(out, "{m} {v}");
    }
}

fn head(out: &mut String, m: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {m} {help}\n# TYPE {m} {kind}");
}

fn render_routes(routes: &[(&str, &RouteCounters)], out: &mut String) {
    head(
        out,
        "weir_proxy_requests_total",
        "Requests routed, per route.",
        "counter",
    );
    for (name, c) in routes {
        let _ = writeln!(
            out,
            "weir_proxy_requests_total{{route=\"{name}\"}} {}",
            c.requests.load(Relaxed)
        );
    }
    head(
        out,
        "weir_proxy_responses_total",
        "Answers to clients, per route and status class.",
        "counter",
    );
    for (name, c) in routes {
        for (i, n) in c.status.iter().enumerate() {
            let _ = writeln!(
                out,
                "weir_proxy_responses_total{{route=\"{name}\",class=\"{}xx\"}} {}",
                i + 1,
                n.load(Relaxed)
            );
        }
    }
    head(
        out,
        "weir_proxy_captures_total",
        "Requests captured for replay, or why not.",
        "counter",
    );
    for (name, c) in routes {
        let s = &c.shared;
        for (outcome, v) in [
            ("captured", &s.captured),
            ("too_large", &s.too_large),
            ("incomplete", &s.incomplete),
            ("failed", &s.failed),
            ("not_ready", &s.not_ready),
            ("over_budget", &s.over_budget),
        ] {
            let _ = writeln!(
                out,
                "weir_proxy_captures_total{{route=\"{name}\",outcome=\"{outcome}\"}} {}",
                v.load(Relaxed)
            );
        }
    }
}

type ShadowSeries = (
    &'static str,
    &'static str,
    &'static str,
    fn(&ShadowRow<'_>) -> Option<u64>,
);

fn render_shadows(shadows: &[ShadowRow<'_>], out: &mut String) {
    head(
        out,
        "weir_proxy_replays_total",
        "Replays answered by the shadow, per status class.",
        "counter",
    );
    for r in shadows {
        for (i, n) in r.counters.status.iter().enumerate() {
            let _ = writeln!(
                out,
                "weir_proxy_replays_total{{route=\"{}\",shadow=\"{}\",class=\"{}xx\"}} {}",
                r.route,
                r.shadow,
                i + 1,
                n.load(Relaxed)
            );
        }
    }
    let series: [ShadowSeries; 6] = [
        (
            "weir_proxy_replays_failed_total",
            "Replays out of attempts, kept as dead letters.",
            "counter",
            |r| Some(r.counters.failed.load(Relaxed)),
        ),
        (
            "weir_proxy_replay_retries_total",
            "Replay attempts not delivered, tried again.",
            "counter",
            |r| Some(r.counters.retried.load(Relaxed)),
        ),
        (
            "weir_proxy_replay_dead_letters",
            "Dead letters of the shadow not yet re-driven.",
            "gauge",
            |r| r.dead_letters,
        ),
        (
            "weir_proxy_shadow_up",
            "1 while the shadow is up, 0 while it is down (probed).",
            "gauge",
            |r| Some(u64::from(r.up)),
        ),
        (
            "weir_proxy_replays_skipped_total",
            "Captured requests left out by sample_percent.",
            "counter",
            |r| Some(r.counters.skipped.load(Relaxed)),
        ),
        (
            "weir_proxy_replay_backlog",
            "Captured requests not yet replayed to the shadow.",
            "gauge",
            |r| r.backlog,
        ),
    ];
    for (metric, help, kind, value) in series {
        head(out, metric, help, kind);
        for r in shadows {
            let Some(v) = value(r) else { continue };
            let _ = writeln!(
                out,
                "{metric}{{route=\"{}\",shadow=\"{}\"}} {v}",
                r.route, r.shadow,
            );
        }
    }
}

/// A label value with `\\`, `"` and newlines escaped, as the text format wants.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The diffing series: comparisons by outcome, differences by field and kind, and
/// the noise fields learned per route.
pub fn render_diffs(report: &[crate::differ::RouteReport], out: &mut String) {
    if report.is_empty() {
        return;
    }
    head(
        out,
        "weir_proxy_diff_compared_total",
        "Shadow answers compared with the primary's, by outcome.",
        "counter",
    );
    for r in report {
        for s in &r.shadows {
            let t = &s.stats;
            for (outcome, n) in [
                ("same", t.same),
                ("different", t.different),
                ("noise", t.noise_only),
                ("skipped", t.skipped),
            ] {
                let _ = writeln!(
                    out,
                    "weir_proxy_diff_compared_total{{route=\"{}\",shadow=\"{}\",outcome=\"{outcome}\"}} {n}",
                    r.route, s.shadow
                );
            }
        }
    }
    head(
        out,
        "weir_proxy_diffs_total",
        "Compared answers that differed in a field (not noise), by field and kind.",
        "counter",
    );
    for r in report {
        for s in &r.shadows {
            for (field, kinds) in &s.stats.fields {
                for (kind, f) in kinds {
                    let _ = writeln!(
                        out,
                        "weir_proxy_diffs_total{{route=\"{}\",shadow=\"{}\",field=\"{}\",kind=\"{}\"}} {}",
                        r.route,
                        s.shadow,
                        label(field),
                        kind.as_str(),
                        f.count
                    );
                }
            }
        }
    }
    head(
        out,
        "weir_proxy_diff_noise_fields",
        "Fields learned as noise from the reference, per route.",
        "gauge",
    );
    for r in report {
        let _ = writeln!(
            out,
            "weir_proxy_diff_noise_fields{{route=\"{}\"}} {}",
            r.route,
            r.noise_fields.len()
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn labels_are_escaped() {
        assert_eq!(super::label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
