//! Record now, replay later: routes with `record = true` keep their captures, which
//! leave as JSON lines, come back into another store, and replay to a real axum
//! server at the pace asked.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use parking_lot::Mutex;
use weir_proxy::capture_file::{self, LINE_BYTES_MAX};
use weir_proxy::replay::{self, Pace, ReplayOptions};
use weir_proxy::{Captured, ProxyConfig, ProxyHandle, RECORD_READER};

/// A request a test server got: method, URI, headers, body.
type Got = (String, String, HeaderMap, Bytes);

/// The store as the backend the proxy keeps its captures in.
fn embedded(store: weir::Store) -> std::sync::Arc<weir_backend::Backend> {
    std::sync::Arc::new(weir_backend::Backend::Embedded(
        weir_backend::Embedded::new(store),
    ))
}

/// A server that records what it gets and answers 200 `ok` (or never, when `hang`).
#[derive(Clone, Default)]
struct Target {
    got: Arc<Mutex<Vec<Got>>>,
    hang: bool,
}

async fn record_request(State(t): State<Target>, req: Request) -> &'static str {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    t.got.lock().push((
        parts.method.to_string(),
        parts.uri.to_string(),
        parts.headers,
        body,
    ));
    if t.hang {
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
    "ok"
}

/// Starts a target; its task ends with the test's runtime.
async fn start_target(hang: bool) -> (Target, SocketAddr) {
    let t = Target {
        hang,
        ..Target::default()
    };
    let app = axum::Router::new()
        .fallback(record_request)
        .with_state(t.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (t, addr)
}

/// A proxy on its own store, which the test keeps a handle on.
struct TestProxy {
    store: weir::Store,
    handle: Option<ProxyHandle>,
    base: String,
}

/// Starts a proxy from a `[proxy]` body on `dir`; capture queues get `capture`.
async fn start(dir: &std::path::Path, toml_text: &str, capture: weir::QueueConfig) -> TestProxy {
    let settings = toml::from_str::<ProxyConfig>(toml_text)
        .unwrap()
        .resolve()
        .unwrap();
    let path = dir.to_path_buf();
    let (store, handle) = tokio::task::spawn_blocking(move || {
        let options = weir::StoreOptions {
            config_for: Some(Arc::new(move |name: &str| {
                if name.starts_with("proxy:capture:") {
                    capture.clone()
                } else {
                    weir::QueueConfig::default()
                }
            })),
            ..weir::StoreOptions::default()
        };
        let store = weir::Store::open_with(&path, options).unwrap();
        let handle = weir_proxy::start(embedded(store.clone()), settings).unwrap();
        (store, handle)
    })
    .await
    .unwrap();
    let base = format!("http://{}", handle.addrs()[0].1);
    TestProxy {
        store,
        handle: Some(handle),
        base,
    }
}

impl TestProxy {
    /// Stops the proxy and closes the store.
    async fn stop(mut self) {
        let (handle, store) = (self.handle.take(), self.store.clone());
        tokio::task::spawn_blocking(move || {
            if let Some(h) = handle {
                h.stop();
            }
            store.close().unwrap();
        })
        .await
        .unwrap();
    }

    fn queue(&self) -> weir::Queue {
        self.store.queue("proxy:capture:api").unwrap()
    }

    /// Every kept capture, oldest first (nothing consumed).
    async fn kept(&self) -> Vec<(u64, Captured)> {
        walk(&embedded(self.store.clone()), "proxy:capture:api").await
    }

    /// Waits until `n` captures were appended since the store opened.
    async fn captured(&self, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.queue().stats().total_items < n {
            assert!(Instant::now() < deadline, "captures not appended in time");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// One request to the proxy (one connection each), the answer's status.
async fn send(
    base: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> u16 {
    use http_body_util::{BodyExt, Full};
    let uri: hyper::Uri = format!("{base}{path}").parse().unwrap();
    let authority = uri.authority().unwrap().as_str().to_string();
    let stream = tokio::net::TcpStream::connect(&authority).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", authority);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = sender
        .send_request(req.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    status
}

fn route(primary: SocketAddr, extra: &str) -> String {
    format!(
        "[[listen]]\nname = \"main\"\naddr = \"127.0.0.1:0\"\n[[routes]]\nname = \"api\"\ntargets = [\"http://{primary}\"]\n{extra}"
    )
}

/// The request `i` of a recording: methods, paths, queries, headers and bodies that
/// differ, one body not UTF-8.
fn request(i: usize) -> (&'static str, String, Vec<(&'static str, String)>, Vec<u8>) {
    let method = ["GET", "POST", "PUT", "DELETE"][i % 4];
    let path = format!("/items/{i}?q={i}&x=a%20b");
    let headers = vec![
        ("x-request", format!("r{i}")),
        ("authorization", format!("Bearer token-{i}")),
    ];
    let body = match method {
        "GET" | "DELETE" => Vec::new(),
        _ => {
            let mut b = format!("body {i} ").into_bytes();
            b.extend_from_slice(&[0, 255, b'\n', i as u8]);
            b
        }
    };
    (method, path, headers, body)
}

async fn record(p: &TestProxy, from: usize, to: usize) {
    for i in from..to {
        let (method, path, headers, body) = request(i);
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(send(&p.base, method, &path, &headers, body).await, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_route_keeps_its_captures_within_the_queues_limits() {
    let (primary, addr) = start_target(false).await;
    let dir = tempfile::tempdir().unwrap();
    let limits = weir::QueueConfig {
        max_items: 5,
        discard_old_when_full: true,
        ..Default::default()
    };
    let p = start(dir.path(), &route(addr, "record = true\n"), limits).await;
    record(&p, 0, 3).await;
    p.captured(3).await;
    assert_eq!(p.queue().reader_names(), vec![RECORD_READER.to_string()]);
    let kept = p.kept().await;
    assert_eq!(kept.len(), 3);
    for (i, (_, c)) in kept.iter().enumerate() {
        let (method, path, headers, body) = request(i);
        assert_eq!((c.method.as_str(), c.uri.as_str()), (method, path.as_str()));
        assert_eq!(c.body, body);
        for (k, v) in &headers {
            assert!(c.headers.contains(&(k.to_string(), v.clone())), "{k}");
        }
    }
    // Nothing consumes them: walking again finds the same; past max_items the oldest go.
    assert_eq!(p.kept().await.len(), 3);
    record(&p, 3, 8).await;
    p.captured(8).await;
    let uris: Vec<String> = p.kept().await.into_iter().map(|(_, c)| c.uri).collect();
    let expected: Vec<String> = (3..8).map(|i| request(i).1).collect();
    assert_eq!(uris, expected);
    assert_eq!(primary.got.lock().len(), 8);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_queues_get_no_lease_timeout_whatever_the_store_gives() {
    let (_primary, addr) = start_target(false).await;
    let (_shadow, shadow_addr) = start_target(false).await;
    let dir = tempfile::tempdir().unwrap();
    let timed = weir::QueueConfig {
        open_timeout: Some(Duration::from_millis(100)),
        ..Default::default()
    };
    let with_shadow = format!(
        "record = true\n[[routes.shadows]]\nname = \"s\"\nurl = \"http://{shadow_addr}\"\n"
    );
    let p = start(dir.path(), &route(addr, &with_shadow), timed).await;
    assert_eq!(p.queue().config().open_timeout, None);
    // A queue the proxy does not open keeps what the store gives it.
    let other = p.store.queue("proxy:capture:other").unwrap();
    assert_eq!(
        other.config().open_timeout,
        Some(Duration::from_millis(100))
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_record_deletes_its_reader_and_a_new_shadow_starts_at_the_end() {
    let (_primary, addr) = start_target(false).await;
    let (shadow, shadow_addr) = start_target(false).await;
    let dir = tempfile::tempdir().unwrap();
    let config = weir::QueueConfig::default();
    let p = start(dir.path(), &route(addr, "record = true\n"), config.clone()).await;
    record(&p, 0, 4).await;
    p.captured(4).await;
    p.stop().await;
    // A shadow added to the recording route gets what comes next, not the recording.
    let with_shadow = format!(
        "record = true\n[[routes.shadows]]\nname = \"new\"\nurl = \"http://{shadow_addr}\"\n"
    );
    let p = start(dir.path(), &route(addr, &with_shadow), config.clone()).await;
    record(&p, 4, 6).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while shadow.got.lock().len() < 2 {
        assert!(Instant::now() < deadline, "replays did not arrive");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut replayed: Vec<String> = shadow.got.lock().iter().map(|g| g.1.clone()).collect();
    replayed.sort();
    assert_eq!(replayed, vec![request(4).1, request(5).1]);
    p.stop().await;
    // Without record nor shadows the route does not capture, and its queue loses the
    // reader; a shadow named like the recording's reader is refused.
    let p = start(dir.path(), &route(addr, ""), config.clone()).await;
    assert!(!p.queue().has_reader(RECORD_READER));
    // Only the recording's: a shadow removed with the last of them keeps its backlog.
    assert!(p.queue().has_reader("new"));
    p.stop().await;
    let clash = format!(
        "record = true\n[[routes.shadows]]\nname = \"record\"\nurl = \"http://{shadow_addr}\"\n"
    );
    let settings = toml::from_str::<ProxyConfig>(&route(addr, &clash))
        .unwrap()
        .resolve()
        .unwrap();
    let store = weir::Store::open(dir.path()).unwrap();
    let refused = tokio::task::spawn_blocking({
        let store = store.clone();
        move || weir_proxy::start(embedded(store), settings).map(|_| ())
    })
    .await
    .unwrap();
    assert!(refused.unwrap_err().to_string().contains("cannot be named"));
    store.close().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_route_with_shadows_keeps_its_captures_across_restarts() {
    let (_primary, addr) = start_target(false).await;
    let (_shadow, shadow_addr) = start_target(false).await;
    let dir = tempfile::tempdir().unwrap();
    let config = weir::QueueConfig::default();
    let extra = format!(
        "record = true\n[[routes.shadows]]\nname = \"staging\"\nurl = \"http://{shadow_addr}\"\n"
    );
    for round in 0..2 {
        let p = start(dir.path(), &route(addr, &extra), config.clone()).await;
        record(&p, round * 3, round * 3 + 3).await;
        p.captured(3).await;
        let mut names = p.queue().reader_names();
        names.sort();
        assert_eq!(
            names,
            vec![RECORD_READER.to_string(), "staging".to_string()]
        );
        assert_eq!(p.kept().await.len(), round * 3 + 3);
        p.stop().await;
    }
}

/// Every kept capture of `queue`, walked through the backend as an export walks it.
async fn walk(backend: &weir_backend::Backend, queue: &str) -> Vec<(u64, Captured)> {
    let scan = backend
        .scan(queue, capture_file::scan_from(None))
        .await
        .unwrap();
    let mut all = Vec::new();
    capture_file::walk_captures(scan, queue, None, None, |seq, c| {
        all.push((seq, c));
        async { true }
    })
    .await
    .unwrap();
    all
}

/// Records `n` requests, exports them as JSON lines, imports the file into a second
/// store and returns the captures as that store walks them.
async fn recorded_exported_imported(n: usize) -> Vec<Captured> {
    let (_primary, addr) = start_target(false).await;
    let dir = tempfile::tempdir().unwrap();
    let p = start(
        dir.path(),
        &route(addr, "record = true\n"),
        Default::default(),
    )
    .await;
    record(&p, 0, n).await;
    p.captured(n as u64).await;
    let mut file = Vec::new();
    let queue = "proxy:capture:api";
    let scan = embedded(p.store.clone())
        .scan(queue, capture_file::scan_from(None))
        .await
        .unwrap();
    let done = capture_file::walk_scan(scan, queue, None, None, |line| {
        file.extend_from_slice(&line);
        async { true }
    })
    .await
    .unwrap();
    assert_eq!(done.captures, n as u64);
    p.stop().await;
    let other = tempfile::tempdir().unwrap();
    let backend =
        weir_backend::Backend::Embedded(weir_backend::Embedded::open(other.path()).unwrap());
    let items = capture_file::items_of(&file, LINE_BYTES_MAX).unwrap();
    weir_proxy::tools::captures::append_captures(&backend, "proxy:capture:copy", &items)
        .await
        .unwrap();
    let back = walk(&backend, "proxy:capture:copy").await;
    backend.close().await.unwrap();
    back.into_iter().map(|(_, c)| c).collect()
}

/// Replays `captures` to `to` and returns the summary.
async fn replay_to(
    captures: Vec<Captured>,
    to: &str,
    pace: Pace,
    concurrency: usize,
) -> replay::ReplaySummary {
    let options = ReplayOptions::new(to, pace, concurrency, Duration::from_secs(2)).unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let feed = tokio::spawn(async move {
        for c in captures {
            tx.send(c).await.unwrap();
        }
    });
    let summary = replay::replay(rx, &options).await;
    feed.await.unwrap();
    summary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exported_recording_replays_intact_to_another_target() {
    let captures = recorded_exported_imported(12).await;
    assert_eq!(captures.len(), 12);
    let (target, addr) = start_target(false).await;
    let summary = replay_to(
        captures.clone(),
        &format!("http://{addr}/base"),
        Pace::Unpaced,
        1,
    )
    .await;
    assert_eq!(
        (summary.sent, summary.by_class, summary.failed),
        (12, [0, 12, 0, 0, 0], 0)
    );
    let got = target.got.lock();
    // Concurrency 1 keeps the order; every request is whole.
    for (i, (method, uri, headers, body)) in got.iter().enumerate() {
        let (m, path, hs, b) = request(i);
        assert_eq!(
            (method.as_str(), uri.as_str()),
            (m, format!("/base{path}").as_str())
        );
        assert_eq!(body[..], b[..], "body {i}");
        for (k, v) in &hs {
            assert_eq!(headers[*k], v.as_str(), "{k}");
        }
        assert_eq!(headers["host"], addr.to_string());
        assert_eq!(headers[weir_proxy::REPLAY_HEADER], replay::REPLAY_TAG);
    }
}

fn synthetic(at_ms: &[u64]) -> Vec<Captured> {
    at_ms
        .iter()
        .enumerate()
        .map(|(i, &at_ms)| Captured {
            method: "GET".into(),
            uri: format!("/t/{i}"),
            headers: Vec::new(),
            host: None,
            at_ms,
            body: Bytes::new(),
            response: None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pace_is_kept() {
    let (target, addr) = start_target(false).await;
    let to = format!("http://{addr}");
    // Speed 2 halves the captured gaps: 0, 600 and 1200 ms become 0, 300 and 600.
    let started = Instant::now();
    let s = replay_to(
        synthetic(&[10_000, 10_600, 11_200]),
        &to,
        Pace::Speed(2.0),
        4,
    )
    .await;
    let elapsed = started.elapsed();
    assert_eq!((s.sent, s.failed), (3, 0));
    assert!(elapsed >= Duration::from_millis(590), "{elapsed:?}");
    assert!(
        elapsed < Duration::from_millis(1_150),
        "{elapsed:?}: slower than the recording"
    );
    // Rate 10: five requests take at least 400 ms, whatever their times say.
    let started = Instant::now();
    let s = replay_to(synthetic(&[0, 0, 0, 0, 0]), &to, Pace::Rate(10.0), 4).await;
    assert_eq!((s.sent, s.failed), (5, 0));
    assert!(
        started.elapsed() >= Duration::from_millis(390),
        "{:?}",
        started.elapsed()
    );
    // Unpaced, an hour of recording goes at once.
    let started = Instant::now();
    let s = replay_to(synthetic(&[0, 3_600_000]), &to, Pace::Unpaced, 4).await;
    assert_eq!((s.sent, s.failed), (2, 0));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(target.got.lock().len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_get_no_answer_are_counted_failed() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let s = replay_to(
        synthetic(&[0, 1, 2]),
        &format!("http://{dead}"),
        Pace::Unpaced,
        2,
    )
    .await;
    assert_eq!((s.sent, s.by_class, s.failed), (3, [0; 5], 3));
    assert_eq!(s.failures.len(), 3);
    let (_hanging, addr) = start_target(true).await;
    let options = ReplayOptions::new(
        &format!("http://{addr}"),
        Pace::Unpaced,
        2,
        Duration::from_millis(200),
    )
    .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    for c in synthetic(&[0, 1]) {
        tx.send(c).await.unwrap();
    }
    drop(tx);
    let s = replay::replay(rx, &options).await;
    assert_eq!((s.sent, s.failed), (2, 2));
    assert!(
        s.failures[0].contains("no answer within 200 ms"),
        "{:?}",
        s.failures
    );
    // A capture that cannot make a request (a bad method slipped into a queue) fails
    // alone.
    let mut bad = synthetic(&[0, 1]);
    bad[0].method = "B A D".into();
    let (_ok, addr) = start_target(false).await;
    let s = replay_to(bad, &format!("http://{addr}"), Pace::Unpaced, 1).await;
    assert_eq!((s.sent, s.by_class[1], s.failed), (2, 1, 1));
}
