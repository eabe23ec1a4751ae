//! The JetStream backend against a real cluster.
//!
//! The cluster's URLs come from `WEIR_TEST_NATS_URLS` (comma-separated; e.g.
//! `scripts/nats-cluster start /tmp/js 24222` then
//! `WEIR_TEST_NATS_URLS=$(scripts/nats-cluster urls /tmp/js)`). Without it each test
//! says it is skipped and passes, unless `WEIR_SUITE_STRICT=1`, where it fails. Each
//! test has a stream and subject prefix of its own, deleted when the test ends
//! (failed or not).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

use std::error::Error as StdError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use weir::{AppendOptions, QueueConfig, StoreOptions, TakeMode};
use weir_backend::jetstream::{JetStream, JetStreamConfig, Queue, Reader};
use weir_backend::{Kind, Lease, Taken};

mod common;

type TestResult = std::result::Result<(), Box<dyn StdError>>;

/// A stream of the test's own on the cluster, deleted on drop.
struct Cluster {
    urls: Vec<String>,
    stream: String,
    prefix: String,
}

static NEXT: AtomicU64 = AtomicU64::new(0);

impl Cluster {
    /// The cluster, or None (the test is skipped) when none is configured.
    fn new(test: &str) -> Option<Cluster> {
        let urls = match std::env::var("WEIR_TEST_NATS_URLS") {
            Ok(urls) if !urls.trim().is_empty() => urls,
            // Built only with the `cluster-tests` feature, which asks for a cluster.
            _ => panic!(
                "{test}: WEIR_TEST_NATS_URLS is not set (scripts/nats-cluster start DIR; scripts/nats-cluster urls DIR)"
            ),
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let id = format!(
            "{:x}{:x}{}",
            std::process::id(),
            nanos,
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        Some(Cluster {
            urls: urls.split(',').map(|s| s.trim().to_owned()).collect(),
            stream: format!("WEIRT_{id}"),
            prefix: format!("weirt.{id}"),
        })
    }

    fn config(&self) -> JetStreamConfig {
        JetStreamConfig {
            servers: self.urls.clone(),
            stream: self.stream.clone(),
            subject_prefix: self.prefix.clone(),
            replicas: 3,
            lease_timeout_ms: 1500,
            unavailable_retry_ms: 5000,
            stats_cache_ms: 0,
            ..JetStreamConfig::default()
        }
    }

    async fn instance(&self) -> std::result::Result<JetStream, weir_backend::Error> {
        JetStream::connect(self.config(), StoreOptions::default()).await
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let urls = self.urls.clone();
        let subject = format!("$JS.API.STREAM.DELETE.{}", self.stream);
        let instances = format!("$JS.API.STREAM.DELETE.{}_DOORS", self.stream);
        let map = format!("$JS.API.STREAM.DELETE.{}_MAP_T", self.stream);
        // Off any test runtime: a runtime of its own, on a thread of its own.
        let deleted = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async move {
                let addrs: Vec<async_nats::ServerAddr> =
                    urls.iter().filter_map(|u| u.parse().ok()).collect();
                let client = async_nats::connect(addrs).await.ok()?;
                // The instances' stream (registrations, lease records) may not exist.
                let _ = client.request(instances, Bytes::new()).await;
                // So may the map of `a_shared_map_writes_compare_and_set`.
                let _ = client.request(map, Bytes::new()).await;
                client.request(subject, Bytes::new()).await.ok()
            })
        })
        .join();
        if !matches!(deleted, Ok(Some(_))) {
            eprintln!("could not delete stream {}", self.stream);
        }
    }
}

macro_rules! cluster {
    ($name:expr) => {
        match Cluster::new($name) {
            Some(c) => c,
            None => return Ok(()),
        }
    };
}

async fn set(q: &Queue, data: &str) -> std::result::Result<u64, weir_backend::Error> {
    q.append(
        Bytes::copy_from_slice(data.as_bytes()),
        AppendOptions::default(),
    )
    .await
}

async fn take(
    r: &Reader,
    mode: TakeMode,
) -> std::result::Result<Option<Taken>, weir_backend::Error> {
    r.take(mode, Duration::ZERO).await
}

fn data(t: &Option<Taken>) -> Option<String> {
    t.as_ref()
        .map(|t| String::from_utf8_lossy(&t.item.data).into_owned())
}

fn lease(
    t: &Option<Taken>,
) -> std::result::Result<weir_backend::jetstream::Lease, Box<dyn StdError>> {
    match t.as_ref().and_then(|t| t.lease.clone()) {
        Some(Lease::JetStream(l)) => Ok(l),
        _ => Err("no jetstream lease".into()),
    }
}

/// Compiled, never called: the futures the instance spawns must be `Send`.
#[allow(dead_code)]
fn futures_are_send(js: &JetStream, q: &Queue, r: &Reader, l: &weir_backend::jetstream::Lease) {
    fn send<T: Send>(_: T) {}
    send(JetStream::connect(
        JetStreamConfig::default(),
        StoreOptions::default(),
    ));
    send(js.queue("q"));
    send(js.reader(q, "r"));
    send(js.queue_for_readers("q", &["r"], false));
    send(js.delete_queue("q"));
    send(js.delete_reader("q", "r"));
    send(js.flush("q", None));
    send(js.flush_all(|_| false));
    send(js.stats(None));
    send(js.close());
    send(q.append(Bytes::new(), AppendOptions::default()));
    send(r.take(TakeMode::Take, Duration::ZERO));
    send(r.confirm(l));
}

#[tokio::test]
async fn set_and_take_in_order() -> TestResult {
    let c = cluster!("set_and_take_in_order");
    let js = c.instance().await?;
    let q = js.queue("orders").await?;
    let r = js.reader(&q, "").await?;
    let s1 = set(&q, "one").await?;
    let options = AppendOptions {
        flags: 7,
        ..AppendOptions::default()
    };
    let s2 = q.append(Bytes::from_static(b"two"), options).await?;
    assert!(s2 > s1);
    let first = take(&r, TakeMode::Take).await?;
    assert_eq!(data(&first), Some("one".into()));
    assert_eq!(first.as_ref().map(|t| t.item.seq), Some(s1));
    assert!(first
        .as_ref()
        .is_some_and(|t| t.lease.is_none() && t.item.enqueued_at_ms > 0));
    let second = take(&r, TakeMode::Take).await?;
    assert_eq!(
        second.as_ref().map(|t| (t.item.flags, t.item.seq)),
        Some((7, s2))
    );
    assert!(take(&r, TakeMode::Take).await?.is_none());
    assert_eq!(
        js.queue("bad.name").await.err().map(|e| e.kind()),
        Some(Kind::InvalidName)
    );
    assert!(js.existing_queue("orders")?.is_some());
    assert!(js.existing_queue("nope")?.is_none());
    js.close().await?;
    Ok(())
}

#[tokio::test]
async fn open_close_and_abort() -> TestResult {
    let c = cluster!("open_close_and_abort");
    let js = c.instance().await?;
    let q = js.queue("work").await?;
    let r = js.reader(&q, "").await?;
    for item in ["a", "b", "c"] {
        set(&q, item).await?;
    }
    let a = take(&r, TakeMode::Lease).await?;
    assert_eq!(data(&a), Some("a".into()));
    assert!(r.confirm(&lease(&a)?).await?);
    let b = take(&r, TakeMode::Lease).await?;
    assert_eq!(data(&b), Some("b".into()));
    assert!(r.release(&lease(&b)?)?);
    // Given back ahead of c.
    let again = r.take(TakeMode::Lease, Duration::from_secs(2)).await?;
    assert_eq!(data(&again), Some("b".into()));
    assert!(r.confirm(&lease(&again)?).await?);
    let last = take(&r, TakeMode::Take).await?;
    assert_eq!(data(&last), Some("c".into()));
    assert!(take(&r, TakeMode::Take).await?.is_none());
    js.close().await?;
    Ok(())
}

#[tokio::test]
async fn a_plain_take_is_confirmed() -> TestResult {
    let c = cluster!("a_plain_take_is_confirmed");
    let js = c.instance().await?;
    let q = js.queue("t").await?;
    let r = js.reader(&q, "").await?;
    set(&q, "x").await?;
    assert_eq!(data(&take(&r, TakeMode::Take).await?), Some("x".into()));
    // Past the lease timeout: nothing comes back.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    assert!(take(&r, TakeMode::Take).await?.is_none());
    let stats = js.stats(Some(vec!["t".into()])).await?;
    assert_eq!(
        stats.first().map(|s| (s.items, s.open_leases)),
        Some((0, 0))
    );
    js.close().await?;
    Ok(())
}

#[tokio::test]
async fn peek_does_not_take() -> TestResult {
    let c = cluster!("peek_does_not_take");
    let js = c.instance().await?;
    let q = js.queue("p").await?;
    let r = js.reader(&q, "").await?;
    assert!(take(&r, TakeMode::Peek).await?.is_none());
    let seq = q
        .append(
            Bytes::from_static(b"first"),
            AppendOptions {
                flags: 3,
                ..AppendOptions::default()
            },
        )
        .await?;
    set(&q, "second").await?;
    let peeked = take(&r, TakeMode::Peek).await?;
    assert_eq!(data(&peeked), Some("first".into()));
    assert_eq!(
        peeked.as_ref().map(|t| (t.item.seq, t.item.flags)),
        Some((seq, 3))
    );
    // A peek reads the stream, not a delivery: no lease, no enqueue time.
    assert!(peeked.as_ref().is_some_and(|t| t.lease.is_none()));
    assert_eq!(data(&take(&r, TakeMode::Peek).await?), Some("first".into()));
    assert_eq!(data(&take(&r, TakeMode::Take).await?), Some("first".into()));
    assert_eq!(
        data(&take(&r, TakeMode::Peek).await?),
        Some("second".into())
    );
    js.close().await?;
    Ok(())
}

#[tokio::test]
async fn waits_for_an_item_and_times_out() -> TestResult {
    let c = cluster!("waits_for_an_item_and_times_out");
    let js = c.instance().await?;
    let q = js.queue("w").await?;
    let r = js.reader(&q, "").await?;
    let started = Instant::now();
    assert!(r
        .take(TakeMode::Take, Duration::from_millis(500))
        .await?
        .is_none());
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(450), "{waited:?}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    let producer = {
        let q = q.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            set(&q, "late").await
        })
    };
    let started = Instant::now();
    let got = r.take(TakeMode::Lease, Duration::from_secs(5)).await?;
    assert_eq!(data(&got), Some("late".into()));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    producer.await??;
    assert!(r.confirm(&lease(&got)?).await?);
    // A wait dropped while waiting takes nothing: the item still comes.
    let dropped = tokio::time::timeout(
        Duration::from_millis(200),
        r.take(TakeMode::Take, Duration::from_secs(2)),
    );
    assert!(dropped.await.is_err());
    set(&q, "after").await?;
    let after = r.take(TakeMode::Take, Duration::from_secs(4)).await?;
    assert_eq!(data(&after), Some("after".into()));
    js.close().await?;
    Ok(())
}

#[tokio::test]
async fn two_readers_each_see_every_item() -> TestResult {
    let c = cluster!("two_readers_each_see_every_item");
    let js = c.instance().await?;
    let q = js.queue("fan").await?;
    let a = js.reader(&q, "a").await?;
    let b = js.reader(&q, "b").await?;
    assert_eq!((a.queue_name(), a.name()), ("fan", "a"));
    for item in ["1", "2", "3"] {
        set(&q, item).await?;
    }
    for reader in [&a, &b] {
        for want in ["1", "2", "3"] {
            assert_eq!(
                data(&take(reader, TakeMode::Take).await?),
                Some(want.into())
            );
        }
        assert!(take(reader, TakeMode::Take).await?.is_none());
    }
    // The default reader still has them all.
    let d = js.reader(&q, "").await?;
    assert_eq!(data(&take(&d, TakeMode::Take).await?), Some("1".into()));
    js.close().await?;
    Ok(())
}

/// A queue kept for its named readers (the proxy's capture queues): no default
/// reader's consumer, an item goes once each reader confirmed it, and stats list it.
#[tokio::test]
async fn a_queue_for_readers_keeps_items_for_them_only() -> TestResult {
    let c = cluster!("a_queue_for_readers_keeps_items_for_them_only");
    let js = c.instance().await?;
    assert_eq!(
        js.queue_for_readers("cap", &[], false)
            .await
            .err()
            .map(|e| e.kind()),
        Some(Kind::InvalidArgument)
    );
    assert_eq!(
        js.queue_for_readers("cap", &["a", ""], false)
            .await
            .err()
            .map(|e| e.kind()),
        Some(Kind::InvalidArgument)
    );
    let (q, readers) = js.queue_for_readers("cap", &["a", "b"], false).await?;
    assert_eq!(
        readers.iter().map(|r| r.name()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    for item in ["1", "2"] {
        set(&q, item).await?;
    }
    for reader in &readers {
        for want in ["1", "2"] {
            let t = reader.take(TakeMode::Lease, Duration::from_secs(2)).await?;
            assert_eq!(data(&t), Some(want.into()));
            assert!(reader.confirm(&lease(&t)?).await?);
        }
    }
    // Nothing else keeps them: the stream frees both a moment after the last ack.
    let addrs: Vec<async_nats::ServerAddr> = c.urls.iter().filter_map(|u| u.parse().ok()).collect();
    let client = async_nats::connect(addrs).await?;
    let mut left = u64::MAX;
    for _ in 0..60 {
        left = stream_messages(&client, &c.stream).await?;
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(left, 0, "items kept after every reader confirmed them");
    let stats = js.stats(Some(vec!["cap".into()])).await?;
    let names: Vec<&str> = stats
        .iter()
        .flat_map(|q| q.readers.iter().map(|r| r.name.as_str()))
        .collect();
    assert_eq!(names, ["a", "b"], "no default reader was made");
    // A plain `get` of it finds no default reader, and makes none; nor does naming
    // the default reader (a waiting `get`).
    assert!(js.existing_default_reader("cap").await?.is_none());
    assert_eq!(
        js.reader(&q, "").await.err().map(|e| e.kind()),
        Some(Kind::InvalidArgument)
    );
    // A second instance opening it again, with a third reader, finds the same readers
    // and their positions; the new one gets what is appended from then on.
    let other = c.instance().await?;
    let (q2, again) = other
        .queue_for_readers("cap", &["a", "b", "c"], false)
        .await?;
    set(&q2, "3").await?;
    for reader in &again {
        let t = reader.take(TakeMode::Take, Duration::from_secs(2)).await?;
        assert_eq!(data(&t), Some("3".into()), "reader {}", reader.name());
    }
    // `delete` empties it and keeps its readers: they are what keeps its next items.
    set(&q2, "4").await?;
    assert!(other.delete_queue("cap").await?);
    set(&q2, "5").await?;
    let t = again[0]
        .take(TakeMode::Take, Duration::from_secs(2))
        .await?;
    assert_eq!(data(&t), Some("5".into()));
    let stats = other.stats(Some(vec!["cap".into()])).await?;
    let names: Vec<&str> = stats
        .iter()
        .flat_map(|q| q.readers.iter().map(|r| r.name.as_str()))
        .collect();
    assert_eq!(
        names,
        ["a", "b", "c"],
        "delete keeps the readers, makes no default"
    );
    js.close().await?;
    other.close().await?;
    Ok(())
}

#[tokio::test]
async fn delete_queue_loses_no_acknowledged_item() -> TestResult {
    let c = cluster!("delete_queue_loses_no_acknowledged_item");
    let js = c.instance().await?;
    let other = c.instance().await?;
    let q = js.queue("d").await?;
    let stale = other.queue("d").await?;
    js.reader(&q, "r").await?;
    set(&q, "1").await?;
    set(&q, "2").await?;
    assert!(js.delete_queue("d").await?);
    assert!(!js.delete_queue("never").await?);
    let r = js.reader(&q, "").await?;
    assert!(take(&r, TakeMode::Take).await?.is_none());
    // The other instance's handle still works: its item is not lost. (A take that does
    // not wait can answer empty while the reader's leader catches up: docs/cluster.md.)
    set(&stale, "after").await?;
    let got = r.take(TakeMode::Take, Duration::from_secs(2)).await?;
    assert_eq!(data(&got), Some("after".into()));
    // The stream drops an acknowledged item a moment after the ack.
    let mut d = None;
    for _ in 0..40 {
        let stats = js.stats(None).await?;
        d = stats.into_iter().find(|s| s.name == "d");
        if d.as_ref().is_some_and(|d| d.items == 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let d = d.ok_or("queue d in stats")?;
    assert_eq!(d.items, 0);
    assert_eq!(
        d.readers
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        [""]
    );
    js.close().await?;
    other.close().await?;
    Ok(())
}

#[tokio::test]
async fn delete_reader() -> TestResult {
    let c = cluster!("delete_reader");
    let js = c.instance().await?;
    let q = js.queue("dr").await?;
    let r = js.reader(&q, "r").await?;
    set(&q, "x").await?;
    assert!(js.delete_reader("dr", "r").await?);
    assert!(!js.delete_reader("dr", "r").await?);
    assert_eq!(
        take(&r, TakeMode::Take).await.err().map(|e| e.kind()),
        Some(Kind::NotFound)
    );
    let d = js.reader(&q, "").await?;
    assert_eq!(data(&take(&d, TakeMode::Take).await?), Some("x".into()));
    // Named again, it is a new reader.
    let again = js.reader(&q, "r").await?;
    assert!(take(&again, TakeMode::Take).await?.is_none());
    assert_eq!(
        js.delete_reader("dr", "").await.err().map(|e| e.kind()),
        Some(Kind::InvalidArgument)
    );
    js.close().await?;
    Ok(())
}

#[tokio::test]
async fn flushes() -> TestResult {
    let c = cluster!("flushes");
    let js = c.instance().await?;
    let q = js.queue("f").await?;
    let other = js.queue("g").await?;
    let d = js.reader(&q, "").await?;
    let r = js.reader(&q, "r").await?;
    set(&q, "1").await?;
    set(&q, "2").await?;
    // The count is the consumer leader's view, which may trail the stream a moment.
    assert!((1..=2).contains(&js.flush("f", Some("r")).await?));
    assert!(take(&r, TakeMode::Take).await?.is_none());
    assert_eq!(data(&take(&d, TakeMode::Peek).await?), Some("1".into()));
    set(&q, "3").await?;
    assert_eq!(data(&take(&r, TakeMode::Take).await?), Some("3".into()));
    assert_eq!(js.flush("f", Some("nobody")).await?, 0);
    assert_eq!(js.flush("f", None).await?, 3);
    assert!(take(&d, TakeMode::Take).await?.is_none());
    set(&q, "4").await?;
    set(&other, "5").await?;
    js.flush_all(|_| false).await?;
    assert!(take(&d, TakeMode::Take).await?.is_none());
    let g = js.reader(&other, "").await?;
    assert!(take(&g, TakeMode::Take).await?.is_none());
    set(&q, "6").await?;
    assert_eq!(data(&take(&d, TakeMode::Take).await?), Some("6".into()));
    assert_eq!(js.expire(None).await?, 0);
    js.close().await?;
    Ok(())
}

#[tokio::test]
async fn expired_items_are_not_delivered() -> TestResult {
    let c = cluster!("expired_items_are_not_delivered");
    let js = c.instance().await?;
    let q = js.queue("e").await?;
    let r = js.reader(&q, "").await?;
    let now = weir::Clock::system().now_ms();
    let past = AppendOptions {
        expires_at_ms: now - 1,
        ..AppendOptions::default()
    };
    assert_eq!(q.append(Bytes::from_static(b"old"), past).await?, 0);
    assert!(take(&r, TakeMode::Take).await?.is_none());
    let soon = AppendOptions {
        expires_at_ms: now + 1000,
        ..AppendOptions::default()
    };
    q.append(Bytes::from_static(b"soon"), soon).await?;
    set(&q, "stays").await?;
    assert_eq!(data(&take(&r, TakeMode::Peek).await?), Some("soon".into()));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(data(&take(&r, TakeMode::Peek).await?), Some("stays".into()));
    let got = take(&r, TakeMode::Take).await?;
    assert_eq!(data(&got), Some("stays".into()));
    let stats = js.stats(Some(vec!["e".into()])).await?;
    let e = stats.first().ok_or("stats of e")?;
    // The server's TTL may have deleted "soon" before the take skipped it.
    assert_eq!(e.total_items, 3);
    assert!(e.expired <= 1);
    js.close().await?;
    Ok(())
}

#[tokio::test]
async fn too_large_items_are_refused() -> TestResult {
    let c = cluster!("too_large_items_are_refused");
    let options = StoreOptions {
        defaults: QueueConfig {
            max_item_size_bytes: 100,
            ..QueueConfig::default()
        },
        ..StoreOptions::default()
    };
    let js = JetStream::connect(c.config(), options).await?;
    let q = js.queue("big").await?;
    let refused = q
        .append(Bytes::from(vec![b'x'; 101]), AppendOptions::default())
        .await;
    assert_eq!(refused.err().map(|e| e.kind()), Some(Kind::TooLarge));
    assert!(
        q.append(Bytes::from(vec![b'x'; 100]), AppendOptions::default())
            .await?
            > 0
    );
    // Past the server's max_payload (1 MiB by default; scripts/nats-cluster sets 8 MB).
    let unlimited = StoreOptions {
        defaults: QueueConfig {
            max_item_size_bytes: u64::MAX,
            ..QueueConfig::default()
        },
        ..StoreOptions::default()
    };
    js.set_options(unlimited)?;
    let huge = q
        .append(Bytes::from(vec![b'x'; 9 << 20]), AppendOptions::default())
        .await;
    assert_eq!(huge.err().map(|e| e.kind()), Some(Kind::TooLarge));
    js.close().await?;
    Ok(())
}

#[tokio::test]
async fn stats_fields() -> TestResult {
    let c = cluster!("stats_fields");
    let js = c.instance().await?;
    let q = js.queue("s").await?;
    js.queue("a-first").await?;
    let d = js.reader(&q, "").await?;
    let r = js.reader(&q, "r").await?;
    for item in ["1", "2", "3"] {
        set(&q, item).await?;
    }
    take(&d, TakeMode::Take).await?;
    let leased = take(&d, TakeMode::Lease).await?;
    let stats = js.stats(None).await?;
    assert_eq!(
        stats.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["a-first", "s"]
    );
    let s = &stats[1];
    assert_eq!(
        (s.items, s.total_items, s.open_leases, s.bytes),
        (3, 3, 1, 0)
    );
    let names: Vec<&str> = s.readers.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["", "r"]);
    let default = &s.readers[0];
    assert_eq!(
        (
            default.items,
            default.taken,
            default.confirmed,
            default.open_leases
        ),
        (2, 2, 1, 1)
    );
    // A consumer's pending count may trail the stream for a moment.
    let mut pending = s.readers[1].items;
    for _ in 0..40 {
        if pending == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let again = js.stats(Some(vec!["s".into()])).await?;
        pending = again
            .first()
            .and_then(|q| q.readers.get(1))
            .map_or(0, |r| r.items);
    }
    assert_eq!((pending, s.readers[1].taken), (3, 0));
    assert!(d.confirm(&lease(&leased)?).await?);
    take(&r, TakeMode::Take).await?;
    // The stream removes a message every reader acknowledged a moment after the ack.
    let mut only = js.stats(Some(vec!["s".into(), "nope".into()])).await?;
    for _ in 0..40 {
        if only
            .first()
            .is_some_and(|q| (q.items, q.open_leases) == (2, 0))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        only = js.stats(Some(vec!["s".into(), "nope".into()])).await?;
    }
    assert_eq!(only.len(), 1);
    assert_eq!((only[0].items, only[0].open_leases), (2, 0));
    let mut metrics = String::new();
    js.render_metrics(&mut metrics);
    assert!(metrics.contains("weir_backend_up 1"), "{metrics}");
    assert!(metrics.contains("weir_backend_requests_total{op=\"append\",result=\"ok\"} 3"));
    assert!(js
        .settings()
        .iter()
        .any(|(k, v)| *k == "backend_stream" && *v == c.stream));
    js.close().await?;
    Ok(())
}

#[tokio::test]
async fn a_second_instance_shares_the_queues() -> TestResult {
    let c = cluster!("a_second_instance_shares_the_queues");
    let a = c.instance().await?;
    let qa = a.queue("shared").await?;
    set(&qa, "from a").await?;
    let b = c.instance().await?;
    // Learnt at connect from the stream's consumers, however young: the stream keeps
    // what b appends to it whatever its replicas did (no proof needed).
    assert!(b.existing_queue("shared")?.is_some());
    let listed = b.stats(None).await?;
    assert!(listed.iter().any(|q| q.name == "shared"));
    let qb = b.queue("shared").await?;
    let rb = b.reader(&qb, "").await?;
    // Another instance's write reaches a reader's consumer a moment after its PubAck
    // (replication); an instance reads only its own writes at once. So: a short wait.
    let wait = Duration::from_secs(2);
    assert_eq!(
        data(&rb.take(TakeMode::Take, wait).await?),
        Some("from a".into())
    );
    set(&qb, "from b").await?;
    let ra = a.reader(&qa, "").await?;
    assert_eq!(
        data(&ra.take(TakeMode::Take, wait).await?),
        Some("from b".into())
    );
    a.close().await?;
    b.close().await?;
    Ok(())
}

/// The stream keeps every item until a sweep removes what every reader of its queue
/// confirmed: an item one reader still holds (or has yet to take) stays, whatever the
/// others confirmed, and goes once the last reader confirms it. `stats` counts what
/// the most-behind reader has yet to confirm at once, not at the sweep.
#[tokio::test]
async fn a_sweep_keeps_what_any_reader_still_needs() -> TestResult {
    let c = cluster!("a_sweep_keeps_what_any_reader_still_needs");
    let js = c.instance().await?;
    let q = js.queue("sw").await?;
    let d = js.reader(&q, "").await?;
    let b = js.reader(&q, "b").await?;
    for item in ["1", "2", "3", "4"] {
        set(&q, item).await?;
    }
    for want in ["1", "2", "3", "4"] {
        assert_eq!(data(&take(&d, TakeMode::Take).await?), Some(want.into()));
    }
    // b holds 1 and confirms 2 out of order: its ack floor stays below 1.
    let l1 = b.take(TakeMode::Lease, Duration::from_secs(2)).await?;
    let l2 = b.take(TakeMode::Lease, Duration::from_secs(2)).await?;
    assert_eq!((data(&l1), data(&l2)), (Some("1".into()), Some("2".into())));
    assert!(b.confirm(&lease(&l2)?).await?);
    let stats = js.stats(Some(vec!["sw".into()])).await?;
    assert_eq!(
        stats.first().map(|s| s.items),
        Some(3),
        "1 leased, 3 and 4 pending for b"
    );
    let addrs: Vec<async_nats::ServerAddr> = c.urls.iter().filter_map(|u| u.parse().ok()).collect();
    let client = async_nats::connect(addrs).await?;
    // Several sweeps (one a second) later, nothing b needs went.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(stream_messages(&client, &c.stream).await?, 4, "1 is b's");
    assert!(b.release(&lease(&l1)?)?);
    for want in ["1", "3", "4"] {
        let t = b.take(TakeMode::Take, Duration::from_secs(2)).await?;
        assert_eq!(data(&t), Some(want.into()));
    }
    // Confirmed by both readers: swept away.
    let until = Instant::now() + Duration::from_secs(5);
    while stream_messages(&client, &c.stream).await? != 0 {
        assert!(Instant::now() < until, "confirmed items stay in the stream");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats = js.stats(Some(vec!["sw".into()])).await?;
    assert_eq!(stats.first().map(|s| s.items), Some(0));
    js.close().await?;
    Ok(())
}

#[tokio::test]
async fn a_released_lease_comes_back_at_once() -> TestResult {
    let c = cluster!("a_released_lease_comes_back_at_once");
    let a = c.instance().await?;
    let b = c.instance().await?;
    let qa = a.queue("rel").await?;
    let ra = a.reader(&qa, "").await?;
    set(&qa, "held").await?;
    let held = take(&ra, TakeMode::Lease).await?;
    // The connection ends: its leases go back, then the instance goes.
    assert!(ra.release(&lease(&held)?)?);
    a.close().await?;
    let qb = b.queue("rel").await?;
    let rb = b.reader(&qb, "").await?;
    let started = Instant::now();
    let got = rb.take(TakeMode::Take, Duration::from_secs(1)).await?;
    assert_eq!(data(&got), Some("held".into()));
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    b.close().await?;
    Ok(())
}

#[tokio::test]
async fn leases_live_while_held_and_come_back_after_their_instance_died() -> TestResult {
    let c = cluster!("leases_live_while_held_and_come_back_after_their_instance_died");
    let a = c.instance().await?;
    let b = c.instance().await?;
    let qa = a.queue("ka").await?;
    let ra = a.reader(&qa, "").await?;
    set(&qa, "kept").await?;
    let held = take(&ra, TakeMode::Lease).await?;
    assert!(held.is_some());
    let qb = b.queue("ka").await?;
    let rb = b.reader(&qb, "").await?;
    // Kept alive past the 1.5 s lease timeout.
    assert!(rb
        .take(TakeMode::Take, Duration::from_millis(2500))
        .await?
        .is_none());
    // The instance vanishes without releasing (no close, no release).
    drop(ra);
    drop(qa);
    drop(a);
    let started = Instant::now();
    let got = rb.take(TakeMode::Take, Duration::from_secs(5)).await?;
    assert_eq!(data(&got), Some("kept".into()));
    assert!(
        started.elapsed() < Duration::from_millis(3500),
        "{:?}",
        started.elapsed()
    );
    b.close().await?;
    Ok(())
}

#[tokio::test]
async fn a_killed_instances_leases_come_back_at_once() -> TestResult {
    let c = cluster!("a_killed_instances_leases_come_back_at_once");
    // A lease timeout far longer than the wait below: only the other instance's -NAK
    // can bring the item back in time.
    let config = JetStreamConfig {
        lease_timeout_ms: 30_000,
        instance_timeout_ms: 500,
        ..c.config()
    };
    let a = JetStream::connect(config.clone(), StoreOptions::default()).await?;
    let b = JetStream::connect(config, StoreOptions::default()).await?;
    let qa = a.queue("kd").await?;
    let ra = a.reader(&qa, "").await?;
    for i in 0..14 {
        set(&qa, &format!("i{i:02}")).await?;
    }
    // Both instances registered, and each has seen the other answer a ping (an instance lists
    // the others every 4 rounds of 125 ms here).
    let addrs: Vec<async_nats::ServerAddr> = c.urls.iter().filter_map(|u| u.parse().ok()).collect();
    let client = async_nats::connect(addrs).await?;
    let until = Instant::now() + Duration::from_secs(10);
    while instance_registrations(&client, &c.stream).await?.len() < 2 {
        assert!(Instant::now() < until, "the instances did not register");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // Four leases one at a time (a record each), eight at once (they share records:
    // the leases recorded while a record is being written go in the next one).
    let mut held = Vec::new();
    for i in 0..4 {
        let t = take(&ra, TakeMode::Lease).await?;
        assert_eq!(data(&t), Some(format!("i{i:02}")));
        held.push(t);
    }
    let at_once = (4..12).map(|_| take(&ra, TakeMode::Lease));
    for t in futures_util::future::join_all(at_once).await {
        held.push(t?);
    }
    let mut items: Vec<Option<String>> = held.iter().map(data).collect();
    items.sort();
    let expected: Vec<Option<String>> = (0..12).map(|i| Some(format!("i{i:02}"))).collect();
    assert_eq!(items, expected);
    let records = lease_records(&client, &c.stream).await?;
    eprintln!("12 leases, {records} records");
    // Those taken at once shared records (one write in flight, the rest gather).
    assert!((1..12).contains(&records), "{records} records");
    let holding = |item: &str| -> std::result::Result<_, Box<dyn StdError>> {
        let t = held.iter().find(|t| data(t).as_deref() == Some(item));
        lease(t.ok_or("a lease")?)
    };
    // One of those taken at once is released: its line leaves its record, so the
    // give-back below does not take it back from instance b, which holds it next.
    assert!(ra.release(&holding("i07")?)?);
    let qb = b.queue("kd").await?;
    let rb = b.reader(&qb, "").await?;
    let again = rb.take(TakeMode::Lease, Duration::from_secs(5)).await?;
    assert_eq!(data(&again), Some("i07".to_owned()));
    // Leases end as a client would end them: confirmed, never to come back; one
    // alone in its record (tombstoned), one in a record with other open leases
    // (its line stays: the give-back's -NAK of it finds it no longer pending).
    assert!(ra.confirm(&holding("i00")?).await?);
    let stored = stored_lease_seqs(&client, &c.stream).await?;
    let shared = (4..12)
        .filter(|i| *i != 7)
        .map(|i| format!("i{i:02}"))
        .find(|item| {
            holding(item).is_ok_and(|l| {
                stored
                    .iter()
                    .any(|seqs| seqs.len() >= 2 && seqs.contains(&l.seq()))
            })
        })
        .ok_or("no lease shares a record")?;
    let confirmed = holding(&shared)?;
    assert!(ra.confirm(&confirmed).await?);
    let stored = stored_lease_seqs(&client, &c.stream).await?;
    assert!(
        stored.iter().any(|seqs| seqs.contains(&confirmed.seq())),
        "a confirmed lease's line stays in its shared record"
    );
    for i in 12..14 {
        assert_eq!(
            data(&take(&rb, TakeMode::Take).await?),
            Some(format!("i{i:02}"))
        );
    }
    assert!(take(&rb, TakeMode::Take).await?.is_none());
    // Instance a is killed: no close, no release; its runtime and connection just end.
    drop(held);
    drop(ra);
    drop(qa);
    drop(a);
    let started = Instant::now();
    // Back at once, and in their queue's order (given back one after the other).
    for item in (1..12)
        .map(|i| format!("i{i:02}"))
        .filter(|item| *item != shared && item != "i07")
    {
        let got = rb.take(TakeMode::Take, Duration::from_secs(10)).await?;
        assert_eq!(data(&got), Some(item));
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "back after {:?}",
        started.elapsed()
    );
    // Neither the confirmed items nor the released one (still instance b's) comes back.
    assert!(rb
        .take(TakeMode::Take, Duration::from_millis(1500))
        .await?
        .is_none());
    assert!(rb.confirm(&lease(&again)?).await?);
    b.close().await?;
    Ok(())
}

/// The stream sequences of the leases each stored lease record lists.
async fn stored_lease_seqs(
    client: &async_nats::Client,
    stream: &str,
) -> std::result::Result<Vec<Vec<u64>>, Box<dyn StdError>> {
    let body = format!(r#"{{"subjects_filter":"_weir.{stream}.rec.lease.>"}}"#);
    let info = client
        .request(format!("$JS.API.STREAM.INFO.{stream}_DOORS"), body.into())
        .await?;
    let info: serde_json::Value = serde_json::from_slice(&info.payload)?;
    let subjects: Vec<String> = info["state"]["subjects"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    let mut records = Vec::new();
    for subject in subjects {
        let query = format!(r#"{{"last_by_subj":"{subject}"}}"#);
        let got = client
            .request(format!("$JS.API.DIRECT.GET.{stream}_DOORS"), query.into())
            .await?;
        let text = String::from_utf8_lossy(&got.payload).into_owned();
        let seqs = text
            .lines()
            .filter_map(|line| {
                let reply = line.split(' ').next()?;
                let tokens: Vec<&str> = reply.split('.').collect();
                let at = if tokens.len() == 9 { 5 } else { 7 };
                tokens.get(at)?.parse().ok()
            })
            .collect();
        records.push(seqs);
    }
    Ok(records)
}

/// How many lease records the instances' stream holds (`_weir.<stream>.rec.lease.>`).
async fn lease_records(
    client: &async_nats::Client,
    stream: &str,
) -> std::result::Result<usize, Box<dyn StdError>> {
    let body = format!(r#"{{"subjects_filter":"_weir.{stream}.rec.lease.>"}}"#);
    let info = client
        .request(format!("$JS.API.STREAM.INFO.{stream}_DOORS"), body.into())
        .await?;
    let info: serde_json::Value = serde_json::from_slice(&info.payload)?;
    Ok(info["state"]["subjects"]
        .as_object()
        .map_or(0, serde_json::Map::len))
}

/// The instances registered on the test's stream (`_weir.<stream>.rec.door.<key>`).
async fn instance_registrations(
    client: &async_nats::Client,
    stream: &str,
) -> std::result::Result<Vec<String>, Box<dyn StdError>> {
    let body = format!(r#"{{"subjects_filter":"_weir.{stream}.rec.door.>"}}"#);
    let info = client
        .request(format!("$JS.API.STREAM.INFO.{stream}_DOORS"), body.into())
        .await?;
    let info: serde_json::Value = serde_json::from_slice(&info.payload)?;
    let subjects = info["state"]["subjects"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    Ok(subjects)
}

/// `state.messages` of the test's stream.
async fn stream_messages(
    client: &async_nats::Client,
    stream: &str,
) -> std::result::Result<u64, Box<dyn StdError>> {
    let info = client
        .request(format!("$JS.API.STREAM.INFO.{stream}"), "".into())
        .await?;
    let info: serde_json::Value = serde_json::from_slice(&info.payload)?;
    info["state"]["messages"]
        .as_u64()
        .ok_or_else(|| format!("no state.messages in {info}").into())
}

/// The consumer `~interest` that builds of 2026-11-26 added (every queue's subject,
/// starting at 2^62) can make a replica purge its copy of the stream; an instance deletes
/// it when it sets the stream up, and the stream then keeps and frees items as usual.
#[tokio::test]
async fn a_leftover_interest_keeper_is_deleted() -> TestResult {
    let c = cluster!("a_leftover_interest_keeper_is_deleted");
    let a = c.instance().await?;
    a.queue("kept").await?;
    let addrs: Vec<async_nats::ServerAddr> = c.urls.iter().filter_map(|u| u.parse().ok()).collect();
    let client = async_nats::connect(addrs).await?;
    let keeper = serde_json::json!({
        "stream_name": c.stream,
        "action": "create",
        "config": {
            "name": "~interest", "durable_name": "~interest",
            "filter_subject": format!("{}.>", c.prefix),
            "ack_policy": "explicit", "deliver_policy": "by_start_sequence",
            "opt_start_seq": 1u64 << 62, "max_deliver": -1,
        },
    });
    let subject = format!("$JS.API.CONSUMER.CREATE.{}.~interest", c.stream);
    let created = client.request(subject, keeper.to_string().into()).await?;
    assert!(
        !String::from_utf8_lossy(&created.payload).contains("\"error\""),
        "{:?}",
        created.payload
    );
    let names = || async {
        let names = client
            .request(format!("$JS.API.CONSUMER.NAMES.{}", c.stream), "".into())
            .await?;
        Ok::<_, Box<dyn StdError>>(String::from_utf8_lossy(&names.payload).into_owned())
    };
    assert!(names().await?.contains("\"~interest\""));
    // A second instance sets the stream up: the keeper goes, the readers stay.
    let b = c.instance().await?;
    let q = b.queue("kept").await?;
    let listed = names().await?;
    assert!(!listed.contains("\"~interest\""), "{listed}");
    assert!(listed.contains("\"kept~\""), "{listed}");
    let r = b.reader(&q, "").await?;
    set(&q, "k0").await?;
    assert_eq!(
        data(&take(&r, TakeMode::Take).await?),
        Some("k0".to_owned())
    );
    // Confirmed by its only reader: freed (a Raft round after the ack).
    let until = Instant::now() + Duration::from_secs(5);
    while stream_messages(&client, &c.stream).await? != 0 {
        assert!(
            Instant::now() < until,
            "a confirmed item stays in the stream"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.close().await?;
    b.close().await?;
    Ok(())
}

#[tokio::test]
async fn an_instance_taken_for_dead_gives_nothing_back_twice() -> TestResult {
    let c = cluster!("an_instance_taken_for_dead_gives_nothing_back_twice");
    let config = JetStreamConfig {
        instance_timeout_ms: 300,
        lease_timeout_ms: 4000,
        ..c.config()
    };
    let a = JetStream::connect(config, StoreOptions::default()).await?;
    let qa = a.queue("cut").await?;
    let ra = a.reader(&qa, "").await?;
    set(&qa, "x").await?;
    let lease = match take(&ra, TakeMode::Lease).await? {
        Some(Taken {
            lease: Some(lease), ..
        }) => lease,
        other => return Err(format!("a lease, not {other:?}").into()),
    };
    // Another instance took this one for dead while it was cut off, and gave its leases
    // back (here: the mark only, as the winning instance writes it).
    let addrs: Vec<async_nats::ServerAddr> = c.urls.iter().filter_map(|u| u.parse().ok()).collect();
    let client = async_nats::connect(addrs).await?;
    let until = Instant::now() + Duration::from_secs(10);
    let registered = loop {
        let registered = instance_registrations(&client, &c.stream).await?;
        if !registered.is_empty() || Instant::now() > until {
            break registered;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(registered.len(), 1, "{registered:?}");
    let ack = client
        .request(registered[0].clone(), "dead by-the-test 0".into())
        .await?;
    assert!(!String::from_utf8_lossy(&ack.payload).contains("error"));
    // The instance sees the mark, registers again under a new key, and lets go of what
    // it held: the release sends no -NAK (the item may be another client's now).
    let until = Instant::now() + Duration::from_secs(5);
    while instance_registrations(&client, &c.stream).await?.len() < 2 {
        assert!(
            Instant::now() < until,
            "the instance did not register again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ra.release(lease_of(&lease)?)?);
    assert!(ra
        .take(TakeMode::Take, Duration::from_millis(300))
        .await?
        .is_none());
    // Nor is it renewed: it comes back after the lease timeout (4 s), once.
    let got = ra.take(TakeMode::Take, Duration::from_secs(10)).await?;
    assert_eq!(data(&got), Some("x".into()));
    assert!(ra
        .take(TakeMode::Take, Duration::from_millis(300))
        .await?
        .is_none());
    a.close().await?;
    Ok(())
}

fn lease_of(
    lease: &Lease,
) -> std::result::Result<&weir_backend::jetstream::Lease, Box<dyn StdError>> {
    match lease {
        Lease::JetStream(lease) => Ok(lease),
        _ => Err("a JetStream lease".into()),
    }
}

#[tokio::test]
async fn unreachable_cluster_is_unavailable_not_a_hang() -> TestResult {
    let c = cluster!("unreachable_cluster_is_unavailable_not_a_hang");
    let config = JetStreamConfig {
        servers: vec!["nats://127.0.0.1:1".into()],
        unavailable_retry_ms: 1000,
        request_timeout_ms: 500,
        ..c.config()
    };
    let started = Instant::now();
    let js = JetStream::connect(config, StoreOptions::default()).await?;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let started = Instant::now();
    let e = js.queue("q").await.err().ok_or("an error")?;
    assert_eq!(e.kind(), Kind::Unavailable, "{e}");
    assert!(e.to_string().starts_with("backend unavailable"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let started = Instant::now();
    assert_eq!(
        js.stats(None).await.err().map(|e| e.kind()),
        Some(Kind::Unavailable)
    );
    assert_eq!(
        js.flush_all(|_| false).await.err().map(|e| e.kind()),
        Some(Kind::Unavailable)
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let mut metrics = String::new();
    js.render_metrics(&mut metrics);
    assert!(metrics.contains("weir_backend_up 0"));
    js.close().await?;
    Ok(())
}

/// Throughput of append, then lease + confirm, then plain takes, from 10 and 100 tasks
/// on one instance; the lease figure with the instances' lease records (the default) and
/// without (`instance_timeout_ms = 0`), which is what a record costs.
/// `cargo test -p weir-backend --release --test jetstream -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn throughput() -> TestResult {
    let c = cluster!("throughput");
    for instance_timeout_ms in [1000, 0] {
        let config = JetStreamConfig {
            instance_timeout_ms,
            ..c.config()
        };
        let js = JetStream::connect(config, StoreOptions::default()).await?;
        for tasks in [10usize, 100] {
            let q = js
                .queue(&format!("bench{tasks}d{instance_timeout_ms}"))
                .await?;
            let r = js.reader(&q, "").await?;
            let appended = append_rate(&q, tasks, 3000).await?;
            let leased = take_rate(&r, tasks, TakeMode::Lease).await?;
            append_rate(&q, tasks, 3000).await?;
            let taken = take_rate(&r, tasks, TakeMode::Take).await?;
            eprintln!(
                "instance_timeout_ms {instance_timeout_ms}, {tasks} tasks: append {appended:.0}/s; lease+confirm {leased:.0}/s; take {taken:.0}/s"
            );
        }
        js.close().await?;
    }
    no_wait_pulls(&c).await?;
    Ok(())
}

/// Appends `n` items from `tasks` tasks: items per second.
async fn append_rate(
    q: &Queue,
    tasks: usize,
    n: usize,
) -> std::result::Result<f64, Box<dyn StdError>> {
    let per_task = n / tasks;
    let started = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let q = q.clone();
        handles.push(tokio::spawn(async move {
            for _ in 0..per_task {
                q.append(Bytes::from_static(&[b'x'; 64]), AppendOptions::default())
                    .await?;
            }
            Ok::<_, weir_backend::Error>(())
        }));
    }
    for h in handles {
        h.await??;
    }
    Ok((per_task * tasks) as f64 / started.elapsed().as_secs_f64())
}

/// Empties the queue from `tasks` tasks, leasing and confirming or taking: items per
/// second.
async fn take_rate(
    r: &Reader,
    tasks: usize,
    mode: TakeMode,
) -> std::result::Result<f64, Box<dyn StdError>> {
    let started = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let r = r.clone();
        handles.push(tokio::spawn(async move {
            let mut n = 0u64;
            while let Some(t) = r.take(mode, Duration::ZERO).await? {
                if let Some(Lease::JetStream(l)) = t.lease {
                    r.confirm(&l).await?;
                }
                n += 1;
            }
            Ok::<_, weir_backend::Error>(n)
        }));
    }
    let mut taken = 0;
    for h in handles {
        taken += h.await??;
    }
    Ok(taken as f64 / started.elapsed().as_secs_f64())
}

/// An empty queue's no-wait pull, three ways: a request with its own inbox (what the
/// backend does), through the shared reply subscription, and async-nats' `fetch()`.
async fn no_wait_pulls(c: &Cluster) -> TestResult {
    use futures_util::StreamExt;
    let js = c.instance().await?;
    js.queue("nowait").await?;
    let addrs: Vec<async_nats::ServerAddr> = c.urls.iter().filter_map(|u| u.parse().ok()).collect();
    let client = async_nats::connect(addrs).await?;
    let subject = format!("$JS.API.CONSUMER.MSG.NEXT.{}.nowait~", c.stream);
    let body = r#"{"batch":1,"no_wait":true}"#;
    let n = 500;
    for own_inbox in [true, false] {
        let started = Instant::now();
        for _ in 0..n {
            let mut request = async_nats::Request::new().payload(body.into());
            if own_inbox {
                request = request.inbox(client.new_inbox());
            }
            let _ = client.send_request(subject.clone(), request).await;
        }
        let per = started.elapsed() / n;
        eprintln!(
            "no-wait pull, {}: {per:?} each",
            if own_inbox {
                "own inbox"
            } else {
                "shared inbox"
            }
        );
    }
    let ctx = async_nats::jetstream::new(client);
    let stream = ctx.get_stream(&c.stream).await?;
    let consumer: async_nats::jetstream::consumer::PullConsumer = stream
        .get_consumer("nowait~")
        .await
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    for _ in 0..n {
        let mut batch = consumer
            .fetch()
            .max_messages(1)
            .messages()
            .await
            .map_err(|e| e.to_string())?;
        while batch.next().await.is_some() {}
    }
    eprintln!("no-wait pull, fetch(): {:?} each", started.elapsed() / n);
    js.close().await?;
    Ok(())
}

/// Every item's data in a walk, page by page (pages of 2, so a walk spans several).
async fn scanned(
    js: &JetStream,
    queue: &str,
    from: weir_backend::ScanFrom,
) -> std::result::Result<Vec<(u64, String)>, weir_backend::Error> {
    let mut scan = js.scan(queue, from).await?;
    let mut got = Vec::new();
    loop {
        let page = scan.next_page(2).await?;
        if page.is_empty() {
            return Ok(got);
        }
        assert!(page.len() <= 2);
        got.extend(page.into_iter().map(|i| {
            (
                i.enqueued_at_ms,
                String::from_utf8_lossy(&i.data).into_owned(),
            )
        }));
    }
}

/// A scan walks what a queue keeps (what some reader has not confirmed), from its
/// oldest item or from a time, without consuming it; it ends where the queue ended
/// when it began; a queue with no item gives an empty walk.
#[tokio::test]
async fn a_scan_walks_what_a_queue_keeps_without_consuming() -> TestResult {
    use weir_backend::ScanFrom;
    let c = cluster!("a_scan_walks_what_a_queue_keeps_without_consuming");
    let js = c.instance().await?;
    let q = js.queue("walk").await?;
    let d = js.reader(&q, "").await?;
    for item in ["1", "2", "3"] {
        set(&q, item).await?;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let middle_ms = now_ms();
    tokio::time::sleep(Duration::from_millis(50)).await;
    for item in ["4", "5"] {
        set(&q, item).await?;
    }
    // "1" is confirmed by the only reader: gone from the stream, once the replica
    // that answers has applied the confirm (any replica answers a Direct Get).
    assert_eq!(data(&take(&d, TakeMode::Take).await?), Some("1".into()));
    let deadline = Instant::now() + Duration::from_secs(5);
    let all = loop {
        let all = scanned(&js, "walk", ScanFrom::Oldest).await?;
        if all.len() == 4 || Instant::now() > deadline {
            break all;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let texts: Vec<&str> = all.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(texts, ["2", "3", "4", "5"]);
    assert!(
        all.iter().all(|(at, _)| at.abs_diff(now_ms()) < 60_000),
        "{all:?}"
    );
    let later = scanned(&js, "walk", ScanFrom::Time(middle_ms)).await?;
    let texts: Vec<&str> = later.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(texts, ["4", "5"]);
    // Nothing was consumed: the reader takes "2" next.
    assert_eq!(data(&take(&d, TakeMode::Take).await?), Some("2".into()));
    // A walk ends where the queue ended when it began ("2", just confirmed, may
    // still show on a replica behind).
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut before = 0;
    let seen = loop {
        let mut scan = js.scan("walk", ScanFrom::Oldest).await?;
        set(&q, "more").await?;
        before += 1;
        let mut seen = Vec::new();
        loop {
            let page = scan.next_page(10).await?;
            if page.is_empty() {
                break;
            }
            seen.extend(page.into_iter().map(|i| i.data));
        }
        if seen.first().map(|d| &d[..]) != Some(b"2") || Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(seen[..3], [&b"3"[..], b"4", b"5"]);
    assert!(seen[3..].iter().all(|d| &d[..] == b"more"), "{seen:?}");
    // The last walk began with `before - 1` of them appended; the one appended after
    // it began is not in it.
    assert!(seen.len() - 3 < before, "{} of {before}", seen.len() - 3);
    assert!(scanned(&js, "nothing-here", ScanFrom::Oldest)
        .await?
        .is_empty());
    assert_eq!(
        js.scan("bad/name", ScanFrom::Oldest)
            .await
            .err()
            .map(|e| e.kind()),
        Some(Kind::InvalidName)
    );
    js.close().await?;
    Ok(())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A reader made at the end (a shadow added to a recording route) gets only what is
/// appended after it; one that exists keeps its place when named again so.
#[tokio::test]
async fn a_reader_made_at_the_end_skips_what_is_kept() -> TestResult {
    let c = cluster!("a_reader_made_at_the_end_skips_what_is_kept");
    let js = c.instance().await?;
    let (q, _) = js.queue_for_readers("rec", &["record"], true).await?;
    set(&q, "1").await?;
    set(&q, "2").await?;
    let (q, readers) = js.queue_for_readers("rec", &["record", "s"], true).await?;
    assert!(take(&readers[1], TakeMode::Take).await?.is_none());
    set(&q, "3").await?;
    let t = readers[1]
        .take(TakeMode::Take, Duration::from_secs(2))
        .await?;
    assert_eq!(data(&t), Some("3".into()));
    let t = readers[0]
        .take(TakeMode::Take, Duration::from_secs(2))
        .await?;
    assert_eq!(data(&t), Some("1".into()), "record keeps its place");
    js.close().await?;
    Ok(())
}

/// The consumer of `queue`'s reader `reader`: (created, deliver_policy).
async fn consumer_made(
    client: &async_nats::Client,
    c: &Cluster,
    queue: &str,
    reader: &str,
) -> std::result::Result<(String, String), Box<dyn StdError>> {
    let subject = format!("$JS.API.CONSUMER.INFO.{}.{queue}~{reader}", c.stream);
    let reply = client.request(subject, Bytes::new()).await?;
    let info: serde_json::Value = serde_json::from_slice(&reply.payload)?;
    let created = info["created"].as_str().ok_or("no created")?.to_owned();
    let policy = info["config"]["deliver_policy"]
        .as_str()
        .ok_or("no policy")?;
    Ok((created, policy.to_owned()))
}

/// The place a reader made at the end is still to be moved to (`weir.place` in its
/// consumer's metadata), if it is.
async fn placing(
    client: &async_nats::Client,
    c: &Cluster,
    queue: &str,
    reader: &str,
) -> std::result::Result<Option<String>, Box<dyn StdError>> {
    let subject = format!("$JS.API.CONSUMER.INFO.{}.{queue}~{reader}", c.stream);
    let reply = client.request(subject, Bytes::new()).await?;
    let info: serde_json::Value = serde_json::from_slice(&reply.payload)?;
    if info.get("config").is_none() {
        return Err(format!("no consumer {queue}~{reader}: {info}").into());
    }
    Ok(info["config"]["metadata"]["weir.place"]
        .as_str()
        .map(str::to_owned))
}

/// `flush q.r` moves the reader's consumer past the newest item in place
/// (CONSUMER.RESET): a queue kept for that one reader is never without it, when an
/// append would not be stored. A reader made at the end can be moved so too.
#[tokio::test]
async fn flushing_the_only_reader_keeps_its_consumer() -> TestResult {
    let c = cluster!("flushing_the_only_reader_keeps_its_consumer");
    let js = c.instance().await?;
    let addrs: Vec<async_nats::ServerAddr> = c.urls.iter().filter_map(|u| u.parse().ok()).collect();
    let client = async_nats::connect(addrs).await?;
    let (q, readers) = js.queue_for_readers("solo", &["r", "late"], false).await?;
    set(&q, "0").await?;
    let (_, at_end) = js.queue_for_readers("solo", &["r", "end"], true).await?;
    for item in ["1", "2", "3"] {
        set(&q, item).await?;
    }
    let made = consumer_made(&client, &c, "solo", "r").await?;
    assert_eq!(made.1, "all");
    let end_made = consumer_made(&client, &c, "solo", "end").await?;
    // Made `all` and moved to the end, so it can move back past its start later.
    assert_eq!(end_made.1, "all");
    assert_eq!(placing(&client, &c, "solo", "end").await?, None);
    // The count is the consumer leader's view, which may trail the stream a moment.
    assert!((3..=4).contains(&js.flush("solo", Some("r")).await?));
    assert_eq!(
        consumer_made(&client, &c, "solo", "r").await?,
        made,
        "not made again"
    );
    assert!(take(&readers[0], TakeMode::Take).await?.is_none());
    assert!((1..=3).contains(&js.flush("solo", Some("end")).await?));
    assert_eq!(consumer_made(&client, &c, "solo", "end").await?, end_made);
    set(&q, "4").await?;
    for r in [&readers[0], &at_end[1]] {
        let t = r.take(TakeMode::Take, Duration::from_secs(2)).await?;
        assert_eq!(data(&t), Some("4".into()), "reader {}", r.name());
    }
    // The untouched reader still has everything.
    assert_eq!(
        data(&take(&readers[1], TakeMode::Take).await?),
        Some("0".into())
    );
    js.close().await?;
    Ok(())
}

/// The contract every home keeps (`common`), on the cluster: CONSUMER.RESET moves a
/// reader; this instance's lease of it ends.
#[tokio::test]
async fn readers_move_back_and_forward() -> TestResult {
    let c = cluster!("readers_move_back_and_forward");
    let backend = weir_backend::Backend::JetStream(c.instance().await?);
    common::readers_move_back_and_forward(&backend).await?;
    backend.close().await?;
    Ok(())
}

/// The rest of the contract every home keeps (`common`, `tests/contract.rs` on the
/// engine), on the cluster.
#[tokio::test]
async fn the_contract_of_every_backend() -> TestResult {
    let c = cluster!("the_contract_of_every_backend");
    let backend = weir_backend::Backend::JetStream(c.instance().await?);
    common::a_reader_made_at_the_end_is_never_moved_again(&backend).await?;
    common::readers_not_kept_are_forgotten(&backend).await?;
    common::leases_and_deleted_readers(&backend).await?;
    common::a_map_writes_compare_and_set(&backend).await?;
    common::deliveries_and_dead_letters(&backend).await?;
    common::redrive_moves_dead_letters_back(&backend).await?;
    common::pending_leases(&backend).await?;
    common::tubes_of_jobs(&backend).await?;
    backend.close().await?;
    Ok(())
}

/// A reader made at the end moves back past its start to anything the queue keeps,
/// as on the engine (the bus's replay to before a subscription): it is made `all`
/// and then moved to the end.
#[tokio::test]
async fn a_reader_made_at_the_end_moves_back_past_its_start() -> TestResult {
    use weir_backend::SeekTo;
    let c = cluster!("a_reader_made_at_the_end_moves_back_past_its_start");
    let js = c.instance().await?;
    let (q, _) = js.queue_for_readers("late", &["record"], false).await?;
    set(&q, "1").await?;
    let (q, readers) = js.queue_for_readers("late", &["record", "s"], true).await?;
    set(&q, "2").await?;
    let got = readers[1]
        .take(TakeMode::Take, Duration::from_secs(2))
        .await?;
    assert_eq!(data(&got), Some("2".into()), "made at the end");
    let q = weir_backend::Queue::JetStream(q);
    let (oldest, _) = q.bounds().await?;
    let at = q.seek_reader("s", SeekTo::Seq(oldest)).await?;
    assert_eq!(at, Some(oldest));
    for item in ["1", "2"] {
        let got = readers[1]
            .take(TakeMode::Take, Duration::from_secs(2))
            .await?;
        assert_eq!(data(&got), Some(item.into()));
    }
    assert!(take(&readers[1], TakeMode::Take).await?.is_none());
    js.close().await?;
    Ok(())
}

/// A reader whose maker died between making it (`all`, `weir.place` in its metadata)
/// and moving it to the end is moved there by the next instance that opens it, not
/// read from its start; a move of it places it first, so the placing is not done
/// again over the move.
#[tokio::test]
async fn a_reader_left_unplaced_is_placed_by_the_next_instance() -> TestResult {
    use weir_backend::SeekTo;
    let c = cluster!("a_reader_left_unplaced_is_placed_by_the_next_instance");
    let addrs: Vec<async_nats::ServerAddr> = c.urls.iter().filter_map(|u| u.parse().ok()).collect();
    let client = async_nats::connect(addrs).await?;
    let js = c.instance().await?;
    let (q, _) = js.queue_for_readers("half", &["record"], false).await?;
    set(&q, "1").await?;
    set(&q, "2").await?;
    // What an instance killed between the two steps leaves: made `all`, not moved.
    let info = client
        .request(format!("$JS.API.STREAM.INFO.{}", c.stream), "".into())
        .await?;
    let info: serde_json::Value = serde_json::from_slice(&info.payload)?;
    let next = info["state"]["last_seq"].as_u64().ok_or("last_seq")? + 1;
    for reader in ["s", "t"] {
        let name = format!("half~{reader}");
        let body = serde_json::json!({
            "stream_name": c.stream,
            "action": "create",
            "config": {
                "name": name, "durable_name": name,
                "filter_subject": format!("{}.half", c.prefix),
                "ack_policy": "explicit", "deliver_policy": "all",
                "max_deliver": -1, "ack_wait": 30_000_000_000u64,
                "metadata": {"weir.queue": "half", "weir.reader": reader, "weir.place": next.to_string()},
            },
        });
        let made = client
            .request(
                format!("$JS.API.CONSUMER.CREATE.{}.{name}", c.stream),
                serde_json::to_vec(&body)?.into(),
            )
            .await?;
        let made: serde_json::Value = serde_json::from_slice(&made.payload)?;
        assert!(made.get("error").is_none(), "{made}");
    }
    set(&q, "3").await?;
    let other = c.instance().await?;
    let (oq, readers) = other
        .queue_for_readers("half", &["record", "s"], true)
        .await?;
    assert_eq!(placing(&client, &c, "half", "s").await?, None);
    let got = readers[1]
        .take(TakeMode::Take, Duration::from_secs(2))
        .await?;
    assert_eq!(data(&got), Some("3".into()), "placed where its maker meant");
    // Reader t is moved back to the oldest item before anyone opened it: placed
    // first, then moved, and the move stands.
    let oq = weir_backend::Queue::JetStream(oq);
    let (oldest, _) = oq.bounds().await?;
    assert_eq!(
        oq.seek_reader("t", SeekTo::Seq(oldest)).await?,
        Some(oldest)
    );
    assert_eq!(placing(&client, &c, "half", "t").await?, None);
    let (_, readers) = js.queue_for_readers("half", &["t"], true).await?;
    let got = readers[0]
        .take(TakeMode::Take, Duration::from_secs(2))
        .await?;
    assert_eq!(data(&got), Some("1".into()), "the move stands");
    other.close().await?;
    js.close().await?;
    Ok(())
}

/// The cluster's map: writes are compare-and-set (of two writers from one revision,
/// one wins), a delete never removes a newer value, reads and lists see the latest
/// write, and bad keys and names are refused.
#[tokio::test]
async fn a_shared_map_writes_compare_and_set() -> TestResult {
    use weir_backend::Expect;
    let c = cluster!("a_shared_map_writes_compare_and_set");
    let js = c.instance().await?;
    let other = c.instance().await?;
    let map = js.shared_map("t").await?;
    let seen = other.shared_map("t").await?;
    assert!(map.get("a").await?.is_none());
    let r1 = map.put("a", Bytes::from("one"), Expect::Absent).await?;
    let e = seen
        .put("a", Bytes::from("two"), Expect::Absent)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), Kind::Conflict, "{e}");
    let r2 = seen
        .put("a", Bytes::from("two"), Expect::Revision(r1))
        .await?;
    assert!(r2 > r1);
    let e = map
        .put("a", Bytes::from("three"), Expect::Revision(r1))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), Kind::Conflict, "a stale revision loses: {e}");
    // A write of the value the key already holds (a retry whose first attempt was
    // stored, its reply lost) is done, at that revision.
    assert_eq!(
        map.put("a", Bytes::from("two"), Expect::Revision(r1))
            .await?,
        r2
    );
    let got = map.get("a").await?.ok_or("a is gone")?;
    assert_eq!((got.value.as_ref(), got.revision), (&b"two"[..], r2));
    let rb = map.put("b-2_=", Bytes::from("bee"), Expect::Absent).await?;
    let listed: Vec<(String, Vec<u8>, u64)> = map
        .list()
        .await?
        .into_iter()
        .map(|e| (e.key, e.value.to_vec(), e.revision))
        .collect();
    assert_eq!(
        listed,
        vec![
            ("a".into(), b"two".to_vec(), r2),
            ("b-2_=".into(), b"bee".to_vec(), rb)
        ]
    );
    let e = map.delete("a", r1).await.unwrap_err();
    assert_eq!(e.kind(), Kind::Conflict, "a newer value stays: {e}");
    assert!(map.get("a").await?.is_some());
    assert!(map.delete("a", r2).await?);
    assert!(!map.delete("a", r2).await?, "already gone");
    assert!(seen.get("a").await?.is_none());
    seen.put("a", Bytes::from("again"), Expect::Absent).await?;
    for bad in ["", "a.b", "a b", "*", ">", &"k".repeat(201)] {
        let e = map
            .put(bad, Bytes::new(), Expect::Absent)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), Kind::InvalidArgument, "{bad:?}: {e}");
    }
    for bad in ["", "Upper", "a.b", &"m".repeat(33)] {
        let e = js
            .shared_map(bad)
            .await
            .err()
            .ok_or("a bad name was taken")?;
        assert_eq!(e.kind(), Kind::InvalidName, "{bad:?}: {e}");
    }
    js.close().await?;
    other.close().await?;
    Ok(())
}

/// `max_bytes` of the instances' stream (what nats-server reserves in memory per replica).
async fn instances_stream_bytes(
    client: &async_nats::Client,
    stream: &str,
) -> std::result::Result<u64, Box<dyn StdError>> {
    let info = client
        .request(format!("$JS.API.STREAM.INFO.{stream}_DOORS"), "".into())
        .await?;
    let info: serde_json::Value = serde_json::from_slice(&info.payload)?;
    info["config"]["max_bytes"]
        .as_u64()
        .ok_or_else(|| format!("no max_bytes in {info}").into())
}

/// The instances' stream reserves `instances_stream_bytes` (8 MiB by default; it was 64 MiB,
/// and 14 stream names filled a 1 GB test cluster), and an instance started with another
/// size sets it.
#[tokio::test]
async fn the_instances_stream_is_sized_by_its_setting() -> TestResult {
    let c = cluster!("the_instances_stream_is_sized_by_its_setting");
    let a = c.instance().await?;
    a.queue("ds").await?;
    let addrs: Vec<async_nats::ServerAddr> = c.urls.iter().filter_map(|u| u.parse().ok()).collect();
    let client = async_nats::connect(addrs).await?;
    let until = Instant::now() + Duration::from_secs(10);
    while instance_registrations(&client, &c.stream).await?.is_empty() {
        assert!(Instant::now() < until, "the instance never registered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(instances_stream_bytes(&client, &c.stream).await?, 8 << 20);
    let config = JetStreamConfig {
        instances_stream_bytes: 2 << 20,
        ..c.config()
    };
    let b = JetStream::connect(config, StoreOptions::default()).await?;
    b.queue("ds").await?;
    let until = Instant::now() + Duration::from_secs(10);
    while instances_stream_bytes(&client, &c.stream).await? != 2 << 20 {
        assert!(
            Instant::now() < until,
            "the second instance did not resize the stream"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}
