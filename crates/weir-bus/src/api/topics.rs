//! `/topics`: publish an event (the first publisher claims the topic), list topics,
//! delete one.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use weir_backend::AppendOptions;

use super::body::{json_body, read_body};
use super::credentials::{caller, client, Caller};
use crate::bus::Bus;
use crate::error::{ApiError, ApiResult};
use crate::event::parse_publish;
use crate::live::LiveTopic;
use crate::meta::{Meta, TopicMeta};
use crate::names::{is_topic_name, topic_queue};

/// `POST /topics/:name` with an event: 200 once it is stored (durable as the
/// topic queue's durability says: `synced` waits for the fsync).
pub async fn publish(
    State(bus): State<Arc<Bus>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> ApiResult<StatusCode> {
    let token = client(&bus, &headers)?;
    check_name(&name)?;
    let rt = bus.topic(&name);
    if let Some(Some(publisher)) = rt.as_ref().map(|rt| &rt.publisher) {
        if *publisher != token {
            return Err(ApiError::forbidden("topic claimed"));
        }
    }
    let body = read_body(&bus, body, bus.settings.publish_bytes_max).await?;
    let depth_max = bus.settings.data_depth_max;
    let stored =
        parse_publish(&body, bus.backend.now_ms(), depth_max).map_err(ApiError::bad_request)?;
    let rt = match rt {
        Some(rt) if rt.publisher.as_deref() == Some(token.as_str()) => rt,
        _ => claim(&bus, &name, &token).await?,
    };
    let rt = match rt.queue.append(&stored, AppendOptions::default()).await {
        Ok(_) => rt,
        // Deleted outside the bus: made again, and the event goes there.
        Err(e) if e.kind() == weir_backend::Kind::NotFound => {
            bus.topic_gone(&name)
                .await
                .map_err(|e| ApiError::engine("making the topic's queue again", &e))?;
            let rt = bus
                .topic(&name)
                .ok_or_else(|| ApiError::engine("publishing", &e))?;
            rt.queue
                .append(&stored, AppendOptions::default())
                .await
                .map_err(|e| ApiError::engine("publishing", &e))?;
            rt
        }
        Err(e) => return Err(ApiError::engine("publishing", &e)),
    };
    for worker in &rt.wake {
        worker.notify_one();
    }
    Ok(StatusCode::OK)
}

/// Makes `token` the publisher of `name`, creating the topic if needed.
async fn claim(bus: &Arc<Bus>, name: &str, token: &str) -> ApiResult<Arc<LiveTopic>> {
    let topics_max = bus.settings.topics_max;
    bus.change(|meta| {
        match meta.topics.get_mut(name) {
            Some(t) => match &t.publisher {
                Some(p) if p != token => return Err(ApiError::forbidden("topic claimed")),
                _ => t.publisher = Some(token.to_string()),
            },
            None => {
                create_topic(meta, name, topics_max)?;
                if let Some(t) = meta.topics.get_mut(name) {
                    t.publisher = Some(token.to_string());
                }
            }
        }
        Ok(())
    })
    .await?;
    bus.topic(name)
        .ok_or_else(|| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the topic vanished"))
}

/// Adds an unclaimed topic to `meta` (no-op when it exists); 403 past `topics_max`.
pub fn create_topic(meta: &mut Meta, name: &str, topics_max: usize) -> ApiResult<()> {
    if meta.topics.contains_key(name) {
        return Ok(());
    }
    if meta.topics.len() >= topics_max {
        return Err(ApiError::forbidden(format!(
            "limit reached: at most {topics_max} topics (bus.topics_max)"
        )));
    }
    let topic = TopicMeta {
        publisher: None,
        epoch: rand::random(),
    };
    meta.topics.insert(name.to_string(), topic);
    Ok(())
}

pub fn check_name(name: &str) -> ApiResult<()> {
    if is_topic_name(name) {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            "bad topic: a name is 1 to 64 of a-z and `_`",
        ))
    }
}

/// `GET /topics`: `[{"name","publisher","events"}]`; `publisher` is the owner name of
/// the token that claimed it, `events` the number ever published (on the embedded
/// engine, where a queue's sequence is its own) or the number it keeps now (on
/// JetStream, where the queues share one stream's sequence).
pub async fn list(State(bus): State<Arc<Bus>>, headers: HeaderMap) -> ApiResult<impl IntoResponse> {
    caller(&bus, &headers)?;
    let meta = bus.meta();
    let per_queue_seqs = matches!(*bus.backend, weir_backend::Backend::Embedded(_));
    let kept: Option<HashMap<String, u64>> = if !per_queue_seqs {
        let names = meta.topics.keys().map(|n| topic_queue(n)).collect();
        let stats = bus.backend.stats(Some(names)).await;
        let stats = stats.map_err(|e| ApiError::engine("reading the topics' figures", &e))?;
        Some(stats.into_iter().map(|q| (q.name, q.items)).collect())
    } else {
        None
    };
    let mut list = Vec::with_capacity(meta.topics.len());
    for (name, t) in &meta.topics {
        let publisher = t.publisher.as_ref().and_then(|p| meta.tokens.get(p));
        let events = if let Some(kept) = &kept {
            kept.get(&topic_queue(name)).copied().unwrap_or(0)
        } else {
            let next = match bus.topic(name) {
                Some(rt) => rt.queue.bounds().await.ok().map(|(_, next)| next),
                None => None,
            };
            next.map_or(0, |next| next.saturating_sub(1))
        };
        list.push(serde_json::json!({ "name": name, "publisher": publisher, "events": events }));
    }
    Ok(json_body(serde_json::Value::Array(list).to_string()))
}

/// `DELETE /topics/:name`: 204, or 404 when there is no such topic. Only its
/// publisher or the root key may delete a claimed topic; its events go with it and
/// it leaves every subscription.
pub async fn remove(
    State(bus): State<Arc<Bus>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    let who = caller(&bus, &headers)?;
    bus.change(|meta| {
        let t = meta
            .topics
            .get(&name)
            .ok_or_else(|| ApiError::not_found("topic not found"))?;
        if let (Caller::Client(token), Some(publisher)) = (&who, &t.publisher) {
            if token != publisher {
                return Err(ApiError::forbidden(
                    "topic claimed: only its publisher or the root key may delete it",
                ));
            }
        }
        meta.topics.remove(&name);
        for s in meta.subscribers.values_mut() {
            if s.topics.contains(&name) {
                Arc::make_mut(s).topics.retain(|t| *t != name);
            }
        }
        Ok(())
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}
