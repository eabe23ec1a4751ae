//! The bus suite's HTTP parts: keep-alive client connections (hyper's http1 client,
//! one request at a time per connection, as a publisher does), the webhook receiver
//! that timestamps each event on arrival, and the bare reference server (a process
//! of its own answering 204 to every POST: the ceiling of HTTP on this machine).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use base64::Engine;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::Request;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;

/// Where events point: the receiver reads the index back from the URL.
pub const EVENT_URL_PREFIX: &str = "https://bench.example/e/";

/// One keep-alive HTTP/1.1 connection.
pub struct Conn {
    sender: SendRequest<Full<Bytes>>,
    auth: String,
}

impl Conn {
    /// Connects; `user` is the Basic user of every request (a token, or empty).
    pub async fn open(addr: SocketAddr, user: &str) -> Result<Conn> {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let credentials = base64::engine::general_purpose::STANDARD.encode(format!("{user}:x"));
        Ok(Conn {
            sender,
            auth: format!("Basic {credentials}"),
        })
    }

    /// One request; returns the status and the body.
    pub async fn call(&mut self, method: &str, path: &str, body: Bytes) -> Result<(u16, Bytes)> {
        self.sender.ready().await.context("connection closed")?;
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "bench")
            .header("authorization", &self.auth)
            .header("content-type", "application/json")
            .body(Full::new(body))?;
        let resp = self.sender.send_request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }

    /// Publishes event `index` to `topic`; fails unless 2xx.
    pub async fn publish(&mut self, topic: &str, index: u64) -> Result<()> {
        let body = format!(r#"{{"type":"noop","url":"{EVENT_URL_PREFIX}{index}"}}"#);
        let (status, text) = self
            .call("POST", &format!("/topics/{topic}"), Bytes::from(body))
            .await?;
        if !(200..300).contains(&status) {
            bail!(
                "publish answered {status}: {}",
                String::from_utf8_lossy(&text)
            );
        }
        Ok(())
    }
}

/// What the receiver records for one scenario: send times by event index, first
/// receipts, and the latency histogram (microseconds).
pub struct Record {
    start: Instant,
    sent_us: Vec<AtomicU64>,
    seen: Vec<AtomicBool>,
    pub received: AtomicU64,
    pub duplicates: AtomicU64,
    pub latency_us: Mutex<Histogram<u64>>,
    /// When the last first receipt happened (µs since `start`).
    pub last_receipt_us: AtomicU64,
}

impl Record {
    pub fn new(events: u64) -> Result<Arc<Record>> {
        let n = usize::try_from(events)?;
        Ok(Arc::new(Record {
            start: Instant::now(),
            sent_us: (0..n).map(|_| AtomicU64::new(0)).collect(),
            seen: (0..n).map(|_| AtomicBool::new(false)).collect(),
            received: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            latency_us: Mutex::new(Histogram::new_with_bounds(1, 3_600_000_000, 3)?),
            last_receipt_us: AtomicU64::new(0),
        }))
    }

    pub fn now_us(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Notes that event `index` is being sent now.
    pub fn sending(&self, index: u64) {
        if let Some(slot) = usize::try_from(index)
            .ok()
            .and_then(|i| self.sent_us.get(i))
        {
            slot.store(self.now_us().max(1), Relaxed);
        }
    }

    fn receipt(&self, index: usize, now_us: u64) {
        let (Some(seen), Some(sent)) = (self.seen.get(index), self.sent_us.get(index)) else {
            return;
        };
        if seen.swap(true, Relaxed) {
            self.duplicates.fetch_add(1, Relaxed);
            return;
        }
        let sent = sent.load(Relaxed);
        if sent > 0 {
            let _ = self
                .latency_us
                .lock()
                .record(now_us.saturating_sub(sent).max(1));
        }
        self.received.fetch_add(1, Relaxed);
        self.last_receipt_us.fetch_max(now_us, Relaxed);
    }

    /// Waits until `count` events were received, or `limit` passes; returns whether
    /// they all came.
    pub async fn wait_received(&self, count: u64, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while self.received.load(Relaxed) < count {
            if Instant::now() > until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    /// (p50, p90, p99, max) latency in milliseconds.
    pub fn percentiles_ms(&self) -> (f64, f64, f64, f64) {
        let h = self.latency_us.lock();
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        (ms(0.5), ms(0.9), ms(0.99), h.max() as f64 / 1000.0)
    }
}

/// The webhook receiver: records each event of each POSTed batch, answers 204.
pub async fn start_receiver(
    record: Arc<Record>,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    async fn hook(State(record): State<Arc<Record>>, body: Bytes) -> StatusCode {
        let now_us = record.now_us();
        let Ok(events) = serde_json::from_slice::<Vec<serde_json::Value>>(&body) else {
            return StatusCode::BAD_REQUEST;
        };
        for e in events {
            let index = e["url"]
                .as_str()
                .and_then(|u| u.strip_prefix(EVENT_URL_PREFIX))
                .and_then(|i| i.parse::<usize>().ok());
            if let Some(i) = index {
                record.receipt(i, now_us);
            }
        }
        StatusCode::NO_CONTENT
    }
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(hook))
        .with_state(record);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((addr, task))
}

/// The bare reference server's main (`weir-bench bare-http ADDR`): reads each
/// POST's body and answers 204, on a multi-threaded runtime of its own.
pub fn bare_server_main(addr: &str) -> Result<()> {
    async fn accept(body: Bytes) -> StatusCode {
        std::hint::black_box(body.len());
        StatusCode::NO_CONTENT
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let app = axum::Router::new().fallback(axum::routing::post(accept));
        let listener = tokio::net::TcpListener::bind(addr).await?;
        axum::serve(listener, app).await?;
        anyhow::Ok(())
    })
}
