//! The memcache door names its connections' leases: a lease taken with `get q/open`
//! is listed by the reader's `pending` with `memcache PEER_ADDR` as its holder, the
//! client's own address, so an operator can tell which client holds what.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure is a panic

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weir_backend::{Backend, Embedded};
use weir_memcache::{BoundListener, Limits, MemcacheDoor, MemcacheSettings};

/// Sends `request` and reads until the reply ends with `end`.
async fn ask(conn: &mut TcpStream, request: &[u8], end: &[u8]) -> Vec<u8> {
    conn.write_all(request).await.unwrap();
    let mut reply = Vec::new();
    let mut buf = [0u8; 1024];
    while !reply.ends_with(end) {
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf))
            .await
            .expect("a reply in time")
            .unwrap();
        assert!(
            n > 0,
            "the door closed: {:?}",
            String::from_utf8_lossy(&reply)
        );
        reply.extend_from_slice(&buf[..n]);
    }
    reply
}

#[tokio::test]
async fn a_connection_s_leases_name_its_address() {
    let dir = tempfile::tempdir().unwrap();
    let store = weir::Store::open(dir.path()).unwrap();
    let backend = Arc::new(Backend::Embedded(Embedded::new(store)));
    let listener = BoundListener::bind("127.0.0.1:0").await.unwrap();
    let settings = MemcacheSettings {
        listen: "127.0.0.1:0".to_string(),
        threads: 1,
        connections_max: 16,
        shutdown_grace_ms: 100,
        files_open_max: 256,
        limits: Limits {
            open_reads_max: 4,
            ..Limits::default()
        },
        http_listen: String::new(),
        data_dir: dir.path().to_path_buf(),
    };
    let door = MemcacheDoor::start(listener, Arc::clone(&backend), settings, None).unwrap();
    let mut a = TcpStream::connect(door.local_addr()).await.unwrap();
    let mut b = TcpStream::connect(door.local_addr()).await.unwrap();
    for item in ["1", "2", "3"] {
        let set = format!("set q 0 0 1\r\n{item}\r\n");
        assert_eq!(ask(&mut a, set.as_bytes(), b"\r\n").await, b"STORED\r\n");
    }
    ask(&mut a, b"get q/open\r\n", b"END\r\n").await;
    ask(&mut b, b"get q/open\r\n", b"END\r\n").await;
    ask(&mut a, b"get q/open\r\n", b"END\r\n").await;

    let q = backend.queue("q").await.unwrap();
    let listed = backend.reader(&q, "").await.unwrap().pending(10).await;
    let holders: Vec<(u64, Option<String>)> = listed
        .unwrap()
        .into_iter()
        .map(|p| (p.seq, p.holder.map(|h| h.to_string())))
        .collect();
    let name = |c: &TcpStream| Some(format!("memcache {}", c.local_addr().unwrap()));
    assert_eq!(holders, vec![(1, name(&a)), (2, name(&b)), (3, name(&a))]);
    drop((a, b));
    door.begin_shutdown();
    door.stopped().await;
}
