//! The proxy suite's parts: rocky's primary (answers `Hello world!` without reading
//! the body) and its shadows (accept a request and never answer), each a process of
//! its own (`weir-bench hello-http ADDR`, `weir-bench silent-http ADDR`); and an
//! open-loop load generator (as vegeta: requests leave on schedule whether or not
//! earlier ones answered; latency counts from the scheduled time).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `weir-bench hello-http ADDR`: answers every request `Hello world!` at once,
/// without reading its body.
pub fn hello_main(addr: &str) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let app = axum::Router::new().fallback(|| async { "Hello world!" });
        let listener = tokio::net::TcpListener::bind(addr).await?;
        axum::serve(listener, app).await?;
        anyhow::Ok(())
    })
}

/// `weir-bench drain-http ADDR`: reads each request's body to its end, then answers
/// `ok`.
pub fn drain_main(addr: &str) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let app = axum::Router::new().fallback(|body: axum::body::Body| async move {
            let mut body = body;
            while let Some(Ok(_)) = body.frame().await {}
            "ok"
        });
        let listener = tokio::net::TcpListener::bind(addr).await?;
        axum::serve(listener, app).await?;
        anyhow::Ok(())
    })
}

/// `weir-bench silent-http ADDR`: reads whatever comes and never answers.
pub fn silent_main(addr: &str) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        loop {
            let (mut s, _) = listener.accept().await?;
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
                let _ = s.shutdown().await;
            });
        }
    })
}

/// What a load run measured.
pub struct Load {
    pub sent: u64,
    pub ok: u64,
    pub latency_us: Histogram<u64>,
    pub seconds: f64,
}

impl Load {
    pub fn ms(&self, q: f64) -> f64 {
        self.latency_us.value_at_quantile(q) as f64 / 1000.0
    }
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    let mut c = hyper_util::client::legacy::connect::HttpConnector::new();
    c.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build(c)
}

/// One request; true for a 2xx with its body read.
async fn one(
    client: &HttpClient,
    url: &str,
    method: &str,
    body: &Bytes,
    timeout: Duration,
) -> bool {
    let Ok(req) = hyper::Request::builder()
        .method(method)
        .uri(url)
        .body(Full::new(body.clone()))
    else {
        return false;
    };
    let call = async {
        let r = client.request(req).await.ok()?;
        let ok = r.status().is_success();
        r.into_body().collect().await.ok()?;
        Some(ok)
    };
    matches!(tokio::time::timeout(timeout, call).await, Ok(Some(true)))
}

/// The schedule of an open loop: `total` times from `start`, `rate` per second, each
/// handed over when it comes. tokio's timers fire on a 1 ms wheel (a request would
/// leave up to a millisecond late, and that lateness would be counted as the target's
/// latency), so a thread of its own sleeps to each time with the kernel's
/// high-resolution timers (tens of microseconds late at most).
fn on_schedule(
    start: std::time::Instant,
    rate: f64,
    total: u64,
) -> tokio::sync::mpsc::UnboundedReceiver<std::time::Instant> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for i in 0..total {
            let at = start + Duration::from_secs_f64(i as f64 / rate);
            let now = std::time::Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            if tx.send(at).is_err() {
                return;
            }
        }
    });
    rx
}

/// Open loop: `rate` requests per second for `seconds`, each sent at its time.
pub async fn open_loop(
    url: &str,
    method: &str,
    body: Bytes,
    rate: f64,
    seconds: f64,
) -> Result<Load> {
    let client = client();
    let total = (rate * seconds).round() as u64;
    let hist = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(
        1,
        120_000_000,
        3,
    )?));
    let ok = Arc::new(AtomicU64::new(0));
    let start = tokio::time::Instant::now() + Duration::from_millis(100);
    let mut tasks = tokio::task::JoinSet::new();
    let mut due = on_schedule(start.into_std(), rate, total);
    while let Some(at) = due.recv().await {
        let at = tokio::time::Instant::from_std(at);
        let (client, url, method, body, hist, ok) = (
            client.clone(),
            url.to_string(),
            method.to_string(),
            body.clone(),
            Arc::clone(&hist),
            Arc::clone(&ok),
        );
        tasks.spawn(async move {
            let good = one(&client, &url, &method, &body, Duration::from_secs(30)).await;
            let us = u64::try_from(at.elapsed().as_micros())
                .unwrap_or(u64::MAX)
                .max(1);
            let _ = hist.lock().record(us);
            if good {
                ok.fetch_add(1, Relaxed);
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let latency_us = hist.lock().clone();
    Ok(Load {
        sent: total,
        ok: ok.load(Relaxed),
        latency_us,
        seconds,
    })
}

/// Closed loop: `conns` tasks each sending one request after the other for
/// `seconds`.
pub async fn closed_loop(url: &str, conns: usize, seconds: f64) -> Result<Load> {
    let client = client();
    let hist = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(
        1,
        120_000_000,
        3,
    )?));
    let (ok, sent) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let until = tokio::time::Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..conns {
        let (client, url, hist, ok, sent) = (
            client.clone(),
            url.to_string(),
            Arc::clone(&hist),
            Arc::clone(&ok),
            Arc::clone(&sent),
        );
        tasks.spawn(async move {
            let body = Bytes::new();
            while tokio::time::Instant::now() < until {
                let t = tokio::time::Instant::now();
                let good = one(&client, &url, "GET", &body, Duration::from_secs(30)).await;
                let _ = hist.lock().record(
                    u64::try_from(t.elapsed().as_micros())
                        .unwrap_or(u64::MAX)
                        .max(1),
                );
                sent.fetch_add(1, Relaxed);
                if good {
                    ok.fetch_add(1, Relaxed);
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let latency_us = hist.lock().clone();
    Ok(Load {
        sent: sent.load(Relaxed),
        ok: ok.load(Relaxed),
        latency_us,
        seconds,
    })
}
