//! The proxy with real servers: axum primaries and shadows started by the test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use parking_lot::Mutex;
use serde_json::{json, Value};
use weir_proxy::{ProxyConfig, ProxyHandle};

/// A request a test server got: method, URI, headers, body.
type Got = (String, String, HeaderMap, Bytes);

/// A server that records what it gets and answers with a JSON echo.
#[derive(Clone, Default)]
struct Echo {
    name: &'static str,
    got: Arc<Mutex<Vec<Got>>>,
    /// Answer this status (0: 200).
    status: Arc<AtomicUsize>,
    /// Sleep this many ms before answering.
    delay_ms: Arc<AtomicUsize>,
}

async fn echo(State(e): State<Echo>, req: Request) -> (StatusCode, String) {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let uri = parts.uri.to_string();
    e.got.lock().push((
        parts.method.to_string(),
        uri.clone(),
        parts.headers.clone(),
        body.clone(),
    ));
    let delay = e.delay_ms.load(SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay as u64)).await;
    }
    let headers: serde_json::Map<String, Value> = parts
        .headers
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap_or(""))))
        .collect();
    let status = match e.status.load(SeqCst) {
        0 => StatusCode::OK,
        s => StatusCode::from_u16(s as u16).unwrap(),
    };
    let text = json!({"server": e.name, "method": parts.method.as_str(), "uri": uri, "headers": headers, "body": String::from_utf8_lossy(&body)});
    (status, text.to_string())
}

async fn start_echo(
    name: &'static str,
    addr: &str,
) -> (Echo, SocketAddr, tokio::task::JoinHandle<()>) {
    let e = Echo {
        name,
        ..Echo::default()
    };
    let app = axum::Router::new().fallback(echo).with_state(e.clone());
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (e, addr, task)
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

struct TestProxy {
    dir: tempfile::TempDir,
    handle: Option<ProxyHandle>,
    /// Where its captures are: `/metrics` reads the backlogs from its figures.
    /// Dropped by `stop`, with the proxy, so that the data directory can be opened again.
    backend: Option<std::sync::Arc<weir_backend::Backend>>,
    base: String,
    http: reqwest_lite::Client,
}

/// The store as the backend the proxy keeps its captures in.
fn embedded(store: weir::Store) -> std::sync::Arc<weir_backend::Backend> {
    std::sync::Arc::new(weir_backend::Backend::Embedded(
        weir_backend::Embedded::new(store),
    ))
}

/// Starts a proxy from a TOML `[proxy]` body (without its header) on `dir`.
async fn start(dir: tempfile::TempDir, toml_text: &str) -> TestProxy {
    let cfg: ProxyConfig = toml::from_str(toml_text).unwrap();
    let settings = cfg.resolve().unwrap();
    let path = dir.path().to_path_buf();
    let (handle, backend) = tokio::task::spawn_blocking(move || {
        let backend = embedded(weir::Store::open(&path).unwrap());
        let handle = weir_proxy::start(backend.clone(), settings).unwrap();
        (handle, backend)
    })
    .await
    .unwrap();
    let base = format!("http://{}", handle.addrs()[0].1);
    TestProxy {
        dir,
        handle: Some(handle),
        backend: Some(backend),
        base,
        http: reqwest_lite::Client::new(),
    }
}

impl TestProxy {
    async fn stop(&mut self) {
        if let Some(h) = self.handle.take() {
            tokio::task::spawn_blocking(move || h.stop()).await.unwrap();
        }
        self.backend = None;
    }

    async fn metrics(&self) -> String {
        let mut out = String::new();
        let stats = self.backend.as_ref().unwrap().stats(None).await.unwrap();
        self.handle
            .as_ref()
            .unwrap()
            .render_metrics(&stats, &mut out);
        out
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> reqwest_lite::Answer {
        self.http
            .send(&format!("{}{path}", self.base), method, headers, body)
            .await
    }
}

/// A tiny HTTP/1.1 client on hyper for the tests (one connection per request).
mod reqwest_lite {
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;

    pub struct Client;
    pub struct Answer {
        pub status: u16,
        pub headers: hyper::HeaderMap,
        pub body: Bytes,
    }

    impl Client {
        pub fn new() -> Client {
            Client
        }

        pub async fn send(
            &self,
            url: &str,
            method: &str,
            headers: &[(&str, &str)],
            body: Vec<u8>,
        ) -> Answer {
            let uri: hyper::Uri = url.parse().unwrap();
            let stream = tokio::net::TcpStream::connect(uri.authority().unwrap().as_str())
                .await
                .unwrap();
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .unwrap();
            tokio::spawn(conn);
            let mut req = hyper::Request::builder()
                .method(method)
                .uri(uri.path_and_query().unwrap().as_str())
                .header("host", uri.authority().unwrap().as_str());
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            let resp = sender
                .send_request(req.body(Full::new(Bytes::from(body))).unwrap())
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let headers = resp.headers().clone();
            let body = resp
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            Answer {
                status,
                headers,
                body,
            }
        }
    }
}

fn listen_toml() -> String {
    "[[listen]]\nname = \"main\"\naddr = \"127.0.0.1:0\"\n".to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_with_forwarding_headers_and_rewrites() {
    let (primary, addr, _t) = start_echo("primary", "127.0.0.1:0").await;
    let cfg = format!(
        "{}[[routes]]\nname = \"api\"\npath = \"/api/*\"\ntargets = [\"http://{addr}/base\"]\nremove_headers = [\"cookie\"]\nremove_query = [\"secret\"]\n[routes.set_headers]\nx-env = \"test\"\n[routes.set_query]\nsource = \"proxy\"\n",
        listen_toml()
    );
    let mut p = start(tempfile::tempdir().unwrap(), &cfg).await;
    let a = p
        .send(
            "POST",
            "/api/items?x=1&secret=2&source=client",
            &[
                ("cookie", "secret"),
                ("connection", "x-hop"),
                ("x-hop", "1"),
                ("x-forwarded-for", "10.0.0.9"),
            ],
            b"payload".to_vec(),
        )
        .await;
    assert_eq!(a.status, 200);
    let v: Value = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(v["uri"], "/base/api/items?x=1&source=proxy");
    assert_eq!(v["body"], "payload");
    let h = &v["headers"];
    assert_eq!(h["host"], addr.to_string());
    assert_eq!(h["x-forwarded-for"], "10.0.0.9, 127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert!(h["x-forwarded-host"]
        .as_str()
        .unwrap()
        .starts_with("127.0.0.1:"));
    assert!(h["forwarded"]
        .as_str()
        .unwrap()
        .starts_with("for=127.0.0.1;proto=http;host="));
    assert_eq!(h["x-env"], "test");
    assert!(h.get("cookie").is_none() && h.get("x-hop").is_none());
    assert_eq!(primary.got.lock().len(), 1);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_say_why() {
    let (slow, slow_addr, _t) = start_echo("slow", "127.0.0.1:0").await;
    slow.delay_ms.store(2_000, SeqCst);
    let dead = free_addr();
    let cfg = format!(
        "{}[[routes]]\nname = \"slow\"\npath = \"/slow\"\ntargets = [\"http://{slow_addr}\"]\nrequest_timeout_ms = 200\n\
         [[routes]]\nname = \"dead\"\npath = \"/dead/*\"\ntargets = [\"http://{dead}\"]\nbody_bytes_max = 10\n",
        listen_toml()
    );
    let mut p = start(tempfile::tempdir().unwrap(), &cfg).await;
    let a = p.send("GET", "/nowhere", &[], vec![]).await;
    assert_eq!(a.status, 404);
    assert!(a.headers["x-weir-proxy-error"]
        .to_str()
        .unwrap()
        .contains("no route matches GET"));
    let a = p.send("GET", "/slow", &[], vec![]).await;
    assert_eq!(a.status, 504);
    assert!(a.headers["x-weir-proxy-error"]
        .to_str()
        .unwrap()
        .contains("did not answer within 200 ms"));
    let a = p.send("GET", "/dead/x", &[], vec![]).await;
    assert_eq!(a.status, 502);
    assert!(
        a.headers["x-weir-proxy-error"]
            .to_str()
            .unwrap()
            .contains("failed"),
        "{:?}",
        a.headers
    );
    let a = p.send("POST", "/dead/x", &[], vec![b'x'; 11]).await;
    assert_eq!(a.status, 413);
    let m = p.metrics().await;
    assert!(
        m.contains("weir_proxy_responses_total{route=\"slow\",class=\"5xx\"} 1"),
        "{m}"
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_take_turns_and_a_dead_one_is_skipped() {
    let (a_srv, a_addr, _ta) = start_echo("a", "127.0.0.1:0").await;
    let (b_srv, b_addr, _tb) = start_echo("b", "127.0.0.1:0").await;
    let dead = free_addr();
    let cfg = format!("{}[[routes]]\nname = \"lb\"\ntargets = [\"http://{a_addr}\", \"http://{dead}\", \"http://{b_addr}\"]\nretries = 2\n", listen_toml());
    let mut p = start(tempfile::tempdir().unwrap(), &cfg).await;
    for _ in 0..12 {
        assert_eq!(p.send("GET", "/x", &[], vec![]).await.status, 200);
    }
    let (na, nb) = (a_srv.got.lock().len(), b_srv.got.lock().len());
    assert_eq!(na + nb, 12);
    assert!(na >= 4 && nb >= 4, "{na} {nb}");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_replayed_to_shadows_that_never_slow_the_client() {
    let (_primary, p_addr, _t1) = start_echo("primary", "127.0.0.1:0").await;
    let (fast, fast_addr, _t2) = start_echo("fast", "127.0.0.1:0").await;
    let (stuck, stuck_addr, _t3) = start_echo("stuck", "127.0.0.1:0").await;
    stuck.delay_ms.store(60_000, SeqCst); // never answers within the test
    let cfg = format!(
        "{}[[routes]]\nname = \"api\"\ntargets = [\"http://{p_addr}\"]\n\
         [[routes.shadows]]\nname = \"fast\"\nurl = \"http://{fast_addr}\"\n\
         [[routes.shadows]]\nname = \"stuck\"\nurl = \"http://{stuck_addr}\"\ntimeout_ms = 60000\n",
        listen_toml()
    );
    let mut p = start(tempfile::tempdir().unwrap(), &cfg).await;
    let started = Instant::now();
    for i in 0..20 {
        let a = p
            .send(
                "POST",
                &format!("/orders/{i}"),
                &[("content-type", "text/plain")],
                format!("body {i}").into_bytes(),
            )
            .await;
        assert_eq!(a.status, 200);
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let until = Instant::now() + Duration::from_secs(10);
    while fast.got.lock().len() < 20 {
        assert!(Instant::now() < until, "{} replays", fast.got.lock().len());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let got = fast.got.lock().clone();
    let mut bodies: Vec<String> = got
        .iter()
        .map(|g| String::from_utf8_lossy(&g.3).to_string())
        .collect();
    bodies.sort();
    let mut want: Vec<String> = (0..20).map(|i| format!("body {i}")).collect();
    want.sort();
    assert_eq!(bodies, want);
    assert!(got.iter().all(|g| g.0 == "POST"
        && g.2["x-weir-replay"] == "api/fast"
        && g.2["content-type"] == "text/plain"));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_down_gets_its_backlog_when_it_is_back_even_after_a_restart() {
    let (_primary, p_addr, _t1) = start_echo("primary", "127.0.0.1:0").await;
    let shadow_addr = free_addr();
    let cfg = format!(
        "{}[[routes]]\nname = \"api\"\ntargets = [\"http://{p_addr}\"]\n[[routes.shadows]]\nname = \"later\"\nurl = \"http://{shadow_addr}\"\nconcurrency = 1\n",
        listen_toml()
    );
    let dir = tempfile::tempdir().unwrap();
    let mut p = start(dir, &cfg).await;
    for i in 0..10 {
        assert_eq!(
            p.send("GET", &format!("/r/{i}"), &[], vec![]).await.status,
            200
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let m = p.metrics().await;
    assert!(
        m.contains("weir_proxy_replay_backlog{route=\"api\",shadow=\"later\"} 10"),
        "{m}"
    );
    // weir restarts; then the shadow comes up.
    p.stop().await;
    let dir = std::mem::replace(&mut p.dir, tempfile::tempdir().unwrap());
    let mut p = start(dir, &cfg).await;
    let (shadow, _, _t2) = start_echo("later", &shadow_addr.to_string()).await;
    // The replays, less the probes (`HEAD /`) that found the shadow back.
    let replays = || -> Vec<String> {
        let got = shadow.got.lock();
        got.iter()
            .filter(|g| g.0 != "HEAD")
            .map(|g| g.1.clone())
            .collect()
    };
    let until = Instant::now() + Duration::from_secs(15);
    while replays().len() < 10 {
        assert!(Instant::now() < until, "{} replays", replays().len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let uris = replays();
    assert_eq!(
        uris,
        (0..10).map(|i| format!("/r/{i}")).collect::<Vec<_>>(),
        "in order at concurrency 1"
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_replay_stops_at_the_first_failure() {
    let (_primary, p_addr, _t1) = start_echo("primary", "127.0.0.1:0").await;
    let (first, first_addr, _t2) = start_echo("first", "127.0.0.1:0").await;
    let (second, second_addr, _t3) = start_echo("second", "127.0.0.1:0").await;
    first.status.store(500, SeqCst);
    let cfg = format!(
        "{}[[routes]]\nname = \"api\"\nreplay = \"sequential\"\ntargets = [\"http://{p_addr}\"]\n\
         [[routes.shadows]]\nname = \"first\"\nurl = \"http://{first_addr}\"\nattempts_max = 1\n\
         [[routes.shadows]]\nname = \"second\"\nurl = \"http://{second_addr}\"\n",
        listen_toml()
    );
    let mut p = start(tempfile::tempdir().unwrap(), &cfg).await;
    assert_eq!(p.send("GET", "/a", &[], vec![]).await.status, 200);
    let until = Instant::now() + Duration::from_secs(10);
    while first.got.lock().is_empty() {
        assert!(Instant::now() < until);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The first shadow has answered /a with 500 (or is about to): only then does
    // it start answering 200.
    tokio::time::sleep(Duration::from_millis(200)).await;
    first.status.store(0, SeqCst);
    assert_eq!(p.send("GET", "/b", &[], vec![]).await.status, 200);
    while second.got.lock().is_empty() {
        assert!(Instant::now() < until);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second_got: Vec<String> = second.got.lock().iter().map(|g| g.1.clone()).collect();
    assert_eq!(
        second_got,
        ["/b"],
        "/a failed on the first shadow: not sent to the second"
    );
    // /a ran out of its one attempt: a dead letter of the first shadow.
    assert!(p
        .metrics()
        .await
        .contains("weir_proxy_replays_failed_total{route=\"api\",shadow=\"first\"} 1"));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_to_a_primary_that_does_not_read_them_all_succeed_and_replay() {
    // rocky's benchmark primary: answers without reading the body.
    let app = axum::Router::new().fallback(|| async { "Hello world!" });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let p_addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let (shadow, s_addr, _t) = start_echo("shadow", "127.0.0.1:0").await;
    let cfg = format!(
        "{}[[routes]]\nname = \"big\"\ntargets = [\"http://{p_addr}\"]\n[[routes.shadows]]\nname = \"s\"\nurl = \"http://{s_addr}\"\n",
        listen_toml()
    );
    let mut p = start(tempfile::tempdir().unwrap(), &cfg).await;
    let body = vec![b'z'; 234_183];
    for i in 0..100 {
        let a = p
            .send("POST", &format!("/upload/{i}"), &[], body.clone())
            .await;
        assert_eq!(
            a.status,
            200,
            "request {i}: {:?}",
            a.headers.get("x-weir-proxy-error")
        );
        assert_eq!(&a.body[..], b"Hello world!");
    }
    let until = Instant::now() + Duration::from_secs(15);
    while shadow.got.lock().len() < 100 {
        if Instant::now() >= until {
            let got = shadow.got.lock().len();
            panic!("{got} replays; {}", p.metrics().await);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(shadow.got.lock().iter().all(|g| g.3.len() == 234_183));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_head_is_refused_and_the_proxy_goes_on() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_primary, addr, _t) = start_echo("primary", "127.0.0.1:0").await;
    let cfg = format!(
        "header_bytes_max = 16384\n{}[[routes]]\nname = \"all\"\ntargets = [\"http://{addr}\"]\n",
        listen_toml()
    );
    let mut p = start(tempfile::tempdir().unwrap(), &cfg).await;
    let mut raw = tokio::net::TcpStream::connect(p.base.trim_start_matches("http://"))
        .await
        .unwrap();
    let head = format!(
        "GET / HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "a".repeat(100_000)
    );
    let _ = raw.write_all(head.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 431"), "{text}");
    assert_eq!(p.send("GET", "/fine", &[], vec![]).await.status, 200);
    p.stop().await;
}

/// A WebSocket echo server: each text message comes back as `echo: TEXT`. The
/// server side of tokio-tungstenite (the client the tests use), not axum's `ws`
/// feature: a dev-dependency that turned on a feature of axum would make
/// `cargo test --workspace` build every crate over axum a second time.
async fn start_ws_echo() -> SocketAddr {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                // A request that asks for no upgrade gets a 400, as a WebSocket
                // endpoint answers it (the head is looked at, not taken).
                let mut head = [0u8; 4096];
                let n = stream.peek(&mut head).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&head[..n]).to_ascii_lowercase();
                if !head.contains("websocket") {
                    use tokio::io::AsyncWriteExt;
                    let mut stream = stream;
                    let _ = stream
                        .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                        .await;
                    return;
                }
                let Ok(mut socket) = tokio_tungstenite::accept_async(stream).await else {
                    return;
                };
                while let Some(Ok(msg)) = socket.next().await {
                    if let Message::Text(t) = msg {
                        let echo = Message::Text(format!("echo: {t}").into());
                        if socket.send(echo).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websockets_pass_through() {
    use futures_util::{SinkExt, StreamExt};
    let addr = start_ws_echo().await;
    let cfg = format!(
        "{}[[routes]]\nname = \"ws\"\ntargets = [\"http://{addr}\"]\nwebsocket = true\nwebsocket_idle_ms = 400\n",
        listen_toml()
    );
    let mut p = start(tempfile::tempdir().unwrap(), &cfg).await;
    let url = format!("{}/ws", p.base.replace("http://", "ws://"));
    let (mut ws, response) = tokio_tungstenite::connect_async(url).await.unwrap();
    assert_eq!(response.status(), 101);
    for i in 0..3 {
        ws.send(tokio_tungstenite::tungstenite::Message::Text(
            format!("hi {i}").into(),
        ))
        .await
        .unwrap();
        let got = ws.next().await.unwrap().unwrap();
        assert_eq!(got.into_text().unwrap().as_str(), format!("echo: hi {i}"));
    }
    // Quiet for longer than websocket_idle_ms: the proxy closes the tunnel.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let _ = ws
        .send(tokio_tungstenite::tungstenite::Message::Text("late".into()))
        .await;
    let after = tokio::time::timeout(Duration::from_secs(3), ws.next())
        .await
        .expect("the tunnel ends, it does not hang");
    assert!(
        !matches!(
            after,
            Some(Ok(tokio_tungstenite::tungstenite::Message::Text(_)))
        ),
        "{after:?}"
    );
    // A plain request on the same proxy still works.
    assert_eq!(p.send("GET", "/ws", &[], vec![]).await.status, 400);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_active_health_check_takes_a_sick_target_out_and_back() {
    let (sick, sick_addr, _t1) = start_echo("sick", "127.0.0.1:0").await;
    let (well, well_addr, _t2) = start_echo("well", "127.0.0.1:0").await;
    sick.status.store(503, SeqCst);
    let cfg = format!(
        "{}[[routes]]\nname = \"lb\"\ntargets = [\"http://{sick_addr}\", \"http://{well_addr}\"]\nhealth_path = \"/health\"\nhealth_interval_ms = 100\n",
        listen_toml()
    );
    let mut p = start(tempfile::tempdir().unwrap(), &cfg).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = sick.got.lock().len();
    for _ in 0..10 {
        assert_eq!(p.send("GET", "/work", &[], vec![]).await.status, 200);
    }
    let sick_work = sick
        .got
        .lock()
        .iter()
        .skip(before)
        .filter(|g| g.1 == "/work")
        .count();
    assert_eq!(sick_work, 0, "a target failing its check gets no traffic");
    sick.status.store(0, SeqCst);
    tokio::time::sleep(Duration::from_millis(400)).await;
    for _ in 0..10 {
        assert_eq!(p.send("GET", "/work", &[], vec![]).await.status, 200);
    }
    let sick_work = sick.got.lock().iter().filter(|g| g.1 == "/work").count();
    assert!(sick_work >= 3, "back in the rotation: {sick_work}");
    assert!(well.got.lock().iter().any(|g| g.1 == "/health"));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_and_http2_bodies_reach_the_primary_and_the_shadow() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (primary, p_addr, _t1) = start_echo("primary", "127.0.0.1:0").await;
    let (shadow, s_addr, _t2) = start_echo("shadow", "127.0.0.1:0").await;
    let cfg = format!(
        "{}[[routes]]\nname = \"api\"\ntargets = [\"http://{p_addr}\"]\n[[routes.shadows]]\nname = \"s\"\nurl = \"http://{s_addr}\"\n",
        listen_toml()
    );
    let mut p = start(tempfile::tempdir().unwrap(), &cfg).await;
    let proxy_addr = p.base.trim_start_matches("http://").to_string();
    // HTTP/1.1, chunked: no length header at all.
    let mut raw = tokio::net::TcpStream::connect(&proxy_addr).await.unwrap();
    raw.write_all(b"POST /chunked HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    raw.read_to_end(&mut answer).await.unwrap();
    assert!(
        String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    // HTTP/2 over cleartext (prior knowledge).
    let stream = tokio::net::TcpStream::connect(&proxy_addr).await.unwrap();
    let (mut h2, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let uri = format!("http://{proxy_addr}/h2");
    let req = hyper::Request::post(uri)
        .body(http_body_util::Full::new(Bytes::from_static(b"over h2")))
        .unwrap();
    let resp = h2.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let bodies = |e: &Echo| -> Vec<(String, String)> {
        e.got
            .lock()
            .iter()
            .map(|g| (g.1.clone(), String::from_utf8_lossy(&g.3).to_string()))
            .collect()
    };
    let want = vec![
        ("/chunked".to_string(), "hello world".to_string()),
        ("/h2".to_string(), "over h2".to_string()),
    ];
    assert_eq!(bodies(&primary), want);
    let until = Instant::now() + Duration::from_secs(10);
    while shadow.got.lock().len() < 2 {
        assert!(Instant::now() < until);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut got = bodies(&shadow);
    got.sort();
    assert_eq!(got, want);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_stalls_mid_answer_does_not_hold_the_client() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A target that sends a head and 3 of 100 bytes, then nothing.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let t_addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nabc")
                    .await;
                tokio::time::sleep(Duration::from_secs(60)).await;
            });
        }
    });
    let cfg = format!("{}[[routes]]\nname = \"slow\"\ntargets = [\"http://{t_addr}\"]\nrequest_timeout_ms = 300\n", listen_toml());
    let mut p = start(tempfile::tempdir().unwrap(), &cfg).await;
    let mut raw = tokio::net::TcpStream::connect(p.base.trim_start_matches("http://"))
        .await
        .unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the connection was still held after 5 s");
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    p.stop().await;
}

/// A versioned JSON service: `price` is its version's, `ts` differs on every answer.
async fn start_priced(price: u64) -> (SocketAddr, Arc<AtomicUsize>) {
    let served = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&served);
    let app = axum::Router::new().fallback(move |req: Request| {
        let count = Arc::clone(&count);
        async move {
            let n = count.fetch_add(1, SeqCst);
            let ts = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
                + n as u128;
            let body = json!({"path": req.uri().path(), "price": price, "ts": ts.to_string(), "tags": ["a", "b"]});
            ([("content-type", "application/json")], body.to_string())
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, served)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diffs_report_the_changed_field_and_learn_noise_from_the_reference() {
    let (primary, _) = start_priced(10).await;
    let (reference, reference_served) = start_priced(10).await;
    let (candidate, _) = start_priced(11).await;
    let (same, _) = start_priced(10).await;
    let cfg = format!(
        "{}[[routes]]\nname = \"api\"\ntargets = [\"http://{primary}\"]\n\
         reference = \"http://{reference}\"\n\
         [[routes.shadows]]\nname = \"candidate\"\nurl = \"http://{candidate}\"\ndiff = true\n\
         [[routes.shadows]]\nname = \"same\"\nurl = \"http://{same}\"\ndiff = true\n\
         [[routes.shadows]]\nname = \"plain\"\nurl = \"http://{same}\"\n",
        listen_toml()
    );
    let mut p = start(tempfile::tempdir().unwrap(), &cfg).await;
    for i in 0..10 {
        let a = p.send("GET", &format!("/items/{i}"), &[], vec![]).await;
        assert_eq!(a.status, 200);
        let body: Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(body["price"], 10, "the client gets the primary's answer");
    }
    let handle = p.handle.as_ref().unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    let report = loop {
        let r = handle.diff_report();
        let compared: u64 = r[0].shadows.iter().map(|s| s.stats.compared).sum();
        if compared == 20 {
            break r;
        }
        assert!(Instant::now() < until, "{r:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(report.len(), 1);
    let r = &report[0];
    assert!(r.reference);
    assert_eq!(r.noise_fields, vec!["body.ts".to_string()]);
    assert_eq!(r.shadows.len(), 2, "the plain shadow does not diff");
    let candidate = r.shadows.iter().find(|s| s.shadow == "candidate").unwrap();
    assert_eq!(candidate.stats.different, 10);
    let fields: Vec<&String> = candidate.stats.fields.keys().collect();
    assert_eq!(fields, vec!["body.price"], "exactly the changed field");
    let changed = &candidate.stats.fields["body.price"][&weir_proxy::DiffKind::Changed];
    assert_eq!(changed.count, 10);
    let sample = changed.samples.back().unwrap();
    assert_eq!(
        (sample.primary.as_str(), sample.shadow.as_str()),
        ("10", "11")
    );
    assert!(sample.uri.starts_with("/items/"));
    let same = r.shadows.iter().find(|s| s.shadow == "same").unwrap();
    assert_eq!((same.stats.different, same.stats.noise_only), (0, 10));
    assert!(same.stats.fields.is_empty());
    // The reference is asked only about answers with a difference not yet known as
    // noise: the candidate's 10 (price), and the other shadow's first few (ts, until
    // it is learned; up to 4 replays in flight).
    let asked = reference_served.load(SeqCst);
    assert!((10..=14).contains(&asked), "{asked}");
    let m = p.metrics().await;
    assert!(m.contains(
        "weir_proxy_diffs_total{route=\"api\",shadow=\"candidate\",field=\"body.price\",kind=\"changed\"} 10"
    ), "{m}");
    assert!(m.contains(
        "weir_proxy_diff_compared_total{route=\"api\",shadow=\"same\",outcome=\"noise\"} 10"
    ));
    assert!(m.contains("weir_proxy_diff_noise_fields{route=\"api\"} 1"));
    p.stop().await;
}

/// Whether the proxy serves a fresh connection (false: closed at once, over
/// `connections_max`).
async fn served(base: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut c) = tokio::net::TcpStream::connect(base.trim_start_matches("http://")).await else {
        return false;
    };
    if c.write_all(b"GET /x HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .is_err()
    {
        return false;
    }
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf)).await,
        Ok(Ok(n)) if n > 0
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgraded_connections_keep_their_place_in_connections_max() {
    let addr = start_ws_echo().await;
    let cfg = format!(
        "connections_max = 2\n{}[[routes]]\nname = \"ws\"\ntargets = [\"http://{addr}\"]\nwebsocket = true\n",
        listen_toml()
    );
    let mut p = start(tempfile::tempdir().unwrap(), &cfg).await;
    let url = format!("{}/ws", p.base.replace("http://", "ws://"));
    let (first, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let (second, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    // Both tunnels are up (their HTTP connections are over): no place is left.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!served(&p.base).await, "a third connection is refused");
    drop(first);
    let until = Instant::now() + Duration::from_secs(5);
    while !served(&p.base).await {
        assert!(
            Instant::now() < until,
            "the closed tunnel gave its place back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(second);
    p.stop().await;
}

/// A CA and a certificate it signed for `localhost`: (CA PEM, leaf DER, key DER).
fn tls_material() -> (String, Vec<u8>, Vec<u8>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .signed_by(&key, &ca_cert, &ca_key)
        .unwrap();
    (ca_cert.pem(), leaf.der().to_vec(), key.serialize_der())
}

/// An HTTPS server answering `tls NAME PATH`, recording the paths it got.
async fn start_tls_server(
    name: &'static str,
    leaf: Vec<u8>,
    key: Vec<u8>,
) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(leaf)],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key)),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&got);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, seen) = (acceptor.clone(), Arc::clone(&seen));
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let seen = Arc::clone(&seen);
                        async move {
                            seen.lock().push(req.uri().path().to_string());
                            let text = format!("tls {name} {}", req.uri().path());
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(
                                http_body_util::Full::new(Bytes::from(text)),
                            ))
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (addr, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_targets_and_shadows_are_reached_over_tls_and_an_unknown_ca_is_refused() {
    let (ca_pem, leaf, key) = tls_material();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca_pem).unwrap();
    let (primary, _) = start_tls_server("primary", leaf.clone(), key.clone()).await;
    let (shadow, shadow_got) = start_tls_server("shadow", leaf, key).await;
    let routes = format!(
        "[[routes]]\nname = \"secure\"\npath = \"/secure/*\"\ntargets = [\"https://localhost:{}\"]\n\
         [[routes.shadows]]\nname = \"s\"\nurl = \"https://localhost:{}\"\nattempts_max = 2\nretry_backoff_ms = 50\n",
        primary.port(),
        shadow.port()
    );
    let cfg = format!(
        "tls_ca_file = {:?}\n{}{routes}",
        ca_file.to_str().unwrap(),
        listen_toml()
    );
    let mut p = start(tempfile::tempdir().unwrap(), &cfg).await;
    let a = p.send("GET", "/secure/a", &[], vec![]).await;
    assert_eq!(
        (a.status, &a.body[..]),
        (200, &b"tls primary /secure/a"[..])
    );
    let until = Instant::now() + Duration::from_secs(10);
    while shadow_got.lock().is_empty() {
        assert!(Instant::now() < until, "the shadow got its replay over TLS");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(shadow_got.lock()[0], "/secure/a");
    p.stop().await;
    // Without the CA file the certificate is not trusted: 502 with the reason.
    let cfg = format!("{}{routes}", listen_toml());
    let mut p = start(tempfile::tempdir().unwrap(), &cfg).await;
    let a = p.send("GET", "/secure/b", &[], vec![]).await;
    assert_eq!(a.status, 502);
    let reason = a.headers["x-weir-proxy-error"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(reason.contains("certificate"), "{reason}");
    // For the shadow it is a failure after its attempts (a dead letter), not a shadow
    // down for ever.
    let until = Instant::now() + Duration::from_secs(10);
    while !p
        .metrics()
        .await
        .contains("weir_proxy_replays_failed_total{route=\"secure\",shadow=\"s\"} 1")
    {
        assert!(Instant::now() < until, "{}", p.metrics().await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        shadow_got.lock().len(),
        1,
        "nothing more reached the shadow"
    );
    assert!(p
        .metrics()
        .await
        .contains("weir_proxy_replay_dead_letters{route=\"secure\",shadow=\"s\"} 1"));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_before_the_answer_still_has_its_request_replayed_on_a_diffing_route() {
    use tokio::io::AsyncWriteExt;
    let (primary, p_addr, _t1) = start_echo("primary", "127.0.0.1:0").await;
    primary.delay_ms.store(500, SeqCst);
    let (shadow, s_addr, _t2) = start_echo("shadow", "127.0.0.1:0").await;
    let cfg = format!(
        "{}[[routes]]\nname = \"api\"\ntargets = [\"http://{p_addr}\"]\n\
         [[routes.shadows]]\nname = \"s\"\nurl = \"http://{s_addr}\"\ndiff = true\n",
        listen_toml()
    );
    let mut p = start(tempfile::tempdir().unwrap(), &cfg).await;
    let mut c = tokio::net::TcpStream::connect(p.base.trim_start_matches("http://"))
        .await
        .unwrap();
    c.write_all(b"GET /gone HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(c);
    let until = Instant::now() + Duration::from_secs(10);
    while shadow.got.lock().is_empty() {
        assert!(
            Instant::now() < until,
            "the request was captured and replayed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(shadow.got.lock()[0].1, "/gone");
    // Without the primary's answer there was nothing to compare.
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let report = p.handle.as_ref().unwrap().diff_report();
        if report[0].shadows[0].stats.skipped == 1 {
            assert_eq!(report[0].shadows[0].stats.compared, 0);
            break;
        }
        assert!(Instant::now() < until, "{report:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    p.stop().await;
}
