//! Event data the receivers cannot parse (issue 32): a publish whose `data` nests
//! too deep or holds a number out of a 64-bit float's range is refused with 400, and
//! such an event already stored (by a version without the check) still reaches every
//! door intact: both delivery formats, the dead-letter listing, re-drive. None of
//! them panics or substitutes a placeholder.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

mod common;

use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use common::{config, Receiver, TestBus};
use serde_json::json;
use serde_json::value::RawValue;
use weir_backend::AppendOptions;

const WAIT: Duration = Duration::from_secs(10);

/// `data` nested `depth` arrays deep: `[[[1]]]` is 3.
fn nested(depth: usize) -> String {
    format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
}

/// A publish body with `data` as given (raw JSON text).
fn publish_body(url: &str, data: &str) -> Vec<u8> {
    format!(r#"{{"type":"update","url":"{url}","timestamp":5,"data":{data}}}"#).into_bytes()
}

/// A JSON array of objects, each field kept as its raw text: no depth limit and no
/// number conversion, so the data comes back exactly as sent.
fn raw_objects(body: &[u8]) -> Vec<HashMap<String, Box<RawValue>>> {
    serde_json::from_slice(body).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(body));
    })
}

fn text(v: &RawValue) -> String {
    v.get().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_refuses_data_too_deep_or_out_of_range_with_the_reason() {
    let mut bus = TestBus::start(config()).await;
    let publisher = bus.token("pub").await;
    let post = |data: String| {
        let body = publish_body("https://x.example/1", &data);
        let bus = &bus;
        let publisher = &publisher;
        async move {
            let (s, _, b) = bus.call("POST", "/topics/t", publisher, Some(&body)).await;
            (s, String::from_utf8_lossy(&b).into_owned())
        }
    };
    for refused in [
        nested(127),
        nested(65),
        format!(r#"{{"a":{}}}"#, nested(64)),
    ] {
        let (s, b) = post(refused.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{refused}: {b}");
        assert!(b.contains("nests") && b.contains("64"), "{b}");
    }
    for refused in ["1e999", "[-1e400]", r#"{"a":{"b":123e308}}"#] {
        let (s, b) = post(refused.to_string()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{refused}: {b}");
        assert!(b.contains("number"), "{b}");
    }
    let (s, b) = post(r#""\ud800""#.to_string()).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
    assert!(b.contains("surrogate"), "{b}");
    for accepted in [
        nested(64),
        "1e308".to_string(),
        "123456789012345678901234567890".to_string(),
        "1e-999".to_string(),
        r#""\ud83d\ude00 \u0000 ☃""#.to_string(),
    ] {
        let (s, b) = post(accepted.clone()).await;
        assert_eq!(s, StatusCode::OK, "{accepted}: {b}");
    }
    bus.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_events_receivers_cannot_parse_still_reach_every_door_intact() {
    let dead_recv = Receiver::start().await;
    let ce_recv = Receiver::start().await;
    let mut cfg = config();
    cfg.attempts_max = Some(1);
    let mut bus = TestBus::start(cfg).await;
    let publisher = bus.token("pub").await;
    let (rm_sub, ce_sub) = (bus.token("rm").await, bus.token("ce").await);
    bus.subscribe(
        &rm_sub,
        json!({"topics": ["t"], "callback": dead_recv.url("s"), "max": 10, "timeout": 200}),
    )
    .await;
    bus.subscribe(&ce_sub, json!({"topics": ["t"], "callback": ce_recv.url("s"), "max": 10, "timeout": 200, "format": "cloudevents"}))
        .await;
    dead_recv.status.store(500, SeqCst);
    assert_eq!(
        bus.publish(&publisher, "t", "https://x.example/0").await,
        StatusCode::OK
    );
    // Events as a version without the check stored them.
    let datas = [nested(127), "1e999".to_string(), nested(300)];
    let backend = bus.backend.clone().unwrap();
    let queue = backend.queue("bus:topic:t").await.unwrap();
    for (i, data) in datas.iter().enumerate() {
        let stored = format!(
            r#"{{"type":"update","url":"https://x.example/{}","t":5,"data":{data}}}"#,
            i + 1
        );
        queue
            .append(stored.as_bytes(), AppendOptions::default())
            .await
            .unwrap();
    }

    // CloudEvents: the real ids, types and data, not a placeholder.
    let until = Instant::now() + WAIT;
    let ce = loop {
        let ce: Vec<_> = ce_recv
            .accepted("s")
            .iter()
            .flat_map(|d| raw_objects(&d.body))
            .collect();
        if ce.len() >= 4 {
            break ce;
        }
        assert!(Instant::now() < until, "{} cloudevents", ce.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(ce.len(), 4);
    for (i, e) in ce.iter().enumerate() {
        assert!(
            text(&e["id"]).ends_with(&format!(".{}\"", i + 1)),
            "{}",
            text(&e["id"])
        );
        assert_eq!(text(&e["source"]), r#""/topics/t""#);
        assert_eq!(text(&e["subject"]), format!(r#""https://x.example/{i}""#));
    }
    for (e, data) in ce[1..].iter().zip(&datas) {
        assert_eq!(text(&e["type"]), r#""weir.bus.update""#);
        assert_eq!(text(&e["data"]), *data);
    }

    // Dead letters: the listing answers, with every event as stored.
    let until = Instant::now() + WAIT;
    let listed = loop {
        let (s, _, body) = bus
            .call("GET", "/subscriber/dead_letters", &rm_sub, None)
            .await;
        assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        #[derive(serde::Deserialize)]
        struct Listing {
            count: u64,
            events: Vec<HashMap<String, Box<RawValue>>>,
        }
        let listing: Listing = serde_json::from_slice(&body).unwrap();
        if listing.count == 4 && listing.events.len() == 4 {
            break listing.events;
        }
        assert!(Instant::now() < until, "{} dead letters", listing.count);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for (e, data) in listed[1..].iter().zip(&datas) {
        assert_eq!(text(&e["data"]), *data);
    }

    // Re-drive: the receiver gets them again, intact and with their ids.
    dead_recv.status.store(200, SeqCst);
    let (s, v) = bus
        .json(
            "POST",
            "/subscriber/dead_letters/redrive",
            &rm_sub,
            json!({}),
        )
        .await;
    assert_eq!((s, v), (StatusCode::OK, json!({"redriving": 4})));
    let until = Instant::now() + WAIT;
    let redriven = loop {
        let got: Vec<_> = dead_recv
            .accepted("s")
            .iter()
            .flat_map(|d| raw_objects(&d.body))
            .collect();
        if got.len() >= 4 {
            break got;
        }
        assert!(Instant::now() < until, "{} re-driven", got.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let ids = |events: &[HashMap<String, Box<RawValue>>]| -> Vec<String> {
        events.iter().map(|e| text(&e["id"])).collect()
    };
    assert_eq!(ids(&redriven), ids(&listed));
    for (e, data) in redriven[1..].iter().zip(&datas) {
        assert_eq!(text(&e["data"]), *data);
    }
    bus.stop().await;
    dead_recv.stop();
    ce_recv.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_depth_limit_is_the_configs() {
    let mut cfg = config();
    cfg.data_depth_max = Some(3);
    let mut bus = TestBus::start(cfg).await;
    let publisher = bus.token("pub").await;
    let post = |depth: usize| {
        let body = publish_body("https://x.example/1", &nested(depth));
        let (bus, publisher) = (&bus, &publisher);
        async move {
            let (s, _, b) = bus.call("POST", "/topics/t", publisher, Some(&body)).await;
            (s, String::from_utf8_lossy(&b).into_owned())
        }
    };
    assert_eq!(post(3).await.0, StatusCode::OK);
    let (s, b) = post(4).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
    assert!(b.contains("at most 3 levels"), "{b}");
    bus.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_the_receiver_keeps_refusing_is_split_until_only_the_poison_event_is_dead_lettered()
{
    let recv = Receiver::start().await;
    *recv.refuse_containing.lock() = Some(b"poison".to_vec());
    let mut cfg = config();
    cfg.attempts_max = Some(4);
    let mut bus = TestBus::start(cfg).await;
    let publisher = bus.token("pub").await;
    let sub = bus.token("sub").await;
    for i in 0..8 {
        let url = if i == 5 {
            "https://x.example/poison".to_string()
        } else {
            format!("https://x.example/{i}")
        };
        assert_eq!(bus.publish(&publisher, "t", &url).await, StatusCode::OK);
    }
    // Subscribed after the publishes, moved back to the first: one batch of 8.
    bus.subscribe(
        &sub,
        json!({"topics": ["t"], "callback": recv.url("s"), "max": 8, "timeout": 0}),
    )
    .await;
    let (s, v) = bus
        .json(
            "POST",
            "/subscriber/topics/t/replay",
            &sub,
            json!({"seq": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let until = Instant::now() + WAIT;
    let dead = loop {
        let (_, v) = bus.get("/subscriber/dead_letters", &sub).await;
        if v["count"] == 1 {
            break v;
        }
        assert!(Instant::now() < until, "dead letters: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(dead["events"][0]["url"], "https://x.example/poison");
    let urls: Vec<String> = recv
        .wait_events("s", 7, WAIT)
        .await
        .iter()
        .map(|e| e["url"].as_str().unwrap().to_string())
        .collect();
    let want: Vec<String> = [0, 1, 2, 3, 4, 6, 7]
        .iter()
        .map(|i| format!("https://x.example/{i}"))
        .collect();
    assert_eq!(urls, want, "every other event delivered once, in order");
    // The whole batch was refused twice, then halves, quarters...: no batch with
    // the poison event was tried more than attempts_max times.
    let refused = recv.all("s").iter().filter(|d| d.status == 400).count();
    assert!(refused <= 2 + 2 + 2 + 4, "{refused} refusals");
    bus.stop().await;
    recv.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_refuses_everything_costs_a_few_parts_not_each_event() {
    let recv = Receiver::start().await;
    recv.status.store(400, SeqCst);
    let mut cfg = config();
    cfg.attempts_max = Some(2);
    let mut bus = TestBus::start(cfg).await;
    let publisher = bus.token("pub").await;
    let sub = bus.token("sub").await;
    for i in 0..8 {
        let url = format!("https://x.example/{i}");
        assert_eq!(bus.publish(&publisher, "t", &url).await, StatusCode::OK);
    }
    bus.subscribe(
        &sub,
        json!({"topics": ["t"], "callback": recv.url("s"), "max": 8, "timeout": 0}),
    )
    .await;
    let (s, v) = bus
        .json(
            "POST",
            "/subscriber/topics/t/replay",
            &sub,
            json!({"seq": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let until = Instant::now() + WAIT;
    let dead = loop {
        let (_, v) = bus.get("/subscriber/dead_letters", &sub).await;
        if v["count"] == 8 {
            break v;
        }
        assert!(Instant::now() < until, "dead letters: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let urls: Vec<&str> = dead["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["url"].as_str().unwrap())
        .collect();
    let want: Vec<String> = (0..8).map(|i| format!("https://x.example/{i}")).collect();
    assert_eq!(urls, want);
    // 8 -> 4 -> 2 -> 1 refused twice each; the first event dead-lettered, the rest
    // (1, 2..4, 4..8) go whole: 7 parts of 2 attempts, where splitting every part
    // down to single events would take 15.
    let tries: Vec<usize> = recv
        .all("s")
        .iter()
        .map(|d| {
            serde_json::from_slice::<Vec<serde_json::Value>>(&d.body)
                .unwrap()
                .len()
        })
        .collect();
    assert_eq!(tries, [8, 8, 4, 4, 2, 2, 1, 1, 1, 1, 2, 2, 4, 4]);
    bus.stop().await;
    recv.stop();
}
