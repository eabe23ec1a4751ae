//! Diffing as it runs: a diffing shadow's answer is read (up to the route's
//! `capture_bytes_max`), compared with the primary's answer captured with the
//! request (`diff.rs`), and, when it differs and the route has a `reference`, the
//! same request goes to the reference so that what differs between the primary and
//! the reference is learned as noise before the comparison is counted.
//!
//! The reference is asked only when a shadow's answer differs in a field not yet
//! known as noise: an answer that is the same, or differs only in known noise, needs
//! nothing more to explain it. Bodies are compared decoded (`gzip`, `deflate`).

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::Response;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::capture::Captured;
use crate::client::{http_client, HttpClient};
use crate::config::{DiffSettings, RouteSettings, Target};
use crate::diff::{compare, About, Answer, Noise, ShadowDiffStats};

const REFERENCE_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A route's diffing: its settings, its reference and the noise learned.
pub struct RouteDiff {
    pub route: String,
    pub settings: DiffSettings,
    pub body_bytes_max: u64,
    /// Waits for the reference's answer.
    pub timeout: Duration,
    reference: Option<(Target, HttpClient)>,
    pub noise: Mutex<Noise>,
}

impl RouteDiff {
    pub fn new(route: &RouteSettings) -> RouteDiff {
        RouteDiff {
            route: route.name.clone(),
            settings: route.diff.clone(),
            body_bytes_max: route.capture_bytes_max,
            timeout: route.request_timeout,
            reference: route
                .diff
                .reference
                .clone()
                .map(|t| (t, http_client(REFERENCE_CONNECT_TIMEOUT, &route.tls))),
            noise: Mutex::new(Noise::default()),
        }
    }

    pub fn has_reference(&self) -> bool {
        self.reference.is_some()
    }
}

/// One diffing shadow's figures.
pub struct ShadowDiff {
    pub route: Arc<RouteDiff>,
    pub stats: Mutex<ShadowDiffStats>,
}

/// An answer read for comparison.
pub struct Read {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    pub whole: bool,
}

impl Read {
    fn answer(&self) -> Answer<'_> {
        Answer {
            status: self.status,
            headers: &self.headers,
            body: &self.body,
            body_whole: self.whole,
        }
    }

    /// The answer with its body as compared (see [`decoded`]).
    fn decoded(self) -> Read {
        let (body, whole) = decoded(&self.body, &self.headers, self.whole);
        Read {
            body,
            whole,
            ..self
        }
    }
}

/// A body decoded for comparison, bodies grow past this when inflated and are then
/// not compared (a small compressed body can inflate a thousandfold).
const DECODED_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// A body as compared: decoded from its `Content-Encoding` when that is `gzip` or
/// `deflate` (so compressed JSON is compared field by field); `false` (not
/// compared) for any other encoding, a body that does not decode, or one that was
/// not whole.
pub fn decoded(body: &Bytes, headers: &[(String, String)], whole: bool) -> (Bytes, bool) {
    use std::io::Read as _;
    if !whole {
        return (Bytes::new(), false);
    }
    let encoding = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-encoding"))
        .map(|(_, v)| v.trim().to_ascii_lowercase());
    let mut out = Vec::new();
    let read = match encoding.as_deref() {
        None | Some("") | Some("identity") => return (body.clone(), true),
        Some("gzip") | Some("x-gzip") => flate2::read::GzDecoder::new(&body[..])
            .take(DECODED_BYTES_MAX + 1)
            .read_to_end(&mut out),
        Some("deflate") => flate2::read::ZlibDecoder::new(&body[..])
            .take(DECODED_BYTES_MAX + 1)
            .read_to_end(&mut out),
        Some(_) => return (Bytes::new(), false),
    };
    match read {
        Ok(n) if (n as u64) <= DECODED_BYTES_MAX => (Bytes::from(out), true),
        _ => (Bytes::new(), false),
    }
}

/// Headers as text, less hop-by-hop ones and values that are not UTF-8.
pub fn header_pairs(headers: &hyper::HeaderMap) -> Vec<(String, String)> {
    let mut headers = headers.clone();
    crate::headers::remove_hop_by_hop(&mut headers);
    headers
        .iter()
        .filter_map(|(k, v)| {
            v.to_str()
                .ok()
                .map(|v| (k.as_str().to_string(), v.to_string()))
        })
        .collect()
}

/// Reads an answer: its body up to `max` bytes within `within` (past either, the
/// body is not whole and is not compared).
pub async fn read(response: Response<Incoming>, max: u64, within: Duration) -> Read {
    let (parts, mut body) = response.into_parts();
    let mut buf = BytesMut::new();
    let mut whole = false;
    let reading = async {
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { return false };
            if let Some(data) = frame.data_ref() {
                if (buf.len() + data.len()) as u64 > max {
                    return false;
                }
                buf.extend_from_slice(data);
            }
        }
        true
    };
    if let Ok(done) = tokio::time::timeout(within, reading).await {
        whole = done;
    }
    if !whole {
        buf.clear();
    }
    Read {
        status: parts.status.as_u16(),
        headers: header_pairs(&parts.headers),
        body: buf.freeze(),
        whole,
    }
}

impl ShadowDiff {
    /// Compares the shadow's answer to a captured request with the primary's, and
    /// counts it.
    pub async fn judge(&self, c: &Captured, shadow: Read) {
        let Some(primary) = &c.response else {
            self.stats.lock().skipped += 1;
            return;
        };
        let primary = Read {
            status: primary.status,
            headers: primary.headers.clone(),
            body: primary.body.clone(),
            whole: primary.body_whole,
        }
        .decoded();
        let route = &self.route;
        let found = compare(
            &primary.answer(),
            &shadow.decoded().answer(),
            &route.settings,
        );
        let unexplained = {
            let noise = route.noise.lock();
            found.iter().any(|d| !noise.covers(&d.field))
        };
        if unexplained {
            // A reference that answered with another status (an error, a limit) says
            // nothing about which fields are noise: nothing is learned from it.
            if let Some(reference) = self.ask_reference(c).await {
                if reference.status == primary.status {
                    let reference = reference.decoded();
                    let noise = compare(&primary.answer(), &reference.answer(), &route.settings);
                    route.noise.lock().learn(&noise);
                }
            }
        }
        let about = About {
            at_ms: c.at_ms,
            method: &c.method,
            uri: &c.uri,
        };
        let noise = route.noise.lock();
        self.stats.lock().record(&found, &noise, &about);
    }

    /// The reference's answer to the same request; `None` when there is no
    /// reference or it did not answer (nothing is learned then).
    async fn ask_reference(&self, c: &Captured) -> Option<Read> {
        let route = &self.route;
        let (target, client) = route.reference.as_ref()?;
        let tag = format!("{}/reference", route.route);
        let req = crate::replay_request::request_for(target, &tag, c)?;
        match tokio::time::timeout(route.timeout, client.request(req)).await {
            Ok(Ok(response)) => Some(read(response, route.body_bytes_max, route.timeout).await),
            Ok(Err(e)) => {
                tracing::debug!(route = %route.route, error = %e, "the reference did not answer");
                None
            }
            Err(_) => None,
        }
    }
}

/// The diff report of one route, as `/proxy/diffs` and `weir diff report` show it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RouteReport {
    pub route: String,
    pub reference: bool,
    pub noise_fields: Vec<String>,
    pub shadows: Vec<ShadowReport>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShadowReport {
    pub shadow: String,
    #[serde(flatten)]
    pub stats: ShadowDiffStats,
}

/// Text from answers, safe for a terminal: control characters escaped.
fn shown(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// The report as text, for `weir diff report`: per route and shadow, the outcomes,
/// then each field that differed with its counts and latest sample.
pub fn report_text(report: &[RouteReport]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if report.is_empty() {
        out.push_str("no route has a shadow with diff = true\n");
    }
    for r in report {
        let reference = if r.reference {
            format!("{} noise fields learned", r.noise_fields.len())
        } else {
            "no reference".to_string()
        };
        let _ = writeln!(out, "route {} ({reference})", r.route);
        for n in &r.noise_fields {
            let _ = writeln!(out, "  noise: {n}");
        }
        for s in &r.shadows {
            let t = &s.stats;
            let _ = writeln!(
                out,
                "  shadow {}: {} compared, {} same, {} different, {} noise only, {} skipped",
                s.shadow, t.compared, t.same, t.different, t.noise_only, t.skipped
            );
            for (field, kinds) in &t.fields {
                for (kind, f) in kinds {
                    let (field, kind) = (shown(field), kind.as_str());
                    let _ = writeln!(out, "    {field} {kind}: {}", f.count);
                    if let Some(x) = f.samples.back() {
                        let _ = writeln!(
                            out,
                            "      e.g. {} {} at {}: primary {} / shadow {}",
                            shown(&x.method),
                            shown(&x.uri),
                            shown(&x.path),
                            shown(&x.primary),
                            shown(&x.shadow)
                        );
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diff::{Difference, Kind};

    #[test]
    fn the_text_report_names_fields_counts_and_a_sample() {
        assert!(report_text(&[]).contains("no route"));
        let mut stats = ShadowDiffStats::default();
        let about = About {
            at_ms: 1,
            method: "GET",
            uri: "/items/1",
        };
        let d = Difference {
            field: "body.price".into(),
            path: "body.price".into(),
            kind: Kind::Changed,
            primary: "10".into(),
            other: "11".into(),
        };
        stats.record(&[d], &Noise::default(), &about);
        let text = report_text(&[RouteReport {
            route: "api".into(),
            reference: true,
            noise_fields: vec!["body.ts".into()],
            shadows: vec![ShadowReport {
                shadow: "candidate".into(),
                stats,
            }],
        }]);
        assert!(
            text.contains("route api (1 noise fields learned)"),
            "{text}"
        );
        assert!(text.contains("noise: body.ts"));
        assert!(text.contains("1 compared, 0 same, 1 different"));
        assert!(text.contains("body.price changed: 1"));
        assert!(text.contains("GET /items/1 at body.price: primary 10 / shadow 11"));
        assert_eq!(shown("a\u{1b}[2Jb\n"), "a\\u{1b}[2Jb\\n");
    }

    #[test]
    fn compressed_bodies_are_compared_decoded() {
        use std::io::Write as _;
        let json = br#"{"a": 1}"#;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(json).unwrap();
        let gz = Bytes::from(gz.finish().unwrap());
        let h = |v: &str| vec![("content-encoding".to_string(), v.to_string())];
        assert_eq!(
            decoded(&gz, &h("gzip"), true),
            (Bytes::from_static(json), true)
        );
        assert_eq!(decoded(&gz, &[], true), (gz.clone(), true));
        assert!(
            !decoded(&gz, &h("br"), true).1,
            "not decodable here: not compared"
        );
        assert!(!decoded(&gz, &h("gzip"), false).1);
        assert!(!decoded(&Bytes::from_static(b"junk"), &h("gzip"), true).1);
    }

    #[test]
    fn the_report_round_trips_through_json() {
        let mut stats = ShadowDiffStats::default();
        let d = Difference {
            field: "header.x".into(),
            path: "header.x".into(),
            kind: Kind::Missing,
            primary: "a".into(),
            other: String::new(),
        };
        let about = About {
            at_ms: 5,
            method: "POST",
            uri: "/",
        };
        stats.record(&[d], &Noise::default(), &about);
        let report = vec![RouteReport {
            route: "api".into(),
            reference: false,
            noise_fields: vec![],
            shadows: vec![ShadowReport {
                shadow: "s".into(),
                stats,
            }],
        }];
        let json = serde_json::to_string(&report).unwrap();
        assert!(json.contains("\"missing\""), "{json}");
        let back: Vec<RouteReport> = serde_json::from_str(&json).unwrap();
        assert_eq!(report_text(&back), report_text(&report));
    }
}
