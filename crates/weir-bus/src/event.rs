//! Events: what a publish must contain, how an event is stored in its topic's queue,
//! and the two forms a subscriber can receive (routemaster's JSON array, CloudEvents).
//!
//! The stored form is routemaster's event object without its topic,
//! `{"type":..,"url":..,"t":..,"data":..}`: delivery only prefixes it with the topic
//! and the event's id, so an event is never parsed again on its way out (the
//! CloudEvents form, an option, does parse it, keeping `data` as raw text).
//!
//! A publish's `data` must be JSON every common receiver parses (issue 32): nested
//! at most `data_depth_max` deep, numbers within a 64-bit float's range, strings
//! without lone surrogates. What is stored is never converted to a
//! `serde_json::Value` again on its way out: an event stored before the check (or
//! written by other means) is rendered as stored, never replaced by a placeholder.

use std::borrow::Cow;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

pub const TYPES: [&str; 4] = ["create", "update", "delete", "noop"];
/// The latest `timestamp` taken (9999-12-31T23:59:59.999Z): times after it have no
/// RFC 3339 form.
pub const TIMESTAMP_MS_MAX: u64 = 253_402_300_799_999;

/// A publish request's body. Unknown fields are ignored, as routemaster did.
#[derive(Deserialize)]
struct Publish {
    #[serde(rename = "type")]
    kind: Option<String>,
    url: Option<String>,
    timestamp: Option<serde_json::Value>,
    data: Option<Box<RawValue>>,
}

#[derive(Serialize)]
struct Stored<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    url: &'a str,
    t: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<&'a RawValue>,
}

/// Checks a publish body and returns the event as stored; the error says what is
/// wrong. `data` may nest `depth_max` levels deep (`bus.data_depth_max`).
pub fn parse_publish(body: &[u8], now_ms: u64, depth_max: usize) -> Result<Vec<u8>, String> {
    let p: Publish =
        serde_json::from_slice(body).map_err(|e| format!("bad event: invalid JSON ({e})"))?;
    let kind = p.kind.ok_or("bad event: `type` is missing")?;
    if !TYPES.contains(&kind.as_str()) {
        return Err(format!(
            "bad event: `type` must be one of {}",
            TYPES.join(", ")
        ));
    }
    let url = p.url.ok_or("bad event: `url` is missing")?;
    check_event_url(&url)?;
    let t = match p.timestamp {
        None | Some(serde_json::Value::Null) => now_ms,
        Some(v) => timestamp_ms(&v).ok_or(
            "bad event: `timestamp` must be milliseconds since 1970 before year 10000 (a number, a string of digits, or an RFC 3339 time)",
        )?,
    };
    let data = p.data.as_deref().filter(|d| d.get() != "null");
    if let Some(data) = data {
        check_data(data, depth_max)?;
    }
    let stored = Stored {
        kind: &kind,
        url: &url,
        t,
        data,
    };
    serde_json::to_vec(&stored).map_err(|e| format!("bad event: {e}"))
}

/// A publisher's `timestamp` as whole milliseconds since 1970. routemaster kept
/// whatever was sent; publishers rely on that with `time.time() * 1000` (a float) or a
/// string of digits, so those are taken, the fraction dropped, as is an RFC 3339 time.
/// `None` for what names no time: negative, past year 9999, not finite, or text that
/// is neither digits nor RFC 3339.
fn timestamp_ms(v: &serde_json::Value) -> Option<u64> {
    let from_f64 = |f: f64| {
        // Checked before the cast: `as` saturates, and NaN would become 0.
        (f.is_finite() && f >= 0.0 && f <= TIMESTAMP_MS_MAX as f64).then_some(f as u64)
    };
    let ms = match v {
        serde_json::Value::Number(n) => match n.as_u64() {
            Some(ms) => Some(ms),
            None => n.as_f64().and_then(from_f64),
        },
        serde_json::Value::String(s) => {
            if is_decimal(s) {
                match s.parse::<u64>() {
                    Ok(ms) => Some(ms),
                    Err(_) => s.parse::<f64>().ok().and_then(from_f64),
                }
            } else {
                rfc3339_ms(s)
            }
        }
        _ => None,
    };
    ms.filter(|ms| *ms <= TIMESTAMP_MS_MAX)
}

/// Digits, with at most one `.` followed by digits: `1767225600000`,
/// `1767225600000.5` (no sign, exponent, blanks or `inf`).
fn is_decimal(s: &str) -> bool {
    let (whole, fraction) = s.split_once('.').unwrap_or((s, "0"));
    !whole.is_empty()
        && !fraction.is_empty()
        && whole.bytes().all(|b| b.is_ascii_digit())
        && fraction.bytes().all(|b| b.is_ascii_digit())
}

/// Milliseconds since 1970 of an RFC 3339 time with its offset (`Z`, `+01:00`,
/// `-05:30`; `T`/`Z` in either case). A time without an offset is refused: it
/// names no instant.
fn rfc3339_ms(s: &str) -> Option<u64> {
    let s = s.to_ascii_uppercase();
    let (local, offset_min): (&str, i64) = if let Some(local) = s.strip_suffix('Z') {
        (local, 0)
    } else {
        // `+HH:MM` or `-HH:MM` at the end; `get` keeps the slicing panic-free.
        let split = s.len().checked_sub(6)?;
        let (local, zone) = (s.get(..split)?, s.get(split..)?);
        let sign = match zone.as_bytes().first()? {
            b'+' => 1,
            b'-' => -1,
            _ => return None,
        };
        let (h, m) = zone.get(1..)?.split_once(':')?;
        let two_digits = |t: &str| t.len() == 2 && t.bytes().all(|b| b.is_ascii_digit());
        if !two_digits(h) || !two_digits(m) {
            return None;
        }
        let (h, m): (i64, i64) = (h.parse().ok()?, m.parse().ok()?);
        if h > 23 || m > 59 {
            return None;
        }
        (local, sign * (h * 60 + m))
    };
    let utc = humantime::parse_rfc3339(&format!("{local}Z")).ok()?;
    let ms = i64::try_from(utc.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis()).ok()?;
    u64::try_from(ms.checked_sub(offset_min.checked_mul(60_000)?)?).ok()
}

/// Refuses `data` a common receiver cannot parse: nested deeper than `depth_max`
/// (routemaster-drain's Ruby parser stops past 100 levels, `serde_json` past 128), a
/// number beyond a 64-bit float (Go's `encoding/json` and `serde_json` refuse `1e999`,
/// Python's `json` turns it into infinity, which no JSON can hold), a lone surrogate
/// escape (`"\ud800"`: not Unicode).
pub fn check_data(data: &RawValue, depth_max: usize) -> Result<(), String> {
    if depth(data.get().as_bytes(), depth_max) > depth_max {
        return Err(format!(
            "bad event: `data` nests too deep: at most {depth_max} levels of arrays and objects (bus.data_depth_max)"
        ));
    }
    // Within the depth limit (at most 96, under serde_json's 128) the parse cannot
    // hit the recursion limit: what fails is a number or a string.
    match serde_json::from_str::<serde_json::Value>(data.get()) {
        Ok(_) => Ok(()),
        Err(e) => Err(format!(
            "bad event: `data` holds what receivers refuse ({e}): every number must fit a 64-bit float, every string be Unicode (no lone surrogate)"
        )),
    }
}

/// How deep the valid JSON text `json` nests (0 for a scalar, 1 for `[]`); the
/// count stops once it passes `limit`. A byte scan, no recursion: any depth is safe.
fn depth(json: &[u8], limit: usize) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in json {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
                if deepest > limit {
                    break;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// An event's URL, as routemaster checked it: `https`, with a host, no query string.
fn check_event_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("bad event: `url` ({e})"))?;
    if parsed.scheme() != "https" || parsed.host_str().is_none() {
        return Err("bad event: `url` must be an https URL".into());
    }
    if parsed.query().is_some() {
        return Err("bad event: `url` must not have a query string".into());
    }
    Ok(())
}

/// Whether stored bytes have the stored form (an object that starts with its type):
/// items a memcache client wrote into a topic's queue are not events.
pub fn is_stored_event(stored: &[u8]) -> bool {
    stored.starts_with(br#"{"type":""#) && stored.ends_with(b"}")
}

/// The event as delivered in routemaster's format: topic and id, then the stored
/// fields; `None` when `stored` does not pass [`is_stored_event`].
pub fn delivered(topic: &str, id: &str, stored: &[u8]) -> Option<Vec<u8>> {
    if !is_stored_event(stored) {
        return None;
    }
    let fields = stored.strip_prefix(b"{")?;
    let mut out = Vec::with_capacity(stored.len() + topic.len() + id.len() + 24);
    out.extend_from_slice(b"{\"topic\":");
    // Topic names and ids are plain ASCII (`[a-z_]`, digits, `.`): no escaping needed.
    out.push(b'"');
    out.extend_from_slice(topic.as_bytes());
    out.extend_from_slice(b"\",\"id\":\"");
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b"\",");
    out.extend_from_slice(fields);
    Some(out)
}

/// An event's id: topic, the topic's epoch, the event's seq in the topic's queue.
/// The same on every delivery of the event, replays included.
pub fn event_id(topic: &str, epoch: u32, seq: u64) -> String {
    format!("{topic}.{epoch:08x}.{seq}")
}

/// A batch body in routemaster's format: a JSON array of delivered events.
pub fn routemaster_batch<'a>(events: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = vec![b'['];
    for (i, e) in events.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(e);
    }
    out.push(b']');
    out
}

/// An event in its delivered form, its `data` kept as raw text (any depth, any
/// number: what was stored comes out unchanged).
#[derive(Deserialize)]
struct Delivered<'a> {
    #[serde(borrow)]
    topic: Cow<'a, str>,
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    url: Cow<'a, str>,
    t: u64,
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
}

#[derive(Serialize)]
struct CloudEvent<'a> {
    specversion: &'static str,
    id: &'a str,
    source: String,
    #[serde(rename = "type")]
    kind: String,
    subject: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    datacontenttype: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<&'a RawValue>,
}

/// A batch body as `application/cloudevents-batch+json`: each event becomes a
/// CloudEvent (`id`, `source` `/topics/TOPIC`, `type` `weir.bus.TYPE`, `subject` the
/// event's URL, `time` from `t`, `data` as stored). An event not in the delivered
/// form fails the whole body, with the reason: never a placeholder in its stead.
pub fn cloudevents_batch<'a>(events: impl Iterator<Item = &'a [u8]>) -> Result<Vec<u8>, String> {
    let mut parsed = Vec::new();
    for (i, e) in events.enumerate() {
        let d: Delivered = serde_json::from_slice(e)
            .map_err(|err| format!("event {i} of the batch has no CloudEvents form: {err}"))?;
        parsed.push(d);
    }
    let out: Vec<CloudEvent> = parsed.iter().map(cloudevent).collect();
    serde_json::to_vec(&out).map_err(|e| format!("could not write the CloudEvents batch: {e}"))
}

fn cloudevent<'a>(d: &'a Delivered<'a>) -> CloudEvent<'a> {
    // Out of RFC 3339's range (only an event stored without the check): no `time`,
    // which CloudEvents allows.
    let time = std::time::UNIX_EPOCH
        .checked_add(std::time::Duration::from_millis(d.t))
        .filter(|_| d.t <= TIMESTAMP_MS_MAX)
        .and_then(|time| {
            let mut rfc3339 = String::new();
            write!(rfc3339, "{}", humantime::format_rfc3339_millis(time)).ok()?;
            Some(rfc3339)
        });
    CloudEvent {
        specversion: "1.0",
        id: &d.id,
        source: format!("/topics/{}", d.topic),
        kind: format!("weir.bus.{}", d.kind),
        subject: &d.url,
        time,
        datacontenttype: d.data.map(|_| "application/json"),
        data: d.data,
    }
}

/// The body of `GET /subscriber/dead_letters`, `{"count": N, "events": [...]}`: the
/// events go out as their stored text (`json!` would convert them to `Value`s and
/// panic on one no `Value` holds, like `1e999` or 200 levels).
pub fn dead_letter_listing(count: u64, events: &[Box<RawValue>]) -> Result<String, String> {
    #[derive(Serialize)]
    struct Listing<'a> {
        count: u64,
        events: &'a [Box<RawValue>],
    }
    serde_json::to_string(&Listing { count, events }).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publish_is_checked_and_stored_in_routemaster_form() {
        let stored = parse_publish(
            br#"{"type":"update","url":"https://a.example/orders/17","timestamp":5,"data":{"x":[1,2]},"extra":1}"#,
            99,
            64,
        )
        .unwrap();
        assert_eq!(
            stored,
            br#"{"type":"update","url":"https://a.example/orders/17","t":5,"data":{"x":[1,2]}}"#
        );
        assert!(is_stored_event(&stored));
        let no_time =
            parse_publish(br#"{"type":"noop","url":"https://a.example/1"}"#, 99, 64).unwrap();
        assert_eq!(
            no_time,
            br#"{"type":"noop","url":"https://a.example/1","t":99}"#
        );
        let out = delivered("orders", &event_id("orders", 10, 3), &no_time).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["topic"], "orders");
        assert_eq!(v["id"], "orders.0000000a.3");
        assert_eq!(v["t"], 99);
        assert!(v.get("data").is_none());
    }

    #[test]
    fn timestamps_are_normalised_as_routemaster_publishers_send_them() {
        let stored_t = |ts: &str| {
            let body = format!(r#"{{"type":"noop","url":"https://a.example/1","timestamp":{ts}}}"#);
            let stored = parse_publish(body.as_bytes(), 99, 64).map_err(|e| e.to_string())?;
            let v: serde_json::Value =
                serde_json::from_slice(&stored).map_err(|e| e.to_string())?;
            v["t"].as_u64().ok_or_else(|| format!("no t in {v}"))
        };
        for (sent, t) in [
            ("1700000000123", 1_700_000_000_123),
            // time.time() * 1000 in Python.
            ("1700000000123.9876", 1_700_000_000_123),
            ("1.7e12", 1_700_000_000_000),
            (r#""1700000000123""#, 1_700_000_000_123),
            (r#""1700000000123.5""#, 1_700_000_000_123),
            (r#""2023-11-14T22:13:20.123Z""#, 1_700_000_000_123),
            (r#""2023-11-14T22:13:20Z""#, 1_700_000_000_000),
            (r#""2023-11-14t22:13:20.123z""#, 1_700_000_000_123),
            (r#""2023-11-14T23:13:20.123+01:00""#, 1_700_000_000_123),
            (r#""2023-11-14T16:43:20.123-05:30""#, 1_700_000_000_123),
            ("0", 0),
            ("0.5", 0),
            ("253402300799999", TIMESTAMP_MS_MAX),
            ("null", 99),
        ] {
            assert_eq!(stored_t(sent), Ok(t), "{sent}");
        }
        for refused in [
            "-1",
            "-0.5",
            "253402300800000",
            "2.6e14",
            r#""soon""#,
            r#""-5""#,
            r#""NaN""#,
            r#""inf""#,
            r#""+5""#,
            r#""1e12""#,
            r#"" 1700000000123 ""#,
            r#""1.""#,
            r#"".5""#,
            r#""2023-11-14T22:13:20""#,
            r#""2023-11-14T22:13:20+1:00""#,
            r#""2023-11-14T22:13:20+24:00""#,
            r#""1970-01-01T00:00:00+01:00""#,
            r#""é""#,
            "true",
            "[1]",
            r#"{"t":1}"#,
        ] {
            let got = stored_t(refused);
            assert!(
                got.as_ref().is_err_and(|e| e.contains("timestamp")),
                "{refused}: {got:?}"
            );
        }
        // Past a 64-bit float: the body is not JSON serde_json takes.
        assert!(stored_t("1e999").is_err());
    }

    #[test]
    fn bad_events_are_refused_with_the_reason() {
        let bad = [
            (
                &br#"{"url":"https://a.example/1"}"#[..],
                "`type` is missing",
            ),
            (
                br#"{"type":"upsert","url":"https://a.example/1"}"#,
                "must be one of",
            ),
            (br#"{"type":"noop"}"#, "`url` is missing"),
            (br#"{"type":"noop","url":"http://a.example/1"}"#, "https"),
            (
                br#"{"type":"noop","url":"https://a.example/1?x=1"}"#,
                "query",
            ),
            (br#"{"type":"noop","url":"not a url"}"#, "`url`"),
            (
                br#"{"type":"noop","url":"https://a.example/1","timestamp":"soon"}"#,
                "timestamp",
            ),
            (
                br#"{"type":"noop","url":"https://a.example/1","timestamp":-1}"#,
                "timestamp",
            ),
            (
                br#"{"type":"noop","url":"https://a.example/1","timestamp":253402300800000}"#,
                "year 10000",
            ),
            (b"{\"type\":", "invalid JSON"),
            (b"[1]", "invalid JSON"),
            (b"\xff\xfe", "invalid JSON"),
        ];
        for (body, want) in bad {
            let e = parse_publish(body, 1, 64).unwrap_err();
            assert!(e.contains(want), "{} -> {e}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn batches_in_both_formats() {
        let a = delivered(
            "t",
            "t.00000001.1",
            br#"{"type":"create","url":"https://x/1","t":0,"data":{"k":1}}"#,
        )
        .unwrap();
        let b = delivered(
            "t",
            "t.00000001.2",
            br#"{"type":"delete","url":"https://x/2","t":1000}"#,
        )
        .unwrap();
        let rm: serde_json::Value =
            serde_json::from_slice(&routemaster_batch([&a[..], &b[..]].into_iter())).unwrap();
        assert_eq!(rm.as_array().map(Vec::len), Some(2));
        let ce: serde_json::Value =
            serde_json::from_slice(&cloudevents_batch([&a[..], &b[..]].into_iter()).unwrap())
                .unwrap();
        assert_eq!(ce[0]["specversion"], "1.0");
        assert_eq!(ce[0]["type"], "weir.bus.create");
        assert_eq!(ce[0]["source"], "/topics/t");
        assert_eq!(ce[0]["data"]["k"], 1);
        assert_eq!(ce[1]["time"], "1970-01-01T00:00:01.000Z");
        assert!(ce[1].get("data").is_none());
    }
}

/// Arbitrary JSON (deep, huge numbers, odd unicode, big arrays) through every form
/// an event takes: publish, both delivery formats, the dead-letter listing and the
/// re-drive's reading of a dead letter. Nothing panics; what the publish accepts,
/// and what was stored without the check, comes out intact.
#[cfg(test)]
mod props {
    use std::collections::HashMap;

    use proptest::collection::vec;
    use proptest::prelude::*;

    use super::*;
    use crate::worker::dead_letter_id;

    fn number() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| serde_json::Number::from_f64(f).map_or("0".into(), |n| n.to_string())),
            // Any digits and exponent: `1e999`, `-123e-4567`, 40-digit integers.
            "-?(0|[1-9][0-9]{0,40})(\\.[0-9]{1,20})?([eE][+-]?[0-9]{1,4})?",
        ]
    }

    fn string() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>().prop_map(|s| serde_json::Value::String(s).to_string()),
            // Escapes: lone and paired surrogates, NUL, a quote and a backslash.
            Just(r#""\ud800""#.to_string()),
            Just(r#""x\udc00""#.to_string()),
            Just(r#""\ud83d\ude00""#.to_string()),
            Just(r#""\u0000\"\\]}""#.to_string()),
        ]
    }

    fn json() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null".to_string()),
            Just("true".to_string()),
            Just("false".to_string()),
            number(),
            string(),
        ];
        let tree = leaf.prop_recursive(6, 128, 8, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..8).prop_map(|v| format!("[{}]", v.join(","))),
                vec((string(), inner), 0..8).prop_map(|kv| {
                    let fields: Vec<String> = kv.iter().map(|(k, v)| format!("{k}:{v}")).collect();
                    format!("{{{}}}", fields.join(","))
                }),
            ]
        });
        prop_oneof![
            4 => tree.clone(),
            // Deep: up to 140 levels of arrays or objects around a value.
            2 => (tree, 0usize..140, any::<bool>()).prop_map(|(v, n, objects)| {
                if objects {
                    format!("{}{v}{}", r#"{"k":"#.repeat(n), "}".repeat(n))
                } else {
                    format!("{}{v}{}", "[".repeat(n), "]".repeat(n))
                }
            }),
            // Big arrays.
            1 => vec(number(), 0..3000).prop_map(|v| format!("[{}]", v.join(","))),
        ]
    }

    /// The fields of each object of a JSON array, as raw text.
    fn raw_objects(body: &[u8]) -> Vec<HashMap<String, Box<RawValue>>> {
        serde_json::from_slice(body).unwrap()
    }

    /// Every form of a stored event: the data comes out as stored (`None`: no data).
    fn check_forms(stored: &[u8], data: Option<&str>) {
        let event = delivered("t", "t.00000001.7", stored).unwrap();
        let rm = routemaster_batch([&event[..], &event[..]].into_iter());
        let ce = cloudevents_batch([&event[..]].into_iter()).unwrap();
        let listed = RawValue::from_string(String::from_utf8(event.clone()).unwrap()).unwrap();
        let listing = dead_letter_listing(1, &[listed]).unwrap();
        #[derive(Deserialize)]
        struct Listing {
            count: u64,
            events: Vec<HashMap<String, Box<RawValue>>>,
        }
        let listing: Listing = serde_json::from_str(&listing).unwrap();
        assert_eq!(listing.count, 1);
        let rm = raw_objects(&rm);
        let ce = raw_objects(&ce);
        assert_eq!(rm.len(), 2);
        for e in [&rm[0], &rm[1], &ce[0], &listing.events[0]] {
            assert_eq!(e["id"].get(), r#""t.00000001.7""#);
        }
        for e in [&rm[0], &rm[1], &listing.events[0]] {
            assert_eq!(e.get("data").map(|d| d.get()), data);
        }
        // A CloudEvent has no `data` for a stored `null` (a publish stores none).
        let ce_data = data.filter(|d| *d != "null");
        assert_eq!(ce[0].get("data").map(|d| d.get()), ce_data);
        assert_eq!(ce[0]["type"].get(), r#""weir.bus.update""#);
        assert_eq!(dead_letter_id(&event).as_deref(), Some("t.00000001.7"));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn publish_accepts_only_what_receivers_parse_and_keeps_it_intact(
            data in json(),
            depth_max in 1usize..=96,
        ) {
            let body = format!(r#"{{"type":"update","url":"https://x.example/1","data":{data}}}"#);
            match parse_publish(body.as_bytes(), 5, depth_max) {
                Ok(stored) => {
                    prop_assert!(depth(data.as_bytes(), usize::MAX) <= depth_max);
                    // A receiver on serde_json (limit 128, no number past f64) parses
                    // the batch, and reads the data as the publisher wrote it.
                    let event = delivered("t", "t.00000001.7", &stored).unwrap();
                    let batch = routemaster_batch([&event[..]].into_iter());
                    let parsed: serde_json::Value = serde_json::from_slice(&batch).unwrap();
                    let sent: serde_json::Value = serde_json::from_str(&data).unwrap();
                    prop_assert_eq!(&parsed[0]["data"], &sent);
                    check_forms(&stored, (data != "null").then_some(data.as_str()));
                }
                Err(e) => {
                    prop_assert!(e.starts_with("bad event: `data`"), "{}", e);
                    let too_deep = depth(data.as_bytes(), usize::MAX) > depth_max;
                    prop_assert_eq!(too_deep, e.contains("nests too deep"), "{}", e);
                    if !too_deep {
                        prop_assert!(serde_json::from_str::<serde_json::Value>(&data).is_err());
                    }
                }
            }
        }

        #[test]
        fn any_timestamp_string_is_taken_as_a_time_or_refused_without_a_panic(
            text in prop_oneof![
                "\\PC{0,40}",
                "[0-9]{1,20}(\\.[0-9]{0,4})?",
                "[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{1,9})?([Zz]|[+-][0-9]{1,3}:[0-9]{1,3})?",
            ],
        ) {
            let body = serde_json::json!({"type": "noop", "url": "https://x.example/1", "timestamp": text});
            match parse_publish(body.to_string().as_bytes(), 5, 64) {
                Ok(stored) => {
                    let v: serde_json::Value = serde_json::from_slice(&stored).unwrap();
                    prop_assert!(v["t"].as_u64().is_some_and(|t| t <= TIMESTAMP_MS_MAX));
                }
                Err(e) => prop_assert!(e.contains("`timestamp`"), "{}", e),
            }
        }

        #[test]
        fn events_stored_without_the_check_come_out_as_stored(data in json()) {
            let stored = format!(r#"{{"type":"update","url":"https://x.example/1","t":5,"data":{data}}}"#);
            check_forms(stored.as_bytes(), Some(&data));
        }
    }

    #[test]
    fn depth_counts_brackets_outside_strings_only() {
        assert_eq!(depth(b"1", 10), 0);
        assert_eq!(depth(b"[]", 10), 1);
        assert_eq!(depth(br#"{"a":[{"b":"[[[\"[["}]}"#, 10), 3);
        assert_eq!(depth(br#"["\\",[1]]"#, 10), 2);
        // Counting stops past the limit.
        assert_eq!(depth(&b"[".repeat(100_000), 5), 6);
    }
}
