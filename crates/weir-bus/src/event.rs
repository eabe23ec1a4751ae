//! Events: what a publish must contain, how an event is stored in its topic's queue,
//! and the two forms a subscriber can receive (routemaster's JSON array, CloudEvents).
//!
//! The stored form is routemaster's event object without its topic,
//! `{"type":..,"url":..,"t":..,"data":..}`: delivery only prefixes it with the topic
//! and the event's id, so an event is never parsed again on its way out (the
//! CloudEvents form, an option, does parse it).

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

/// Checks a publish body and returns the event as stored; the error says what is wrong.
pub fn parse_publish(body: &[u8], now_ms: u64) -> Result<Vec<u8>, String> {
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
        Some(v) => v.as_u64().filter(|t| *t <= TIMESTAMP_MS_MAX).ok_or(
            "bad event: `timestamp` must be a whole number of milliseconds before year 10000",
        )?,
    };
    let data = p.data.as_deref().filter(|d| d.get() != "null");
    let stored = Stored {
        kind: &kind,
        url: &url,
        t,
        data,
    };
    serde_json::to_vec(&stored).map_err(|e| format!("bad event: {e}"))
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
/// fields. `stored` must pass [`is_stored_event`].
pub fn delivered(topic: &str, id: &str, stored: &[u8]) -> Vec<u8> {
    debug_assert!(is_stored_event(stored));
    let mut out = Vec::with_capacity(stored.len() + topic.len() + id.len() + 24);
    out.extend_from_slice(b"{\"topic\":");
    // Topic names and ids are plain ASCII (`[a-z_]`, digits, `.`): no escaping needed.
    out.push(b'"');
    out.extend_from_slice(topic.as_bytes());
    out.extend_from_slice(b"\",\"id\":\"");
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b"\",");
    out.extend_from_slice(&stored[1..]);
    out
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

/// A batch body as `application/cloudevents-batch+json`: each event becomes a
/// CloudEvent (`id`, `source` `/topics/TOPIC`, `type` `weir.bus.TYPE`, `subject` the
/// event's URL, `time` from `t`, `data`).
pub fn cloudevents_batch<'a>(events: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
    let out: Vec<serde_json::Value> = events
        .map(|e| {
            let v: serde_json::Value = serde_json::from_slice(e).unwrap_or_default();
            let field = |k: &str| v.get(k).cloned().unwrap_or(serde_json::Value::Null);
            let topic = v.get("topic").and_then(|t| t.as_str()).unwrap_or("");
            let kind = v.get("type").and_then(|t| t.as_str()).unwrap_or("noop");
            let t_ms = v.get("t").and_then(|t| t.as_u64()).unwrap_or(0);
            let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(t_ms);
            let mut ce = serde_json::json!({
                "specversion": "1.0",
                "id": field("id"),
                "source": format!("/topics/{topic}"),
                "type": format!("weir.bus.{kind}"),
                "subject": field("url"),
            });
            let mut rfc3339 = String::new();
            if write!(rfc3339, "{}", humantime::format_rfc3339_millis(time)).is_ok() {
                ce["time"] = rfc3339.into();
            }
            if let Some(data) = v.get("data") {
                ce["datacontenttype"] = "application/json".into();
                ce["data"] = data.clone();
            }
            ce
        })
        .collect();
    serde_json::to_vec(&out).unwrap_or_else(|_| b"[]".to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publish_is_checked_and_stored_in_routemaster_form() {
        let stored = parse_publish(
            br#"{"type":"update","url":"https://a.example/orders/17","timestamp":5,"data":{"x":[1,2]},"extra":1}"#,
            99,
        )
        .unwrap();
        assert_eq!(
            stored,
            br#"{"type":"update","url":"https://a.example/orders/17","t":5,"data":{"x":[1,2]}}"#
        );
        assert!(is_stored_event(&stored));
        let no_time = parse_publish(br#"{"type":"noop","url":"https://a.example/1"}"#, 99).unwrap();
        assert_eq!(
            no_time,
            br#"{"type":"noop","url":"https://a.example/1","t":99}"#
        );
        let out = delivered("orders", &event_id("orders", 10, 3), &no_time);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["topic"], "orders");
        assert_eq!(v["id"], "orders.0000000a.3");
        assert_eq!(v["t"], 99);
        assert!(v.get("data").is_none());
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
            let e = parse_publish(body, 1).unwrap_err();
            assert!(e.contains(want), "{} -> {e}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn batches_in_both_formats() {
        let a = delivered(
            "t",
            "t.00000001.1",
            br#"{"type":"create","url":"https://x/1","t":0,"data":{"k":1}}"#,
        );
        let b = delivered(
            "t",
            "t.00000001.2",
            br#"{"type":"delete","url":"https://x/2","t":1000}"#,
        );
        let rm: serde_json::Value =
            serde_json::from_slice(&routemaster_batch([&a[..], &b[..]].into_iter())).unwrap();
        assert_eq!(rm.as_array().map(Vec::len), Some(2));
        let ce: serde_json::Value =
            serde_json::from_slice(&cloudevents_batch([&a[..], &b[..]].into_iter())).unwrap();
        assert_eq!(ce[0]["specversion"], "1.0");
        assert_eq!(ce[0]["type"], "weir.bus.create");
        assert_eq!(ce[0]["source"], "/topics/t");
        assert_eq!(ce[0]["data"]["k"], 1);
        assert_eq!(ce[1]["time"], "1970-01-01T00:00:01.000Z");
        assert!(ce[1].get("data").is_none());
    }
}
