//! Response diffing: a diffing shadow's answer is compared with the primary's
//! (captured with the request), field by field: `status`, each header
//! (`header.NAME`, less the route's ignored ones), and the body, JSON-aware
//! (`body.a.b`, `*` for array indexes) when both bodies are JSON, as bytes
//! (`body`) otherwise.
//!
//! Noise is learned as Diffy does: when the route has a `reference` (a second
//! instance of the primary's version), the same request goes there too, and every
//! field that differs between the primary's answer and the reference's is noise
//! for the route from then on (a timestamp, a request id). A difference in a noise
//! field, or under one, is counted as noise, not reported.
//!
//! Everything is bounded: differences per comparison, fields and samples kept per
//! shadow, noise fields per route, the text of a sample. The figures live in memory
//! (a restart starts them again) and reach `/metrics` and the diff report.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::DiffSettings;

/// Differences found in one comparison, at most.
pub const DIFFERENCES_PER_COMPARISON_MAX: usize = 64;
/// Distinct (field, kind) pairs counted per shadow; more are counted under `(other)`.
pub const FIELDS_MAX: usize = 256;
/// Samples kept per (field, kind), the latest.
pub const SAMPLES_PER_FIELD: usize = 3;
/// Noise fields learned per route.
pub const NOISE_FIELDS_MAX: usize = 4096;
/// Characters of a value shown in a sample.
const SAMPLE_CHARS_MAX: usize = 200;
/// JSON nesting compared; deeper is compared as a whole.
const DEPTH_MAX: usize = 64;
/// The field that counts pairs past [`FIELDS_MAX`].
pub const OTHER_FIELD: &str = "(other)";

/// An answer as compared.
pub struct Answer<'a> {
    pub status: u16,
    pub headers: &'a [(String, String)],
    pub body: &'a [u8],
    /// False when the body was cut (over the capture limit, broken off): it is
    /// then not compared.
    pub body_whole: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Both have it, with different values.
    Changed,
    /// The primary has it, the other does not.
    Missing,
    /// The other has it, the primary does not.
    Extra,
    /// JSON of different types (a number against a string...).
    Type,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Changed => "changed",
            Kind::Missing => "missing",
            Kind::Extra => "extra",
            Kind::Type => "type",
        }
    }
}

/// One difference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    /// The field as counted: array indexes as `*`.
    pub field: String,
    /// The field where it was seen: `body.items.3.price`.
    pub path: String,
    pub kind: Kind,
    pub primary: String,
    pub other: String,
}

/// The differences between the primary's answer and another's, less ignored fields.
pub fn compare(primary: &Answer<'_>, other: &Answer<'_>, d: &DiffSettings) -> Vec<Difference> {
    let mut out = Found {
        list: Vec::new(),
        ignore: &d.ignore_fields,
    };
    if primary.status != other.status {
        out.push(
            "status".into(),
            "status".into(),
            Kind::Changed,
            primary.status.to_string(),
            other.status.to_string(),
        );
    }
    compare_headers(primary.headers, other.headers, &d.ignore_headers, &mut out);
    if primary.body_whole && other.body_whole {
        compare_bodies(primary.body, other.body, &mut out);
    }
    out.list
}

struct Found<'a> {
    list: Vec<Difference>,
    ignore: &'a [String],
}

impl Found<'_> {
    fn full(&self) -> bool {
        self.list.len() >= DIFFERENCES_PER_COMPARISON_MAX
    }

    fn push(&mut self, field: String, path: String, kind: Kind, primary: String, other: String) {
        if self.full() || self.ignore.iter().any(|f| under(&field, f)) {
            return;
        }
        self.list.push(Difference {
            field: clip(&field),
            path: clip(&path),
            kind,
            primary: clip(&primary),
            other: clip(&other),
        });
    }
}

/// Whether `field` is `parent` or lies under it (`body.a.b` under `body.a`).
pub fn under(field: &str, parent: &str) -> bool {
    field == parent
        || field
            .strip_prefix(parent)
            .is_some_and(|rest| rest.starts_with('.'))
}

fn clip(text: &str) -> String {
    match text.char_indices().nth(SAMPLE_CHARS_MAX) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_string(),
    }
}

/// Headers by lower-case name, several values joined with `, `.
fn header_map(headers: &[(String, String)], ignore: &[String]) -> BTreeMap<String, String> {
    let mut map: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in headers {
        let k = k.to_ascii_lowercase();
        if ignore.contains(&k) {
            continue;
        }
        map.entry(k)
            .and_modify(|all| {
                all.push_str(", ");
                all.push_str(v);
            })
            .or_insert_with(|| v.clone());
    }
    map
}

fn compare_headers(
    primary: &[(String, String)],
    other: &[(String, String)],
    ignore: &[String],
    out: &mut Found<'_>,
) {
    let (p, o) = (header_map(primary, ignore), header_map(other, ignore));
    let names: BTreeSet<&String> = p.keys().chain(o.keys()).collect();
    for name in names {
        let field = format!("header.{name}");
        match (p.get(name), o.get(name)) {
            (Some(a), Some(b)) if a != b => {
                out.push(field.clone(), field, Kind::Changed, a.clone(), b.clone())
            }
            (Some(a), None) => out.push(field.clone(), field, Kind::Missing, a.clone(), "".into()),
            (None, Some(b)) => out.push(field.clone(), field, Kind::Extra, "".into(), b.clone()),
            _ => {}
        }
    }
}

/// JSON field by field when both parse, bytes otherwise.
fn compare_bodies(primary: &[u8], other: &[u8], out: &mut Found<'_>) {
    if primary == other {
        return;
    }
    // JSON is taken for an object or an array: the first byte that is not white
    // space opens one (0x7b, 0x5b).
    const OPENERS: [u8; 2] = [0x7b, 0x5b];
    let json = |b: &[u8]| {
        let start = b.iter().find(|c| !c.is_ascii_whitespace());
        if start.is_some_and(|c| OPENERS.contains(c)) {
            serde_json::from_slice::<Value>(b).ok()
        } else {
            None
        }
    };
    match (json(primary), json(other)) {
        (Some(a), Some(b)) => compare_json(&a, &b, "body", "body", 0, out),
        _ => out.push(
            "body".into(),
            "body".into(),
            Kind::Changed,
            String::from_utf8_lossy(primary).into_owned(),
            String::from_utf8_lossy(other).into_owned(),
        ),
    }
}

fn kind_of(v: &Value) -> u8 {
    match v {
        Value::Null => 0,
        Value::Bool(_) => 1,
        Value::Number(_) => 2,
        Value::String(_) => 3,
        Value::Array(_) => 4,
        Value::Object(_) => 5,
    }
}

fn compare_json(a: &Value, b: &Value, field: &str, path: &str, depth: usize, out: &mut Found<'_>) {
    if out.full() || a == b {
        return;
    }
    let text = |v: &Value| v.to_string();
    match (a, b) {
        (Value::Object(x), Value::Object(y)) if depth < DEPTH_MAX => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let (f, p) = (format!("{field}.{k}"), format!("{path}.{k}"));
                match (x.get(k), y.get(k)) {
                    (Some(u), Some(v)) => compare_json(u, v, &f, &p, depth + 1, out),
                    (Some(u), None) => out.push(f, p, Kind::Missing, text(u), String::new()),
                    (None, Some(v)) => out.push(f, p, Kind::Extra, String::new(), text(v)),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if depth < DEPTH_MAX => {
            let f = format!("{field}.*");
            for i in 0..x.len().max(y.len()) {
                let p = format!("{path}.{i}");
                match (x.get(i), y.get(i)) {
                    (Some(u), Some(v)) => compare_json(u, v, &f, &p, depth + 1, out),
                    (Some(u), None) => {
                        out.push(f.clone(), p, Kind::Missing, text(u), String::new())
                    }
                    (None, Some(v)) => out.push(f.clone(), p, Kind::Extra, String::new(), text(v)),
                    (None, None) => {}
                }
            }
        }
        _ => {
            let kind = if kind_of(a) == kind_of(b) {
                Kind::Changed
            } else {
                Kind::Type
            };
            out.push(field.into(), path.into(), kind, text(a), text(b));
        }
    }
}

fn learnable(d: &Difference) -> bool {
    let element = matches!(d.kind, Kind::Missing | Kind::Extra) && d.field.ends_with(".*");
    d.field != "status" && d.field != "body" && !element
}

/// The fields learned as noise for a route.
#[derive(Default)]
pub struct Noise {
    fields: BTreeSet<String>,
}

impl Noise {
    /// Learns the fields of differences between the primary and the reference,
    /// less those that would hide too much: the status, a body compared as a whole,
    /// and array elements one side has and the other has not (a list that grew
    /// between the two calls says nothing about its elements' fields).
    pub fn learn(&mut self, differences: &[Difference]) {
        for d in differences.iter().filter(|d| learnable(d)) {
            if self.fields.len() >= NOISE_FIELDS_MAX {
                return;
            }
            self.fields.insert(d.field.clone());
        }
    }

    /// Whether a field is noise: learned itself, or under a learned field.
    pub fn covers(&self, field: &str) -> bool {
        self.fields.contains(field) || self.fields.iter().any(|n| under(field, n))
    }

    pub fn fields(&self) -> Vec<String> {
        self.fields.iter().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.fields.len()
    }
}

/// A difference as the report shows it, with the request it came from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Sample {
    pub at_ms: u64,
    pub method: String,
    pub uri: String,
    pub path: String,
    pub primary: String,
    pub shadow: String,
}

/// Counts and samples of one (field, kind).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FieldStats {
    pub count: u64,
    pub samples: VecDeque<Sample>,
}

/// What one shadow's comparisons found.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ShadowDiffStats {
    /// Answers compared.
    pub compared: u64,
    /// ... that were the same (less ignored fields).
    pub same: u64,
    /// ... that differed, in some field that is not noise.
    pub different: u64,
    /// ... whose differences were all noise.
    pub noise_only: u64,
    /// Replays not compared: the primary's answer was not captured.
    pub skipped: u64,
    /// By field, then kind.
    pub fields: BTreeMap<String, BTreeMap<Kind, FieldStats>>,
}

/// The request a comparison was about, for samples.
pub struct About<'a> {
    pub at_ms: u64,
    pub method: &'a str,
    pub uri: &'a str,
}

impl ShadowDiffStats {
    /// Counts one comparison: `differences` less those `noise` covers.
    pub fn record(&mut self, differences: &[Difference], noise: &Noise, about: &About<'_>) {
        self.compared += 1;
        let real: Vec<&Difference> = differences
            .iter()
            .filter(|d| !noise.covers(&d.field))
            .collect();
        if differences.is_empty() {
            self.same += 1;
            return;
        }
        if real.is_empty() {
            self.noise_only += 1;
            return;
        }
        self.different += 1;
        let mut seen = BTreeSet::new();
        for d in real {
            let field = if self.fields.contains_key(&d.field) || self.fields.len() < FIELDS_MAX {
                d.field.as_str()
            } else {
                OTHER_FIELD
            };
            let stats = self
                .fields
                .entry(field.to_string())
                .or_default()
                .entry(d.kind)
                .or_default();
            // Counted once per comparison per (field, kind), whatever the array size.
            if seen.insert((field.to_string(), d.kind)) {
                stats.count += 1;
            }
            if stats.samples.len() >= SAMPLES_PER_FIELD {
                stats.samples.pop_front();
            }
            stats.samples.push_back(Sample {
                at_ms: about.at_ms,
                method: about.method.to_string(),
                uri: clip(about.uri),
                path: d.path.clone(),
                primary: d.primary.clone(),
                shadow: d.other.clone(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer<'a>(status: u16, headers: &'a [(String, String)], body: &'a [u8]) -> Answer<'a> {
        Answer {
            status,
            headers,
            body,
            body_whole: true,
        }
    }

    fn settings() -> DiffSettings {
        DiffSettings {
            reference: None,
            ignore_headers: vec!["date".into()],
            ignore_fields: vec![],
        }
    }

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn one_changed_json_field_is_reported_on_exactly_that_field() {
        let hs = h(&[("content-type", "application/json"), ("date", "a")]);
        let other_hs = h(&[("content-type", "application/json"), ("date", "b")]);
        let p = br#"{"id": 7, "user": {"name": "ann", "tags": ["a", "b"]}, "n": 1.5}"#;
        let o = br#"{"n": 1.5, "id": 7, "user": {"name": "bob", "tags": ["a", "b"]}}"#;
        let found = compare(
            &answer(200, &hs, p),
            &answer(200, &other_hs, o),
            &settings(),
        );
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].field, "body.user.name");
        assert_eq!(found[0].kind, Kind::Changed);
        assert_eq!(
            (found[0].primary.as_str(), found[0].other.as_str()),
            ("\"ann\"", "\"bob\"")
        );
        // Same content, keys in another order: no difference.
        let same = compare(&answer(200, &hs, p), &answer(200, &hs, p), &settings());
        assert!(same.is_empty());
    }

    #[test]
    fn status_headers_arrays_types_and_bytes_are_compared() {
        let a = h(&[("x-a", "1"), ("x-b", "2")]);
        let b = h(&[("X-A", "1"), ("x-c", "3")]);
        let p = br#"{"items": [{"p": 1}, {"p": 2}], "v": "1"}"#;
        let o = br#"{"items": [{"p": 1}, {"p": 3}, {"p": 4}], "v": 1}"#;
        let found = compare(&answer(200, &a, p), &answer(500, &b, o), &settings());
        let got: Vec<(&str, &str, Kind)> = found
            .iter()
            .map(|d| (d.field.as_str(), d.path.as_str(), d.kind))
            .collect();
        assert_eq!(
            got,
            vec![
                ("status", "status", Kind::Changed),
                ("header.x-b", "header.x-b", Kind::Missing),
                ("header.x-c", "header.x-c", Kind::Extra),
                ("body.items.*.p", "body.items.1.p", Kind::Changed),
                ("body.items.*", "body.items.2", Kind::Extra),
                ("body.v", "body.v", Kind::Type),
            ]
        );
        // Not JSON: the body as a whole; a cut body is not compared.
        let found = compare(
            &answer(200, &[], b"abc"),
            &answer(200, &[], b"abd"),
            &settings(),
        );
        assert_eq!(found[0].field, "body");
        let mut cut = answer(200, &[], b"ab");
        cut.body_whole = false;
        assert!(compare(&answer(200, &[], b"abc"), &cut, &settings()).is_empty());
    }

    #[test]
    fn ignored_fields_and_limits_hold() {
        let mut s = settings();
        s.ignore_fields = vec!["body.meta".into(), "status".into()];
        let p = br#"{"meta": {"t": 1}, "metadata": 1}"#;
        let o = br#"{"meta": {"t": 2}, "metadata": 2}"#;
        let found = compare(&answer(200, &[], p), &answer(201, &[], o), &s);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].field, "body.metadata");
        // A huge array of differences stops at the limit; long values are clipped.
        let long = "x".repeat(1000);
        let p = serde_json::to_vec(&(0..1000).collect::<Vec<_>>()).unwrap();
        let o = serde_json::to_vec(&(0..1000).map(|i| format!("{long}{i}")).collect::<Vec<_>>())
            .unwrap();
        let found = compare(&answer(200, &[], &p), &answer(200, &[], &o), &settings());
        assert_eq!(found.len(), DIFFERENCES_PER_COMPARISON_MAX);
        assert!(found[0].other.chars().count() <= SAMPLE_CHARS_MAX + 3);
        // Deep nesting does not recurse without end.
        let deep = format!("{}1{}", "[".repeat(120), "]".repeat(120));
        let deeper = format!("{}2{}", "[".repeat(120), "]".repeat(120));
        let found = compare(
            &answer(200, &[], deep.as_bytes()),
            &answer(200, &[], deeper.as_bytes()),
            &settings(),
        );
        assert_eq!(found.len(), 1);
    }

    #[test]
    fn noise_is_learned_and_counted_apart() {
        let about = About {
            at_ms: 1,
            method: "GET",
            uri: "/a",
        };
        let p = br#"{"ts": 1, "v": 1, "meta": {"id": "a"}}"#;
        let reference = br#"{"ts": 2, "v": 1, "meta": {"id": "b"}}"#;
        let shadow = br#"{"ts": 3, "v": 1, "meta": {"id": "c"}}"#;
        let shadow_bad = br#"{"ts": 3, "v": 2, "meta": {"id": "c"}}"#;
        let mut noise = Noise::default();
        noise.learn(&compare(
            &answer(200, &[], p),
            &answer(200, &[], reference),
            &settings(),
        ));
        assert_eq!(noise.fields(), vec!["body.meta.id", "body.ts"]);
        let mut stats = ShadowDiffStats::default();
        for o in [&shadow[..], &shadow_bad[..], &p[..]] {
            let found = compare(&answer(200, &[], p), &answer(200, &[], o), &settings());
            stats.record(&found, &noise, &about);
        }
        assert_eq!(
            (
                stats.compared,
                stats.same,
                stats.different,
                stats.noise_only
            ),
            (3, 1, 1, 1)
        );
        assert_eq!(stats.fields.keys().collect::<Vec<_>>(), vec!["body.v"]);
        assert_eq!(stats.fields["body.v"][&Kind::Changed].count, 1);
        // A learned parent covers its children.
        let mut parent = Noise::default();
        parent.learn(&[Difference {
            field: "body.meta".into(),
            path: "body.meta".into(),
            kind: Kind::Type,
            primary: String::new(),
            other: String::new(),
        }]);
        assert!(parent.covers("body.meta.id") && !parent.covers("body.metadata"));
        // What would hide too much is not learned.
        let mut careful = Noise::default();
        let d = |field: &str, kind| Difference {
            field: field.into(),
            path: field.into(),
            kind,
            primary: String::new(),
            other: String::new(),
        };
        careful.learn(&[
            d("status", Kind::Changed),
            d("body", Kind::Changed),
            d("body.items.*", Kind::Extra),
            d("body.items.*.id", Kind::Changed),
        ]);
        assert_eq!(careful.fields(), vec!["body.items.*.id"]);
    }

    #[test]
    fn fields_and_samples_are_bounded() {
        let about = About {
            at_ms: 1,
            method: "GET",
            uri: "/a",
        };
        let mut stats = ShadowDiffStats::default();
        let noise = Noise::default();
        for i in 0..(FIELDS_MAX + 50) {
            let d = Difference {
                field: format!("body.f{i}"),
                path: format!("body.f{i}"),
                kind: Kind::Changed,
                primary: "1".into(),
                other: "2".into(),
            };
            stats.record(std::slice::from_ref(&d), &noise, &about);
            stats.record(&[d], &noise, &about);
        }
        assert_eq!(stats.fields.len(), FIELDS_MAX + 1);
        let other = &stats.fields[OTHER_FIELD][&Kind::Changed];
        assert_eq!(other.count, 100);
        assert_eq!(other.samples.len(), SAMPLES_PER_FIELD);
    }
}
