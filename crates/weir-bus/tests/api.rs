//! The bus's HTTP API against a running bus: every endpoint, and its refusals with
//! their exact status and a JSON error.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

mod common;

use axum::http::StatusCode;
use base64::Engine;
use std::sync::Arc;

use common::{config, start_on, Receiver, TestBus, ROOT};
use serde_json::{json, Value};

fn error_of(bytes: &[u8]) -> String {
    let v: Value = serde_json::from_slice(bytes).expect("a JSON error body");
    v["error"].as_str().expect("an error message").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_managed_by_the_root_key_only() {
    let mut bus = TestBus::start(config()).await;
    let (s, _, body) = bus.call("GET", "/api_tokens", "", None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(error_of(&body).contains("root key"));
    assert_eq!(
        bus.call("GET", "/api_tokens", "wrong", None).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        bus.call("GET", "/api_tokens", ROOT, None).await.0,
        StatusCode::NO_CONTENT
    );

    let token = bus.token("Billing Service").await;
    assert!(token.starts_with("billingservice--"), "{token}");
    // A client token is not the root key.
    assert_eq!(
        bus.call("GET", "/api_tokens", &token, None).await.0,
        StatusCode::UNAUTHORIZED
    );
    let (s, v) = bus
        .json(
            "POST",
            "/api_tokens",
            ROOT,
            json!({"name": "chosen", "token": "svc_chosen"}),
        )
        .await;
    assert_eq!(
        (s, v["token"].as_str()),
        (StatusCode::CREATED, Some("svc_chosen"))
    );
    let (s, list) = bus.get("/api_tokens", ROOT).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(list.as_array().map(Vec::len), Some(2));

    for (body, want) in [
        (&b"{"[..], "invalid JSON"),
        (b"[]", "JSON object"),
        (b"{}", "`name`"),
        (br#"{"name":"x","token":"Bad Token"}"#, "bad token"),
        (br#"{"name":""}"#, "bad name"),
    ] {
        let (s, _, bytes) = bus.call("POST", "/api_tokens", ROOT, Some(body)).await;
        assert_eq!(
            s,
            StatusCode::BAD_REQUEST,
            "{}",
            String::from_utf8_lossy(body)
        );
        assert!(error_of(&bytes).contains(want), "{}", error_of(&bytes));
    }

    // Deleting a token drops its subscription; the token stops working.
    bus.subscribe(
        &token,
        json!({"topics": ["orders"], "callback": "http://127.0.0.1:9/cb/x"}),
    )
    .await;
    assert_eq!(
        bus.call("DELETE", &format!("/api_tokens/{token}"), ROOT, None)
            .await
            .0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(bus.get("/subscriptions", "svc_chosen").await.1, json!([]));
    assert_eq!(
        bus.call("GET", "/topics", &token, None).await.0,
        StatusCode::UNAUTHORIZED
    );
    // A deleted token's topics are unclaimed: the next publisher claims them.
    let alice = bus.token("alice").await;
    assert_eq!(
        bus.publish(&alice, "owned", "https://a.example/1").await,
        StatusCode::OK
    );
    assert_eq!(
        bus.publish("svc_chosen", "owned", "https://a.example/2")
            .await,
        StatusCode::FORBIDDEN
    );
    let path = format!("/api_tokens/{alice}");
    assert_eq!(
        bus.call("DELETE", &path, ROOT, None).await.0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        bus.publish("svc_chosen", "owned", "https://a.example/3")
            .await,
        StatusCode::OK
    );
    let (_, topics) = bus.get("/topics", ROOT).await;
    let owned = topics
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "owned")
        .unwrap();
    assert_eq!(owned["publisher"], "chosen");
    // A wrong method is a JSON 405.
    let (s, _, body) = bus.call("PUT", "/topics", ROOT, None).await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    assert!(error_of(&body).contains("method"));
    bus.stop().await;
}

/// A bus on a store that holds at most `queues_max` queues, on `dir`.
async fn start_small(
    dir: std::path::PathBuf,
    queues_max: usize,
) -> (weir_bus::BusHandle, Arc<weir_backend::Backend>) {
    tokio::task::spawn_blocking(move || {
        let options = weir::StoreOptions {
            queues_max,
            ..weir::StoreOptions::default()
        };
        let store = weir::Store::open_with(&dir, options).unwrap();
        start_on(store, dir, config())
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_the_engine_refuses_is_undone() {
    // 3 queues: a topic and a dead-letter queue fit, two more topics do not.
    let dir = tempfile::tempdir().unwrap();
    let (handle, backend) = start_small(dir.path().to_path_buf(), 3).await;
    let base = format!("http://{}", handle.local_addr());
    let mut bus = TestBus {
        dir,
        handle: Some(handle),
        backend: Some(backend),
        base,
        http: reqwest::Client::new(),
    };
    let sub = bus.token("sub").await;
    bus.subscribe(
        &sub,
        json!({"topics": ["a"], "callback": "http://127.0.0.1:9/cb/x"}),
    )
    .await;
    let wanted = json!({"topics": ["a", "b", "c"], "callback": "http://127.0.0.1:9/cb/y"});
    let (s, v) = bus.json("POST", "/subscription", &sub, wanted).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert!(v["error"].as_str().unwrap().contains("queues"), "{v}");
    let (_, subs) = bus.get("/subscriptions", &sub).await;
    assert_eq!(subs[0]["topics"], json!(["a"]));
    assert_eq!(subs[0]["callback"], "http://127.0.0.1:9/cb/x");
    let (_, topics) = bus.get("/topics", &sub).await;
    assert_eq!(
        topics,
        json!([{"name": "a", "publisher": null, "events": 0}])
    );
    // And so it stays after a restart.
    bus.stop().await;
    let (handle, backend) = start_small(bus.dir.path().to_path_buf(), 3).await;
    bus.base = format!("http://{}", handle.local_addr());
    bus.handle = Some(handle);
    bus.backend = Some(backend);
    let (_, subs) = bus.get("/subscriptions", &sub).await;
    assert_eq!(subs[0]["topics"], json!(["a"]));
    bus.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_claims_a_topic_and_refuses_bad_events() {
    let mut cfg = config();
    cfg.publish_bytes_max = Some(1024);
    let mut bus = TestBus::start(cfg).await;
    let alice = bus.token("alice").await;
    let bob = bus.token("bob").await;
    assert_eq!(
        bus.publish(&alice, "orders", "https://shop.example/orders/1")
            .await,
        StatusCode::OK
    );
    let (s, _, body) = bus
        .call(
            "POST",
            "/topics/orders",
            &bob,
            Some(br#"{"type":"noop","url":"https://a.example/1"}"#),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(error_of(&body), "topic claimed");
    assert_eq!(
        bus.publish(&alice, "orders", "https://shop.example/orders/2")
            .await,
        StatusCode::OK
    );

    let cases: [(&str, &str, Vec<u8>, StatusCode, &str); 7] = [
        (
            "Orders",
            &alice,
            br#"{"type":"noop","url":"https://a.example/1"}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "bad topic",
        ),
        (
            "orders",
            "",
            br#"{"type":"noop","url":"https://a.example/1"}"#.to_vec(),
            StatusCode::UNAUTHORIZED,
            "credentials",
        ),
        (
            "orders",
            ROOT,
            br#"{"type":"noop","url":"https://a.example/1"}"#.to_vec(),
            StatusCode::UNAUTHORIZED,
            "client token",
        ),
        (
            "orders",
            &alice,
            br#"{"type":"noop"}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "`url`",
        ),
        (
            "orders",
            &alice,
            br#"{"type":"upsert","url":"https://a.example/1"}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "`type`",
        ),
        (
            "orders",
            &alice,
            b"not json".to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid JSON",
        ),
        (
            "orders",
            &alice,
            format!(
                r#"{{"type":"noop","url":"https://a.example/1","data":"{}"}}"#,
                "x".repeat(2000)
            )
            .into_bytes(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "1024 bytes",
        ),
    ];
    for (topic, user, body, status, want) in cases {
        let (s, _, bytes) = bus
            .call("POST", &format!("/topics/{topic}"), user, Some(&body))
            .await;
        assert_eq!(s, status, "{topic} {want}");
        assert!(error_of(&bytes).contains(want), "{}", error_of(&bytes));
    }
    let (s, topics) = bus.get("/topics", &bob).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        topics,
        json!([{"name": "orders", "publisher": "alice", "events": 2}])
    );

    // Only the publisher (or the root key) deletes a claimed topic.
    assert_eq!(
        bus.call("DELETE", "/topics/orders", &bob, None).await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        bus.call("DELETE", "/topics/orders", &alice, None).await.0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        bus.call("DELETE", "/topics/orders", ROOT, None).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(bus.get("/topics", &bob).await.1, json!([]));
    // A deleted topic can be claimed by someone else.
    assert_eq!(
        bus.publish(&bob, "orders", "https://shop.example/orders/3")
            .await,
        StatusCode::OK
    );
    bus.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_are_checked_listed_and_deleted() {
    let mut bus = TestBus::start(config()).await;
    let sub = bus.token("sub").await;
    let bad: [(Value, &str); 9] = [
        (
            json!({"topics": ["a"], "callback": "http://127.0.0.1:9/x", "extra": 1}),
            "unknown field `extra`",
        ),
        (
            json!({"topics": "a", "callback": "http://127.0.0.1:9/x"}),
            "array of topics",
        ),
        (
            json!({"topics": [1], "callback": "http://127.0.0.1:9/x"}),
            "array of topics",
        ),
        (
            json!({"topics": ["A"], "callback": "http://127.0.0.1:9/x"}),
            "bad topic",
        ),
        (json!({"topics": ["a"]}), "`callback`"),
        (
            json!({"topics": ["a"], "callback": "ftp://127.0.0.1/x"}),
            "callback",
        ),
        (
            json!({"topics": ["a"], "callback": "http://127.0.0.1:9/x", "timeout": 3_600_001}),
            "bad timeout",
        ),
        (
            json!({"topics": ["a"], "callback": "http://127.0.0.1:9/x", "max": 0}),
            "bad max",
        ),
        (
            json!({"topics": ["a"], "callback": "http://127.0.0.1:9/x", "format": "xml"}),
            "bad format",
        ),
    ];
    for (body, want) in bad {
        let (s, _, bytes) = bus
            .call(
                "POST",
                "/subscription",
                &sub,
                Some(body.to_string().as_bytes()),
            )
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
        assert!(
            error_of(&bytes).contains(want),
            "{body}: {}",
            error_of(&bytes)
        );
    }
    let secret = bus
        .subscribe(&sub, json!({"topics": ["a", "b"], "callback": "http://127.0.0.1:9/cb/s", "uuid": "u-1", "max": 5, "timeout": 50}))
        .await
        .expect("a first subscription gets a secret");
    assert!(secret.starts_with("whsec_"));
    // Posting again replaces it (same secret: no new header).
    let again = bus
        .subscribe(
            &sub,
            json!({"topics": ["b"], "callback": "http://127.0.0.1:9/cb/s", "uuid": "u-1"}),
        )
        .await;
    assert_eq!(again, None);
    let (s, list) = bus.get("/subscribers", ROOT).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        list,
        json!([{
            "subscriber": "sub", "uuid": "u-1", "callback": "http://127.0.0.1:9/cb/s",
            "max_events": 100, "timeout": 500, "topics": ["b"], "format": "routemaster",
            "events": {"sent": 0, "queued": 0, "oldest": null}
        }])
    );
    // Subscribing created the topics, unclaimed.
    let (_, topics) = bus.get("/topics", &sub).await;
    assert_eq!(topics[0]["publisher"], Value::Null);
    assert_eq!(
        bus.call("DELETE", "/subscriber/topics/a", &sub, None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        bus.call("DELETE", "/subscriber/topics/nope", &sub, None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        bus.call("DELETE", "/subscriber/topics/b", &sub, None)
            .await
            .0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        bus.call("DELETE", "/subscriber", &sub, None).await.0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        bus.call("DELETE", "/subscriber", &sub, None).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(bus.get("/subscriptions", &sub).await.1, json!([]));

    assert_eq!(
        bus.call("GET", "/pulse", "", None).await.0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(bus.get("/health", "").await, (StatusCode::OK, json!({})));
    let (s, _, bytes) = bus.call("GET", "/nowhere", "", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(error_of(&bytes).contains("no such endpoint"));
    bus.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ssrf_guard_and_the_limits_refuse_with_a_reason() {
    let mut cfg = config();
    cfg.allow_http = Some(false);
    cfg.allow_private_networks = Some(false);
    cfg.topics_max = Some(2);
    cfg.subscribers_max = Some(1);
    cfg.tokens_max = Some(2);
    cfg.batch_events_max = Some(10);
    let mut bus = TestBus::start(cfg).await;
    let a = bus.token("a").await;
    let b = bus.token("b").await;
    let (s, v) = bus
        .json("POST", "/api_tokens", ROOT, json!({"name": "c"}))
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert!(v["error"].as_str().unwrap().contains("tokens_max"));
    for (callback, want) in [
        ("http://example.com/cb", "https"),
        ("https://127.0.0.1/cb", "not allowed"),
        ("https://10.1.2.3/cb", "not allowed"),
        ("https://169.254.169.254/latest", "not allowed"),
        ("https://[::1]/cb", "not allowed"),
        ("https://localhost/cb", "not allowed"),
    ] {
        let (s, v) = bus
            .json(
                "POST",
                "/subscription",
                &a,
                json!({"topics": ["t"], "callback": callback}),
            )
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{callback}");
        assert!(
            v["error"].as_str().unwrap().contains(want),
            "{callback}: {v}"
        );
    }
    let (s, v) = bus
        .json(
            "POST",
            "/subscription",
            &a,
            json!({"topics": ["t"], "callback": "https://93.184.215.14/cb", "max": 11}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(
        v["error"].as_str().unwrap().contains("batch_events_max"),
        "{v}"
    );
    bus.subscribe(
        &a,
        json!({"topics": ["t"], "callback": "https://93.184.215.14/cb"}),
    )
    .await;
    let (s, v) = bus
        .json(
            "POST",
            "/subscription",
            &b,
            json!({"topics": ["t"], "callback": "https://93.184.215.14/cb"}),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert!(
        v["error"].as_str().unwrap().contains("subscribers_max"),
        "{v}"
    );
    assert_eq!(
        bus.publish(&b, "u", "https://x.example/1").await,
        StatusCode::OK
    );
    let (s, v) = bus
        .json(
            "POST",
            "/topics/v",
            &b,
            json!({"type": "noop", "url": "https://x.example/1"}),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert!(v["error"].as_str().unwrap().contains("topics_max"), "{v}");
    bus.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_survives_a_restart() {
    let recv = Receiver::start().await;
    let mut bus = TestBus::start(config()).await;
    let publisher = bus.token("pub").await;
    let sub = bus.token("sub").await;
    bus.subscribe(
        &sub,
        json!({"topics": ["t"], "callback": recv.url("s"), "max": 1}),
    )
    .await;
    recv.status.store(503, std::sync::atomic::Ordering::SeqCst);
    for i in 0..5 {
        assert_eq!(
            bus.publish(&publisher, "t", &format!("https://x.example/{i}"))
                .await,
            StatusCode::OK
        );
    }
    bus.restart_with(config()).await;
    recv.status.store(204, std::sync::atomic::Ordering::SeqCst);
    let events = recv
        .wait_events("s", 5, std::time::Duration::from_secs(10))
        .await;
    let urls: Vec<&str> = events.iter().map(|e| e["url"].as_str().unwrap()).collect();
    assert_eq!(
        urls,
        (0..5)
            .map(|i| format!("https://x.example/{i}"))
            .collect::<Vec<_>>()
    );
    let (_, topics) = bus.get("/topics", &sub).await;
    assert_eq!(topics[0]["publisher"], "pub");
    assert_eq!(
        bus.call(
            "POST",
            "/topics/t",
            &sub,
            Some(br#"{"type":"noop","url":"https://a.example/1"}"#)
        )
        .await
        .0,
        StatusCode::FORBIDDEN
    );
    // Tokens are credentials: they name nothing in the engine nor in the metrics.
    assert!(!bus.metrics().contains(&sub));
    bus.stop().await;
    let store = weir::Store::open(bus.dir.path()).unwrap();
    for name in store.queue_names() {
        assert!(!name.contains(&sub) && !name.contains(&publisher), "{name}");
        let q = store.queue(&name).unwrap();
        for reader in q.reader_names() {
            assert!(!reader.contains(&sub), "{name}: {reader}");
        }
    }
    store.close().unwrap();
    recv.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_gets_408_and_cannot_hold_up_a_stop() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut cfg = config();
    cfg.header_timeout_ms = Some(300);
    let mut bus = TestBus::start(cfg).await;
    let token = bus.token("slow").await;
    let addr = bus.base.trim_start_matches("http://").to_string();
    let head = |len: usize| {
        format!(
            "POST /topics/t HTTP/1.1\r\nhost: x\r\nauthorization: Basic {}\r\ncontent-length: {len}\r\n\r\n{{\"type\"",
            base64::engine::general_purpose::STANDARD.encode(format!("{token}:x"))
        )
    };
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    slow.write_all(head(100).as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), slow.read(&mut answer))
        .await
        .expect("an answer within the body timeout")
        .unwrap();
    let text = String::from_utf8_lossy(&answer[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    // A client in the middle of a body when the bus stops does not hold the stop up.
    let mut stuck = tokio::net::TcpStream::connect(&addr).await.unwrap();
    stuck.write_all(head(100).as_bytes()).await.unwrap();
    let started = std::time::Instant::now();
    bus.stop().await;
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// A data directory of an earlier weir, its metadata whole in `DATA_DIR/bus/meta.json`
/// (`tests/fixtures/meta.json`, as that weir wrote it), is imported into the bus's map
/// at the first start; the file is renamed `meta.json.imported`, and what it held and
/// later changes survive the next restarts, read from the map.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_meta_json_is_imported_into_the_map_once() {
    let dir = tempfile::tempdir().unwrap();
    let bus_dir = dir.path().join("bus");
    std::fs::create_dir_all(&bus_dir).unwrap();
    std::fs::write(
        bus_dir.join("meta.json"),
        include_str!("fixtures/meta.json"),
    )
    .unwrap();
    let mut bus = TestBus {
        dir,
        handle: None,
        backend: None,
        base: String::new(),
        http: reqwest::Client::new(),
    };
    bus.restart_with(config()).await;
    // The file is kept as meta.json.imported; meta.json is now a stub of a version
    // an earlier weir refuses (a rollback stops instead of deleting the bus's queues).
    let stub = std::fs::read_to_string(bus_dir.join("meta.json")).unwrap();
    assert!(stub.starts_with("{\"version\":2,"), "{stub}");
    assert!(bus_dir.join("meta.json.imported").exists());
    assert!(bus.dir.path().join("maps").join("bus.map").exists());
    let check = |topics: Value, subs: Value| {
        let names: Vec<(&str, &Value)> = topics
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t["name"].as_str().unwrap(), &t["publisher"]))
            .collect();
        assert_eq!(
            names,
            vec![
                ("orders", &json!("orders-service")),
                ("refunds", &Value::Null)
            ]
        );
        assert!(
            subs.to_string()
                .contains("https://billing.example.com/events"),
            "{subs}"
        );
    };
    let (status, topics) = bus.get("/topics", "sub-token-1").await;
    assert_eq!(status, StatusCode::OK, "{topics}");
    check(topics, bus.get("/subscriptions", ROOT).await.1);
    let later = bus.token("later").await;
    // Read from the map now: the file is not read again.
    std::fs::write(bus_dir.join("meta.json.imported"), b"{not json").unwrap();
    bus.restart_with(config()).await;
    check(
        bus.get("/topics", &later).await.1,
        bus.get("/subscriptions", ROOT).await.1,
    );
    let (_, tokens) = bus.get("/api_tokens", ROOT).await;
    assert!(tokens.to_string().contains("later"), "{tokens}");
    assert!(tokens.to_string().contains("orders-service"), "{tokens}");
    bus.stop().await;
}
