//! Delivery to real HTTP receivers: batching, signatures, retries with backoff,
//! dead letters and re-drive, replay, CloudEvents, lag on `/metrics`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

mod common;

use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use base64::Engine;
use common::{config, Receiver, TestBus};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(10);

/// Checks a delivery's `webhook-signature` against `secret` (at least one of its
/// signatures must match).
fn signed_by(d: &common::Delivery, secret: &str) -> bool {
    let h = |k: &str| {
        d.headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let ts: u64 = h("webhook-timestamp").parse().unwrap();
    let want = weir_bus::signature(secret, &h("webhook-id"), ts, &d.body).unwrap();
    h("webhook-signature").split(' ').any(|s| s == want)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_go_out_by_max_or_timeout_across_topics_signed_and_authenticated() {
    let recv = Receiver::start().await;
    let mut bus = TestBus::start(config()).await;
    let publisher = bus.token("pub").await;
    let sub = bus.token("sub").await;
    let secret = bus
        .subscribe(&sub, json!({"topics": ["a", "b"], "callback": recv.url("s"), "uuid": "the-uuid", "max": 3, "timeout": 300}))
        .await
        .unwrap();
    let start = Instant::now();
    for i in 0..4 {
        assert_eq!(
            bus.publish(&publisher, "a", &format!("https://x.example/a/{i}"))
                .await,
            StatusCode::OK
        );
        assert_eq!(
            bus.publish(&publisher, "b", &format!("https://x.example/b/{i}"))
                .await,
            StatusCode::OK
        );
    }
    let events = recv.wait_events("s", 8, WAIT).await;
    let batches = recv.accepted("s");
    // 8 events at max 3: two full batches at once, the last 2 after the timeout.
    let sizes: Vec<usize> = batches.iter().map(|d| d.events().len()).collect();
    assert_eq!(sizes.iter().sum::<usize>(), 8);
    assert!(sizes.iter().all(|&n| n <= 3), "{sizes:?}");
    assert!(
        batches.iter().any(|d| {
            let topics: std::collections::BTreeSet<String> = d
                .events()
                .iter()
                .map(|e| e["topic"].as_str().unwrap().to_string())
                .collect();
            topics.len() == 2
        }),
        "one batch spans both topics"
    );
    let last = batches.last().unwrap();
    assert!(
        last.at.duration_since(start) >= Duration::from_millis(250),
        "a partial batch waits for its timeout"
    );
    // Per topic, in publish order; ids unique and stable in form.
    for topic in ["a", "b"] {
        let urls: Vec<&str> = events
            .iter()
            .filter(|e| e["topic"] == topic)
            .map(|e| e["url"].as_str().unwrap())
            .collect();
        let want: Vec<String> = (0..4)
            .map(|i| format!("https://x.example/{topic}/{i}"))
            .collect();
        assert_eq!(urls, want);
    }
    let ids: std::collections::BTreeSet<&str> =
        events.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 8);
    assert!(events
        .iter()
        .all(|e| e["type"] == "noop" && e["t"].as_u64().is_some()));
    for d in &batches {
        assert!(signed_by(d, &secret), "signature");
        assert_eq!(d.headers["content-type"], "application/json");
        let auth = d.headers["authorization"].to_str().unwrap();
        let creds = base64::engine::general_purpose::STANDARD
            .decode(auth.strip_prefix("Basic ").unwrap())
            .unwrap();
        assert_eq!(creds, b"the-uuid:x");
    }
    let (_, subs) = bus.get("/subscriptions", &sub).await;
    assert_eq!(subs[0]["events"]["sent"], 8);
    bus.stop().await;
    recv.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ssrf_guard_holds_at_delivery_when_the_policy_tightens() {
    let recv = Receiver::start().await;
    let mut bus = TestBus::start(config()).await;
    let publisher = bus.token("pub").await;
    let sub = bus.token("sub").await;
    // An IP-literal loopback callback, allowed when subscribing...
    bus.subscribe(
        &sub,
        json!({"topics": ["t"], "callback": recv.url("s"), "max": 1, "timeout": 0}),
    )
    .await;
    let mut strict = config();
    strict.allow_private_networks = Some(false);
    bus.restart_with(strict).await;
    // ... is refused at each attempt once the policy no longer allows it.
    bus.publish(&publisher, "t", "https://x.example/1").await;
    let until = Instant::now() + WAIT;
    while !bus
        .metrics()
        .lines()
        .any(|l| l.starts_with("weir_bus_subscriber_failed_attempts_total{") && !l.ends_with(" 0"))
    {
        assert!(Instant::now() < until, "no failed attempt");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(recv.all("s").is_empty(), "nothing reached the receiver");
    bus.stop().await;
    recv.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_goes_out_once_it_holds_batch_bytes_max() {
    let recv = Receiver::start().await;
    let mut cfg = config();
    cfg.batch_bytes_max = Some(250);
    let mut bus = TestBus::start(cfg).await;
    let publisher = bus.token("pub").await;
    let sub = bus.token("sub").await;
    // A long timeout: only the byte limit can send these batches.
    bus.subscribe(
        &sub,
        json!({"topics": ["t"], "callback": recv.url("s"), "max": 100, "timeout": 60_000}),
    )
    .await;
    // Each delivered event is about 95 bytes: 2 are under 250, 3 are over.
    recv.status.store(503, SeqCst);
    for i in 0..9 {
        bus.publish(&publisher, "t", &format!("https://x.example/{i}"))
            .await;
    }
    recv.status.store(204, SeqCst);
    recv.wait_events("s", 9, WAIT).await;
    let sizes: Vec<usize> = recv
        .accepted("s")
        .iter()
        .map(|d| d.events().len())
        .collect();
    assert_eq!(sizes, [3, 3, 3]);
    bus.stop().await;
    recv.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_fails_for_a_while_gets_everything_with_growing_pauses() {
    let recv = Receiver::start().await;
    let mut cfg = config();
    cfg.retry_initial_ms = Some(40);
    cfg.retry_ms_max = Some(2_000);
    let mut bus = TestBus::start(cfg).await;
    let publisher = bus.token("pub").await;
    let sub = bus.token("sub").await;
    bus.subscribe(
        &sub,
        json!({"topics": ["t"], "callback": recv.url("s"), "max": 100, "timeout": 0}),
    )
    .await;
    recv.fail_next.store(5, SeqCst);
    for i in 0..20 {
        assert_eq!(
            bus.publish(&publisher, "t", &format!("https://x.example/{i}"))
                .await,
            StatusCode::OK
        );
    }
    let events = recv.wait_events("s", 20, WAIT).await;
    let urls: Vec<String> = events
        .iter()
        .map(|e| e["url"].as_str().unwrap().to_string())
        .collect();
    let mut unique = urls.clone();
    unique.dedup();
    assert_eq!(
        unique,
        (0..20)
            .map(|i| format!("https://x.example/{i}"))
            .collect::<Vec<_>>()
    );
    // The first batch was tried 6 times with the same webhook-id; the pauses grow.
    let all = recv.all("s");
    let first_id = all[0].headers["webhook-id"].clone();
    let tries: Vec<Instant> = all
        .iter()
        .filter(|d| d.headers["webhook-id"] == first_id)
        .map(|d| d.at)
        .collect();
    assert_eq!(tries.len(), 6, "5 failures then the success");
    let gaps: Vec<Duration> = tries.windows(2).map(|w| w[1] - w[0]).collect();
    // Backoff d = 40 ms * 2^(n-1), jittered within [d/2, d]: the 5th pause is at
    // least 320 ms, the 1st at most 40 ms (plus scheduling).
    assert!(gaps[4] >= Duration::from_millis(320), "{gaps:?}");
    assert!(gaps[4] > gaps[0] * 3, "{gaps:?}");
    let metrics = bus.metrics();
    assert!(
        metrics.contains("weir_bus_subscriber_failed_attempts_total{subscriber=\"sub\""),
        "{metrics}"
    );
    assert!(
        metrics.lines().any(
            |l| l.starts_with("weir_bus_subscriber_failed_attempts_total") && l.ends_with(" 5")
        ),
        "{metrics}"
    );
    bus.stop().await;
    recv.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_forever_dead_letters_the_batch_and_redrive_delivers_it() {
    let recv = Receiver::start().await;
    let mut cfg = config();
    cfg.attempts_max = Some(3);
    let mut bus = TestBus::start(cfg).await;
    let publisher = bus.token("pub").await;
    let sub = bus.token("sub").await;
    bus.subscribe(
        &sub,
        json!({"topics": ["t"], "callback": recv.url("s"), "max": 2, "timeout": 0}),
    )
    .await;
    recv.status.store(500, SeqCst);
    for i in 0..4 {
        bus.publish(&publisher, "t", &format!("https://x.example/{i}"))
            .await;
    }
    let until = Instant::now() + WAIT;
    let dead = loop {
        let (_, v) = bus.get("/subscriber/dead_letters", &sub).await;
        if v["count"] == 4 {
            break v;
        }
        assert!(Instant::now() < until, "dead letters: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Each batch (a webhook-id) was tried exactly attempts_max times.
    let mut tries = std::collections::BTreeMap::new();
    for d in recv.all("s") {
        *tries
            .entry(d.headers["webhook-id"].to_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    assert!(tries.values().all(|&n| n == 3), "{tries:?}");
    let urls: Vec<&str> = dead["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["url"].as_str().unwrap())
        .collect();
    assert_eq!(
        urls,
        [
            "https://x.example/0",
            "https://x.example/1",
            "https://x.example/2",
            "https://x.example/3"
        ]
    );
    let ids: Vec<String> = dead["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert!(bus
        .metrics()
        .lines()
        .any(|l| l.starts_with("weir_bus_subscriber_dead_lettered_total") && l.ends_with(" 4")));
    assert!(bus
        .metrics()
        .lines()
        .any(|l| l.starts_with("weir_bus_subscriber_dead_letters{") && l.ends_with(" 4")));
    // A scrape without the queues' figures (they did not come in time) leaves the
    // backlog out rather than showing 0; the workers' own counters stay.
    let without = bus.metrics_without_figures();
    assert!(
        !without.contains("weir_bus_subscriber_dead_letters{"),
        "{without}"
    );
    assert!(
        !without.contains("weir_bus_subscriber_queued{"),
        "{without}"
    );
    assert!(without
        .lines()
        .any(|l| l.starts_with("weir_bus_subscriber_dead_lettered_total") && l.ends_with(" 4")));
    let (s, v) = bus.get("/subscriber/dead_letters?limit=0", &sub).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");

    recv.status.store(200, SeqCst);
    let (s, v) = bus
        .json("POST", "/subscriber/dead_letters/redrive", &sub, json!({}))
        .await;
    assert_eq!((s, v), (StatusCode::OK, json!({"redriving": 4})));
    let events = recv.wait_events("s", 4, WAIT).await;
    let redriven: Vec<String> = events
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(redriven, ids, "re-driven with the ids they had");
    // A new event after the re-drive is delivered too, and the dead letters are gone.
    bus.publish(&publisher, "t", "https://x.example/4").await;
    recv.wait_events("s", 5, WAIT).await;
    let (_, v) = bus.get("/subscriber/dead_letters", &sub).await;
    assert_eq!(v["count"], 0, "{v}");

    // Purge drops dead letters.
    recv.status.store(500, SeqCst);
    bus.publish(&publisher, "t", "https://x.example/5").await;
    let until = Instant::now() + WAIT;
    while bus.get("/subscriber/dead_letters", &sub).await.1["count"] != 1 {
        assert!(Instant::now() < until);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (s, v) = bus
        .json("DELETE", "/subscriber/dead_letters", &sub, json!(null))
        .await;
    assert_eq!((s, v), (StatusCode::OK, json!({"purged": 1})));
    assert_eq!(
        bus.get("/subscriber/dead_letters", &sub).await.1["count"],
        0
    );
    bus.stop().await;
    recv.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_from_a_seq_or_a_time_delivers_exactly_those_events_again() {
    let recv = Receiver::start().await;
    let mut cfg = config();
    cfg.retention_ms = Some(3_600_000);
    let mut bus = TestBus::start(cfg).await;
    let publisher = bus.token("pub").await;
    let sub = bus.token("sub").await;
    bus.subscribe(
        &sub,
        json!({"topics": ["t"], "callback": recv.url("s"), "max": 100, "timeout": 0}),
    )
    .await;
    for i in 1..=5 {
        bus.publish(&publisher, "t", &format!("https://x.example/{i}"))
            .await;
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    tokio::time::sleep(Duration::from_millis(30)).await;
    for i in 6..=8 {
        bus.publish(&publisher, "t", &format!("https://x.example/{i}"))
            .await;
    }
    let first = recv.wait_events("s", 8, WAIT).await;
    assert_eq!(first.len(), 8);
    // Seq 3 onwards: events 3..=8 again, with the same ids.
    let (s, v) = bus
        .json(
            "POST",
            "/subscriber/topics/t/replay",
            &sub,
            json!({"seq": 3}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["seq"], 3);
    let all = recv.wait_events("s", 14, WAIT).await;
    assert_eq!(&all[8..], &first[2..], "the same events, ids included");
    // From a time: the events published after it.
    let (s, v) = bus
        .json(
            "POST",
            "/subscriber/topics/t/replay",
            &sub,
            json!({"since": since}),
        )
        .await;
    assert_eq!((s, &v["seq"]), (StatusCode::OK, &json!(6)), "{v}");
    let all = recv.wait_events("s", 17, WAIT).await;
    assert_eq!(&all[14..], &first[5..]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(recv.events("s").len(), 17, "nothing more");
    for (body, status) in [
        (json!({}), StatusCode::BAD_REQUEST),
        (json!({"seq": 1, "since": 1}), StatusCode::BAD_REQUEST),
        (json!({"seq": -1}), StatusCode::BAD_REQUEST),
    ] {
        assert_eq!(
            bus.json("POST", "/subscriber/topics/t/replay", &sub, body)
                .await
                .0,
            status
        );
    }
    assert_eq!(
        bus.json(
            "POST",
            "/subscriber/topics/u/replay",
            &sub,
            json!({"seq": 1})
        )
        .await
        .0,
        StatusCode::NOT_FOUND
    );
    bus.stop().await;
    recv.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_format_and_secret_rotation_with_overlap() {
    let recv = Receiver::start().await;
    let mut bus = TestBus::start(config()).await;
    let publisher = bus.token("pub").await;
    let sub = bus.token("sub").await;
    let old = bus
        .subscribe(&sub, json!({"topics": ["t"], "callback": recv.url("s"), "max": 1, "timeout": 0, "format": "cloudevents"}))
        .await
        .unwrap();
    let body = json!({"type": "create", "url": "https://x.example/1", "timestamp": 1_000, "data": {"k": [1, 2]}});
    assert_eq!(
        bus.json("POST", "/topics/t", &publisher, body).await.0,
        StatusCode::OK
    );
    let until = Instant::now() + WAIT;
    while recv.accepted("s").is_empty() {
        assert!(Instant::now() < until);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let d = recv.accepted("s")[0].clone();
    assert_eq!(
        d.headers["content-type"],
        "application/cloudevents-batch+json"
    );
    let ce: Value = serde_json::from_slice(&d.body).unwrap();
    assert_eq!(ce[0]["specversion"], "1.0");
    assert_eq!(ce[0]["type"], "weir.bus.create");
    assert_eq!(ce[0]["source"], "/topics/t");
    assert_eq!(ce[0]["subject"], "https://x.example/1");
    assert_eq!(ce[0]["time"], "1970-01-01T00:00:01.000Z");
    assert_eq!(ce[0]["data"], json!({"k": [1, 2]}));
    assert!(signed_by(&d, &old));

    let (s, v) = bus
        .json("POST", "/subscriber/secret/rotate", &sub, json!({}))
        .await;
    assert_eq!(s, StatusCode::OK);
    let new = v["secret"].as_str().unwrap().to_string();
    assert_ne!(new, old);
    bus.publish(&publisher, "t", "https://x.example/2").await;
    let until = Instant::now() + WAIT;
    while recv.accepted("s").len() < 2 {
        assert!(Instant::now() < until);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let d = recv.accepted("s")[1].clone();
    assert!(
        signed_by(&d, &new) && signed_by(&d, &old),
        "both sign within the overlap"
    );
    bus.stop().await;

    // Past the overlap only the new one signs.
    let mut cfg = config();
    cfg.secret_overlap_ms = Some(0);
    bus.restart_with(cfg).await;
    let (_, v) = bus
        .json("POST", "/subscriber/secret/rotate", &sub, json!({}))
        .await;
    let newest = v["secret"].as_str().unwrap().to_string();
    bus.publish(&publisher, "t", "https://x.example/3").await;
    // (Event 2 may come again first: the stop may have cut its confirmation.)
    let until = Instant::now() + WAIT;
    let d = loop {
        let found = recv
            .accepted("s")
            .into_iter()
            .find(|d| d.events()[0]["subject"] == "https://x.example/3");
        if let Some(d) = found {
            break d;
        }
        assert!(Instant::now() < until);
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(signed_by(&d, &newest) && !signed_by(&d, &new) && !signed_by(&d, &old));
    bus.stop().await;
    recv.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_shows_on_metrics_while_the_receiver_is_down() {
    let recv = Receiver::start().await;
    let mut bus = TestBus::start(config()).await;
    let publisher = bus.token("pub").await;
    let sub = bus.token("sub").await;
    bus.subscribe(
        &sub,
        json!({"topics": ["t"], "callback": recv.url("s"), "max": 10, "timeout": 0}),
    )
    .await;
    recv.status.store(503, SeqCst);
    for i in 0..25 {
        bus.publish(&publisher, "t", &format!("https://x.example/{i}"))
            .await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let m = bus.metrics();
    assert!(
        m.contains("weir_bus_subscriber_queued{subscriber=\"sub\","),
        "{m}"
    );
    assert!(
        m.lines()
            .any(|l| l.starts_with("weir_bus_subscriber_queued{") && l.ends_with(" 25")),
        "{m}"
    );
    let (_, subs) = bus.get("/subscriptions", &sub).await;
    assert_eq!(subs[0]["events"]["queued"], 25);
    assert!(subs[0]["events"]["oldest"].as_u64().unwrap() >= 100);
    recv.status.store(204, SeqCst);
    recv.wait_events("s", 25, WAIT).await;
    let m = bus.metrics();
    assert!(
        m.lines()
            .any(|l| l.starts_with("weir_bus_subscriber_sent_total{") && l.ends_with(" 25")),
        "{m}"
    );
    assert!(
        m.lines()
            .any(|l| l.starts_with("weir_bus_delivery_latency_ms_count{") && l.ends_with(" 25")),
        "{m}"
    );
    bus.stop().await;
    recv.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaving_a_topic_drops_its_reader_and_coming_back_starts_at_the_end() {
    let recv = Receiver::start().await;
    let mut bus = TestBus::start(config()).await;
    let publisher = bus.token("pub").await;
    let sub = bus.token("sub").await;
    let both = json!({"topics": ["a", "b"], "callback": recv.url("s"), "max": 2, "timeout": 0});
    bus.subscribe(&sub, both.clone()).await;
    recv.status.store(503, SeqCst); // a backlog on `a` while the receiver fails
    for i in 0..5 {
        bus.publish(&publisher, "a", &format!("https://x.example/a/{i}"))
            .await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let left = bus.call("DELETE", "/subscriber/topics/a", &sub, None).await;
    assert_eq!(left.0, StatusCode::NO_CONTENT);
    // Published while the subscriber is not on `a`: never for it.
    bus.publish(&publisher, "a", "https://x.example/a/away")
        .await;
    recv.status.store(204, SeqCst);
    bus.publish(&publisher, "b", "https://x.example/b/0").await;
    bus.subscribe(&sub, both).await;
    bus.publish(&publisher, "a", "https://x.example/a/back")
        .await;
    let until = Instant::now() + WAIT;
    while !recv
        .events("s")
        .iter()
        .any(|e| e["url"] == "https://x.example/a/back")
    {
        assert!(Instant::now() < until, "{:?}", recv.events("s"));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let urls: Vec<String> = recv
        .events("s")
        .iter()
        .map(|e| e["url"].as_str().unwrap().to_string())
        .collect();
    // The batch in flight when the topic was left (a/0, and a/1 if it had come in
    // time) is still delivered; the rest of the backlog and what came while away
    // are not.
    let in_flight = urls
        .iter()
        .take_while(|u| u.contains("/a/") && !u.ends_with("back"))
        .count();
    assert!((1..=2).contains(&in_flight), "{urls:?}");
    assert_eq!(urls[0], "https://x.example/a/0");
    // No order between topics: b/0 and a/back may share a batch either way.
    let mut rest = urls[in_flight..].to_vec();
    rest.sort();
    assert_eq!(
        rest,
        ["https://x.example/a/back", "https://x.example/b/0"],
        "{urls:?}"
    );
    // On disk: `a` has the retention reader and this subscriber's new reader only.
    bus.stop().await;
    let store = weir::Store::open(bus.dir.path()).unwrap();
    let readers = store.queue("bus:topic:a").unwrap().reader_names();
    assert_eq!(readers.len(), 2, "{readers:?}");
    store.close().unwrap();
    recv.stop();
}

/// A retention reader deleted by other means (the memcache port's `delete q.r`) is
/// made again by the janitor, at the oldest event: what the topic keeps stays kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_retention_reader_is_made_again_at_the_oldest_event() {
    let mut cfg = config();
    // The janitor runs every 2 s (a quarter of the retention).
    cfg.retention_ms = Some(8_000);
    let mut bus = TestBus::start(cfg).await;
    let publisher = bus.token("pub").await;
    for i in 0..3 {
        bus.publish(&publisher, "t", &format!("https://x.example/{i}"))
            .await;
    }
    let backend = bus.backend.clone().unwrap();
    assert!(backend
        .delete_reader("bus:topic:t", "Retention")
        .await
        .unwrap());
    let store = backend.engine_store_for_tests().unwrap().clone();
    let until = Instant::now() + Duration::from_secs(10);
    let queue = store.existing_queue("bus:topic:t").unwrap().unwrap();
    while !queue.has_reader("Retention") {
        assert!(
            Instant::now() < until,
            "the retention reader was not made again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Made at the oldest event (the janitor keeps 8 s, and they are younger): all 3
    // are kept for it.
    let stats = queue.stats();
    let retention = stats.readers.iter().find(|r| r.name == "Retention");
    assert_eq!(retention.map(|r| r.items), Some(3), "{stats:?}");
    bus.stop().await;
}

/// `count` topics claimed by `publisher` (one event each, published before any
/// subscription, so no subscriber gets them). Topic names are letters and `_`.
async fn claim_topics(bus: &TestBus, publisher: &str, count: usize) -> Vec<String> {
    let letter = |n: usize| char::from(b'a' + (n % 26) as u8);
    let topics: Vec<String> = (0..count)
        .map(|i| format!("topic_{}{}", letter(i / 26), letter(i)))
        .collect();
    for t in &topics {
        assert_eq!(
            bus.publish(publisher, t, "https://x.example/claim").await,
            StatusCode::OK
        );
    }
    topics
}

/// A batch that fills while publishes have flagged more of its topics leaves those
/// topics to the next batch, not to the next sweep of every topic (20 s for 200
/// topics): with `max` 1, events published to 200 topics at once all arrive
/// promptly. Before, the flags of the topics not reached were cleared and the
/// topics, found empty earlier, were skipped until the sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_flagged_while_a_batch_fills_are_looked_at_next() {
    const TOPICS: usize = 200;
    let recv = Receiver::start().await;
    let mut bus = TestBus::start(config()).await;
    let publisher = bus.token("pub").await;
    let sub = bus.token("sub").await;
    let topics = claim_topics(&bus, &publisher, TOPICS).await;
    bus.subscribe(
        &sub,
        json!({"topics": topics, "callback": recv.url("s"), "max": 1, "timeout": 50}),
    )
    .await
    .unwrap();
    // Long enough for the new worker to look at every topic once and find it empty.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for t in &topics {
        let url = format!("https://x.example/{t}");
        assert_eq!(bus.publish(&publisher, t, &url).await, StatusCode::OK);
    }
    let events = recv.wait_events("s", TOPICS, WAIT).await;
    assert_eq!(
        events.len(),
        TOPICS,
        "every topic's event arrived within {WAIT:?}"
    );
    bus.stop().await;
    recv.stop();
}

/// A topic left and joined again at once keeps waking its subscriber: the wake-ups
/// and the worker's source share one flag whatever order the two changes reach the
/// worker in. With 100 topics the sweep of every topic comes every 10 s, so an event
/// that arrives sooner was woken for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_left_and_joined_again_still_wakes_its_subscriber() {
    const TOPICS: usize = 100;
    let recv = Receiver::start().await;
    let mut bus = TestBus::start(config()).await;
    let publisher = bus.token("pub").await;
    let sub = bus.token("sub").await;
    let topics = claim_topics(&bus, &publisher, TOPICS).await;
    let all = json!({"topics": topics, "callback": recv.url("s"), "max": 1, "timeout": 50});
    bus.subscribe(&sub, all.clone()).await;
    let first = &topics[0];
    for round in 0..3 {
        let fewer =
            json!({"topics": topics[1..], "callback": recv.url("s"), "max": 1, "timeout": 50});
        bus.subscribe(&sub, fewer).await;
        bus.subscribe(&sub, all.clone()).await;
        let url = format!("https://x.example/{first}/{round}");
        assert_eq!(bus.publish(&publisher, first, &url).await, StatusCode::OK);
        let events = recv
            .wait_events("s", round + 1, Duration::from_secs(5))
            .await;
        assert_eq!(
            events.len(),
            round + 1,
            "round {round}: the event arrived within 5 s"
        );
    }
    bus.stop().await;
    recv.stop();
}
