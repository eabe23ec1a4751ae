//! `Listener` over real sockets on 127.0.0.1: the cap, eviction, the first head's
//! deadline, and the stop (a request in flight is answered; one slower than the grace
//! is cut).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use weir_http::Listener;

/// A listener being served, and what the test needs to drive it.
struct Served {
    addr: std::net::SocketAddr,
    evictions: Arc<AtomicU64>,
    /// One message per `/slow` request begun.
    started: mpsc::UnboundedReceiver<()>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

/// Serves `/fast` (answers at once) and `/slow` (answers after `slow`).
async fn start(max: usize, header_timeout: Duration, grace: Duration, slow: Duration) -> Served {
    let (started_tx, started) = mpsc::unbounded_channel();
    let router = Router::new()
        .route("/fast", get(|| async { "fast\n" }))
        .route(
            "/slow",
            get(move || {
                let started = started_tx.clone();
                async move {
                    let _ = started.send(());
                    tokio::time::sleep(slow).await;
                    "slow\n"
                }
            }),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let evictions = Arc::new(AtomicU64::new(0));
    let (stop, stopped) = oneshot::channel::<()>();
    let serving = Listener::new("test", max, header_timeout, Arc::clone(&evictions)).grace(grace);
    let task = tokio::spawn(async move {
        let stop = async move {
            let _ = stopped.await;
        };
        serving.serve_http1(listener, stop, router).await;
    });
    Served {
        addr,
        evictions,
        started,
        stop: Some(stop),
        task,
    }
}

async fn request(addr: std::net::SocketAddr, path: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

/// All the server sends until it closes the connection (a reset counts as a close);
/// panics if it is still open after `within`.
async fn until_closed(stream: &mut TcpStream, within: Duration) -> String {
    let mut got = Vec::new();
    let read = tokio::time::timeout(within, stream.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "still open after {within:?}: got {got:?}");
    String::from_utf8_lossy(&got).into_owned()
}

const LONG: Duration = Duration::from_secs(10);

#[tokio::test]
async fn at_the_cap_with_every_connection_busy_a_newcomer_is_refused() {
    let mut served = start(1, LONG, LONG, Duration::from_millis(500)).await;
    let mut busy = request(served.addr, "/slow").await;
    served.started.recv().await.unwrap();
    let mut refused = request(served.addr, "/fast").await;
    assert_eq!(until_closed(&mut refused, Duration::from_secs(2)).await, "");
    let answer = until_closed(&mut busy, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("slow\n"), "{answer}");
    assert_eq!(served.evictions.load(Relaxed), 0);
}

#[tokio::test]
async fn an_idle_connection_is_evicted_for_a_newcomer() {
    let served = start(1, LONG, LONG, LONG).await;
    let mut idle = TcpStream::connect(served.addr).await.unwrap();
    // Accepted (and admitted) before the newcomer: it is served a request first.
    idle.write_all(b"GET /fast HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    let mut newcomer = request(served.addr, "/fast").await;
    let answer = until_closed(&mut newcomer, Duration::from_secs(2)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The rest of the first answer, then the close.
    let rest = until_closed(&mut idle, Duration::from_secs(2)).await;
    assert!(rest.ends_with("fast\n"), "{rest}");
    assert_eq!(served.evictions.load(Relaxed), 1);
}

#[tokio::test]
async fn a_connection_that_sends_no_head_is_closed_after_the_header_timeout() {
    let served = start(4, Duration::from_millis(200), LONG, LONG).await;
    let began = Instant::now();
    let mut silent = TcpStream::connect(served.addr).await.unwrap();
    assert_eq!(until_closed(&mut silent, Duration::from_secs(3)).await, "");
    assert!(began.elapsed() >= Duration::from_millis(150));
    assert_eq!(served.evictions.load(Relaxed), 0);
}

#[tokio::test]
async fn a_request_in_flight_at_stop_is_answered() {
    let mut served = start(4, LONG, Duration::from_secs(5), Duration::from_millis(300)).await;
    let mut in_flight = request(served.addr, "/slow").await;
    served.started.recv().await.unwrap();
    served.stop.take().unwrap().send(()).unwrap();
    let answer = until_closed(&mut in_flight, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("slow\n"), "{answer}");
    tokio::time::timeout(Duration::from_secs(2), served.task)
        .await
        .expect("the listener stops once its connections are done")
        .unwrap();
    assert!(
        TcpStream::connect(served.addr).await.is_err(),
        "the listening socket is closed"
    );
}

#[tokio::test]
async fn a_request_slower_than_the_grace_is_cut() {
    let mut served = start(4, LONG, Duration::from_millis(300), LONG).await;
    let mut in_flight = request(served.addr, "/slow").await;
    served.started.recv().await.unwrap();
    let stopped = Instant::now();
    served.stop.take().unwrap().send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(3), served.task)
        .await
        .expect("the listener stops after the grace")
        .unwrap();
    let waited = stopped.elapsed();
    assert!(waited >= Duration::from_millis(250), "{waited:?}");
    assert_eq!(
        until_closed(&mut in_flight, Duration::from_secs(2)).await,
        ""
    );
}

#[tokio::test]
async fn every_connection_gets_no_delay_and_the_caller_serves_it() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let (stop, stopped) = oneshot::channel::<()>();
    let serving = Listener::new("test", 4, LONG, Arc::default());
    let task = tokio::spawn(serving.serve(
        listener,
        async move {
            let _ = stopped.await;
        },
        move |stream: TcpStream, peer, connection: weir_http::Connection| {
            let _ = seen_tx.send((stream.nodelay().unwrap(), peer));
            let service = hyper::service::service_fn(|_req| async {
                Ok::<_, std::convert::Infallible>(hyper::Response::new(http_body_util::Full::new(
                    bytes::Bytes::from_static(b"own\n"),
                )))
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            connection.run(conn)
        },
    ));
    let mut client = request(addr, "/").await;
    let answer = until_closed(&mut client, Duration::from_secs(2)).await;
    assert!(answer.ends_with("own\n"), "{answer}");
    let (nodelay, peer) = seen.recv().await.unwrap();
    assert!(nodelay, "TCP_NODELAY is set on an accepted connection");
    assert_eq!(peer, client.local_addr().unwrap());
    stop.send(()).unwrap();
    task.await.unwrap();
}
