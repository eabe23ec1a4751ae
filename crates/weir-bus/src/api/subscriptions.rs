//! `/subscription` and `/subscriber`: a client token's one subscription (topics,
//! callback, batching, format), its signing secret, and the list of all of them.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};
use weir_backend::QueueStats;

use super::body::{json_body, json_object, read_body, REQUEST_BYTES_MAX};
use super::credentials::{caller, client};
use super::topics::{check_name, create_topic};
use crate::bus::Bus;
use crate::error::{ApiError, ApiResult};
use crate::guard::{check_callback, Policy};
use crate::meta::{Format, Meta, Secret, SubscriberMeta};
use crate::metrics::{index, lag};
use crate::names::{new_subscriber_id, topic_queue};
use crate::sign::new_secret;

/// The fields a subscription may have (routemaster's, and `format`).
const FIELDS: [&str; 6] = ["topics", "callback", "uuid", "timeout", "max", "format"];
pub const TIMEOUT_MS_DEFAULT: u64 = 500;
pub const TIMEOUT_MS_MAX: u64 = 3_600_000;
pub const MAX_EVENTS_DEFAULT: u64 = 100;
/// The response header that carries a new subscription's signing secret.
pub const SECRET_HEADER: &str = "webhook-secret";

/// What a subscription request asks for, checked.
struct Request {
    topics: Vec<String>,
    callback: String,
    uuid: Option<String>,
    timeout_ms: u64,
    max_events: u64,
    format: Format,
}

/// `POST /subscription` (or `/subscriber`): 204. Creates or replaces the caller's
/// subscription; topics that do not exist are created, unclaimed. A first
/// subscription gets a signing secret, returned once in the `webhook-secret` header.
pub async fn subscribe(
    State(bus): State<Arc<Bus>>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let token = client(&bus, &headers)?;
    let body = read_body(&bus, body, REQUEST_BYTES_MAX).await?;
    let req = parse(&bus, &json_object(&body)?)?;
    let now_ms = bus.backend.now_ms();
    let (topics_max, subscribers_max) = (bus.settings.topics_max, bus.settings.subscribers_max);
    let secret = bus
        .change(|meta| {
            if !meta.subscribers.contains_key(&token) && meta.subscribers.len() >= subscribers_max {
                return Err(ApiError::forbidden(format!(
                    "limit reached: at most {subscribers_max} subscribers (bus.subscribers_max)"
                )));
            }
            for t in &req.topics {
                create_topic(meta, t, topics_max)?;
            }
            let previous = meta.subscribers.remove(&token);
            let (id, secrets, redrive_below, created) = match previous {
                Some(p) => (p.id.clone(), p.secrets.clone(), p.redrive_below, None),
                None => {
                    let s = new_secret();
                    let secrets = vec![Secret {
                        secret: s.clone(),
                        created_at_ms: now_ms,
                        expires_at_ms: None,
                    }];
                    (new_subscriber_id(), secrets, 0, Some(s))
                }
            };
            meta.subscribers.insert(
                token.clone(),
                Arc::new(SubscriberMeta {
                    id,
                    uuid: req.uuid,
                    callback: req.callback,
                    timeout_ms: req.timeout_ms,
                    max_events: req.max_events,
                    topics: req.topics,
                    format: req.format,
                    secrets,
                    redrive_below,
                }),
            );
            Ok(created)
        })
        .await?;
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Some(secret) = secret.and_then(|s| HeaderValue::from_str(&s).ok()) {
        response.headers_mut().insert(SECRET_HEADER, secret);
    }
    Ok(response)
}

/// Checks a subscription request as routemaster did (unknown fields refused, an
/// array of topics required), and the callback against the SSRF guard.
fn parse(bus: &Bus, data: &Map<String, Value>) -> ApiResult<Request> {
    if let Some(k) = data.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ApiError::bad_request(format!(
            "bad data in payload: unknown field `{k}`"
        )));
    }
    let Some(Value::Array(list)) = data.get("topics") else {
        return Err(ApiError::bad_request("need an array of topics"));
    };
    let mut topics = Vec::with_capacity(list.len());
    for t in list {
        let name = t
            .as_str()
            .ok_or_else(|| ApiError::bad_request("need an array of topics"))?;
        check_name(name)?;
        if !topics.iter().any(|x| x == name) {
            topics.push(name.to_string());
        }
    }
    let callback = data
        .get("callback")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad_request("a `callback` URL is required"))?;
    let policy = Policy {
        allow_http: bus.settings.allow_http,
        allow_private_networks: bus.settings.allow_private_networks,
    };
    let callback = check_callback(callback, policy)
        .map_err(ApiError::bad_request)?
        .to_string();
    let (uuid, timeout_ms, max_events, format) = parse_options(bus, data)?;
    Ok(Request {
        topics,
        callback,
        uuid,
        timeout_ms,
        max_events,
        format,
    })
}

/// The optional fields of a subscription: uuid, timeout, max, format.
fn parse_options(
    bus: &Bus,
    data: &Map<String, Value>,
) -> ApiResult<(Option<String>, u64, u64, Format)> {
    let uuid = match data.get("uuid") {
        None | Some(Value::Null) => None,
        Some(Value::String(u))
            if u.len() <= 256 && !u.contains(':') && !u.chars().any(char::is_control) =>
        {
            Some(u.clone())
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "bad uuid: a string of at most 256 bytes, without `:`",
            ))
        }
    };
    let timeout_ms = match data.get("timeout") {
        None | Some(Value::Null) => TIMEOUT_MS_DEFAULT,
        Some(v) => v.as_u64().filter(|t| *t <= TIMEOUT_MS_MAX).ok_or_else(|| {
            ApiError::bad_request(format!("bad timeout: 0 to {TIMEOUT_MS_MAX} ms"))
        })?,
    };
    let batch_max = bus.settings.batch_events_max;
    let max_events = match data.get("max") {
        None | Some(Value::Null) => MAX_EVENTS_DEFAULT.min(batch_max),
        Some(v) => v
            .as_u64()
            .filter(|m| (1..=batch_max).contains(m))
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "bad max: 1 to {batch_max} events (bus.batch_events_max)"
                ))
            })?,
    };
    let format = match data.get("format").map(|v| v.as_str()) {
        None | Some(Some("routemaster")) => Format::Routemaster,
        Some(Some("cloudevents")) => Format::Cloudevents,
        Some(_) => {
            return Err(ApiError::bad_request(
                "bad format: `routemaster` or `cloudevents`",
            ))
        }
    };
    Ok((uuid, timeout_ms, max_events, format))
}

/// `DELETE /subscriber`: 204; the caller's subscription and its dead letters go.
pub async fn unsubscribe(State(bus): State<Arc<Bus>>, headers: HeaderMap) -> ApiResult<StatusCode> {
    let token = client(&bus, &headers)?;
    bus.change(|meta| {
        meta.subscribers
            .remove(&token)
            .map(|_| ())
            .ok_or_else(|| ApiError::not_found("subscriber not found"))
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /subscriber/topics/:name`: 204; 404 when not subscribed to it.
pub async fn unsubscribe_topic(
    State(bus): State<Arc<Bus>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    let token = client(&bus, &headers)?;
    bus.change(|meta| {
        if !meta.topics.contains_key(&name) {
            return Err(ApiError::not_found("topic not found"));
        }
        let s = meta
            .subscribers
            .get_mut(&token)
            .ok_or_else(|| ApiError::not_found("subscriber not found"))?;
        let s = Arc::make_mut(s);
        let before = s.topics.len();
        s.topics.retain(|t| *t != name);
        if s.topics.len() == before {
            return Err(ApiError::not_found("not subscribed"));
        }
        Ok(())
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /subscriptions` (or `/subscribers`): every subscription, with `events`:
/// `sent` (since start), `queued` (over its topics), `oldest` (age in ms of the
/// oldest queued event, `null` when none).
/// The figures of every topic queue some subscriber of `meta` reads.
pub async fn subscribed_stats(bus: &Bus, meta: &Meta) -> ApiResult<Vec<QueueStats>> {
    let names: BTreeSet<String> = meta
        .subscribers
        .values()
        .flat_map(|s| s.topics.iter().map(|t| topic_queue(t)))
        .collect();
    bus.backend
        .stats(Some(names.into_iter().collect()))
        .await
        .map_err(|e| ApiError::engine("reading the topics' figures", &e))
}

pub async fn list(State(bus): State<Arc<Bus>>, headers: HeaderMap) -> ApiResult<impl IntoResponse> {
    caller(&bus, &headers)?;
    let meta = bus.meta();
    let stats = subscribed_stats(&bus, &meta).await?;
    let stats = index(&stats);
    let counters: std::collections::HashMap<String, u64> = bus
        .counters()
        .into_iter()
        .map(|(token, _, c)| (token, c.sent.load(Relaxed)))
        .collect();
    let list: Vec<Value> = meta
        .subscribers
        .iter()
        .map(|(token, s)| {
            let (queued, oldest) = lag(&stats, &s.id, &s.topics);
            serde_json::json!({
                "subscriber": meta.tokens.get(token),
                "uuid": s.uuid,
                "callback": s.callback,
                "max_events": s.max_events,
                "timeout": s.timeout_ms,
                "topics": s.topics,
                "format": s.format,
                "events": {
                    "sent": counters.get(token).copied().unwrap_or(0),
                    "queued": queued,
                    "oldest": oldest,
                },
            })
        })
        .collect();
    Ok(json_body(Value::Array(list).to_string()))
}

/// `POST /subscriber/secret/rotate`: 200 `{"secret": NEW, "previous_expires_at": MS}`.
/// The new secret signs from now on; the previous one also signs until
/// `secret_overlap_ms` from now, so receivers can switch without a gap.
pub async fn rotate_secret(
    State(bus): State<Arc<Bus>>,
    headers: HeaderMap,
) -> ApiResult<impl IntoResponse> {
    let token = client(&bus, &headers)?;
    let now_ms = bus.backend.now_ms();
    let overlap_ms = u64::try_from(bus.settings.secret_overlap.as_millis()).unwrap_or(u64::MAX);
    let expires = now_ms.saturating_add(overlap_ms);
    let secret = new_secret();
    let new = secret.clone();
    bus.change(move |meta| {
        let s = meta
            .subscribers
            .get_mut(&token)
            .map(Arc::make_mut)
            .ok_or_else(|| ApiError::not_found("subscriber not found"))?;
        s.secrets
            .retain(|x| x.expires_at_ms.is_none_or(|t| now_ms < t));
        for old in &mut s.secrets {
            old.expires_at_ms = Some(old.expires_at_ms.unwrap_or(expires).min(expires));
        }
        s.secrets.insert(
            0,
            Secret {
                secret: new,
                created_at_ms: now_ms,
                expires_at_ms: None,
            },
        );
        Ok(())
    })
    .await?;
    let body = serde_json::json!({ "secret": secret, "previous_expires_at": expires });
    Ok(json_body(body.to_string()))
}
