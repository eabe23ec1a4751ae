//! What the bus's integration tests share: a bus on a temporary store (the embedded
//! backend, its metadata in the store's directory, as `weir serve` has it), a real HTTP
//! receiver (an axum server) that records deliveries and answers with a status the
//! test chooses, and a small API client.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use parking_lot::Mutex;
use serde_json::Value;
use weir_backend::Backend;
use weir_bus::{BusConfig, BusHandle};

pub const ROOT: &str = "root-key-for-tests";

/// Starts a bus on `store` (the embedded backend), its metadata in `dir`. Blocking.
pub fn start_on(store: weir::Store, dir: PathBuf, config: BusConfig) -> (BusHandle, Arc<Backend>) {
    let backend = Arc::new(Backend::Embedded(weir_backend::Embedded::new(store)));
    let settings = config.resolve(None, None).unwrap();
    let handle = weir_bus::start(Arc::clone(&backend), dir, settings).unwrap();
    (handle, backend)
}

/// A test bus config: loopback and http allowed, fast retries.
pub fn config() -> BusConfig {
    BusConfig {
        listen: Some("127.0.0.1:0".into()),
        root_key: Some(ROOT.into()),
        allow_http: Some(true),
        allow_private_networks: Some(true),
        retry_initial_ms: Some(20),
        retry_ms_max: Some(200),
        threads: Some(2),
        ..BusConfig::default()
    }
}

pub struct TestBus {
    pub dir: tempfile::TempDir,
    pub handle: Option<BusHandle>,
    /// The backend the running bus keeps its queues in; closed by [`TestBus::stop`].
    pub backend: Option<Arc<Backend>>,
    pub base: String,
    pub http: reqwest::Client,
}

impl TestBus {
    pub async fn start(config: BusConfig) -> TestBus {
        let dir = tempfile::tempdir().unwrap();
        let mut bus = TestBus {
            dir,
            handle: None,
            backend: None,
            base: String::new(),
            http: reqwest::Client::new(),
        };
        bus.restart_with(config).await;
        bus
    }

    /// Stops the bus (if running) and starts it again on the same directory.
    pub async fn restart_with(&mut self, config: BusConfig) {
        self.stop().await;
        let path = self.dir.path().to_path_buf();
        let (handle, backend) = tokio::task::spawn_blocking(move || {
            let store = weir::Store::open(&path).unwrap();
            start_on(store, path, config)
        })
        .await
        .unwrap();
        self.base = format!("http://{}", handle.local_addr());
        self.handle = Some(handle);
        self.backend = Some(backend);
    }

    /// Stops the bus, then closes its backend (the store can be opened again).
    pub async fn stop(&mut self) {
        if let Some(handle) = self.handle.take() {
            tokio::task::spawn_blocking(move || handle.stop())
                .await
                .unwrap();
        }
        if let Some(backend) = self.backend.take() {
            backend.close().await.unwrap();
        }
    }

    /// The bus's `/metrics` series when the page has no queue figures (its
    /// gathering did not finish in time).
    pub fn metrics_without_figures(&self) -> String {
        let mut out = String::new();
        self.handle.as_ref().unwrap().render_metrics(&[], &mut out);
        out
    }

    /// The bus's `/metrics` series, over every queue's figures as `weir serve`
    /// gathers them.
    pub fn metrics(&self) -> String {
        let store = self
            .backend
            .as_ref()
            .and_then(|b| b.engine_store_for_tests());
        let stats: Vec<weir_backend::QueueStats> = store
            .map(|s| s.queues().iter().map(weir::Queue::stats).collect())
            .unwrap_or_default();
        let mut out = String::new();
        self.handle
            .as_ref()
            .unwrap()
            .render_metrics(&stats, &mut out);
        out
    }

    /// A request with Basic auth `user` (none when empty) and a raw body.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        user: &str,
        body: Option<&[u8]>,
    ) -> (StatusCode, HeaderMap, Bytes) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if !user.is_empty() {
            req = req.basic_auth(user, Some("x"));
        }
        if let Some(body) = body {
            req = req.body(body.to_vec());
        }
        let resp = req.send().await.unwrap();
        let status = StatusCode::from_u16(resp.status().as_u16()).unwrap();
        let headers = resp.headers().clone();
        (status, headers, resp.bytes().await.unwrap())
    }

    pub async fn json(
        &self,
        method: &str,
        path: &str,
        user: &str,
        body: Value,
    ) -> (StatusCode, Value) {
        let (status, _, bytes) = self
            .call(method, path, user, Some(body.to_string().as_bytes()))
            .await;
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    pub async fn get(&self, path: &str, user: &str) -> (StatusCode, Value) {
        let (status, _, bytes) = self.call("GET", path, user, None).await;
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// A new client token named `name`.
    pub async fn token(&self, name: &str) -> String {
        let (status, v) = self
            .json(
                "POST",
                "/api_tokens",
                ROOT,
                serde_json::json!({ "name": name }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        v["token"].as_str().unwrap().to_string()
    }

    /// Subscribes `token`; returns the signing secret (first subscription only).
    pub async fn subscribe(&self, token: &str, body: Value) -> Option<String> {
        let (status, headers, bytes) = self
            .call(
                "POST",
                "/subscription",
                token,
                Some(body.to_string().as_bytes()),
            )
            .await;
        assert_eq!(
            status,
            StatusCode::NO_CONTENT,
            "{}",
            String::from_utf8_lossy(&bytes)
        );
        headers
            .get("webhook-secret")
            .map(|v| v.to_str().unwrap().to_string())
    }

    pub async fn publish(&self, token: &str, topic: &str, url: &str) -> StatusCode {
        let body = serde_json::json!({ "type": "noop", "url": url });
        self.json("POST", &format!("/topics/{topic}"), token, body)
            .await
            .0
    }
}

/// One POST the receiver got.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub at: Instant,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub status: u16,
}

impl Delivery {
    pub fn events(&self) -> Vec<Value> {
        serde_json::from_slice::<Vec<Value>>(&self.body).unwrap()
    }
}

/// A real HTTP receiver: records every POST to `/cb/NAME`, answers `status`.
pub struct Receiver {
    pub addr: SocketAddr,
    pub got: Arc<Mutex<Vec<Delivery>>>,
    pub status: Arc<AtomicU16>,
    /// Answer 500 to this many more POSTs before answering `status`.
    pub fail_next: Arc<AtomicUsize>,
    /// Answer 400 to every POST whose body contains these bytes (a receiver that
    /// cannot take one event refuses its whole batch).
    pub refuse_containing: Arc<Mutex<Option<Vec<u8>>>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct RecvState {
    got: Arc<Mutex<Vec<Delivery>>>,
    status: Arc<AtomicU16>,
    fail_next: Arc<AtomicUsize>,
    refuse_containing: Arc<Mutex<Option<Vec<u8>>>>,
}

async fn record(
    State(s): State<RecvState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let failing = s
        .fail_next
        .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
        .is_ok();
    let refused = s
        .refuse_containing
        .lock()
        .as_ref()
        .is_some_and(|poison| body.windows(poison.len()).any(|w| w == poison.as_slice()));
    let status = if failing {
        500
    } else if refused {
        400
    } else {
        s.status.load(SeqCst)
    };
    s.got.lock().push(Delivery {
        at: Instant::now(),
        path: name,
        headers,
        body,
        status,
    });
    StatusCode::from_u16(status).unwrap()
}

impl Receiver {
    pub async fn start() -> Receiver {
        Receiver::start_on("127.0.0.1:0").await
    }

    pub async fn start_on(addr: &str) -> Receiver {
        let state = RecvState {
            got: Arc::default(),
            status: Arc::new(AtomicU16::new(204)),
            fail_next: Arc::default(),
            refuse_containing: Arc::default(),
        };
        let app = axum::Router::new()
            .route("/cb/{name}", axum::routing::post(record))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Receiver {
            addr,
            got: state.got,
            status: state.status,
            fail_next: state.fail_next,
            refuse_containing: state.refuse_containing,
            task,
        }
    }

    pub fn url(&self, name: &str) -> String {
        format!("http://{}/cb/{name}", self.addr)
    }

    /// The accepted (2xx) deliveries to `name`.
    pub fn accepted(&self, name: &str) -> Vec<Delivery> {
        self.got
            .lock()
            .iter()
            .filter(|d| d.path == name && d.status < 300)
            .cloned()
            .collect()
    }

    pub fn all(&self, name: &str) -> Vec<Delivery> {
        self.got
            .lock()
            .iter()
            .filter(|d| d.path == name)
            .cloned()
            .collect()
    }

    /// The events accepted by `name`, in order.
    pub fn events(&self, name: &str) -> Vec<Value> {
        self.accepted(name)
            .iter()
            .flat_map(Delivery::events)
            .collect()
    }

    /// Waits until `name` has accepted `count` events; panics after `limit`.
    pub async fn wait_events(&self, name: &str, count: usize, limit: Duration) -> Vec<Value> {
        let until = Instant::now() + limit;
        loop {
            let events = self.events(name);
            if events.len() >= count {
                return events;
            }
            assert!(
                Instant::now() < until,
                "{name}: {} of {count} events after {limit:?}",
                events.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn stop(self) {
        self.task.abort();
    }
}
