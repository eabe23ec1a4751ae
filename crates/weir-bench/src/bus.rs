//! `weir-bench bus`: the event bus measured by the seed's method. Publishers POST
//! noop events whose URL carries an index; the receiver (in this process) notes when
//! each arrives; latency = receipt - send. The reference in the same run is a bare
//! HTTP server (a process of its own, axum answering 204): the ceiling of HTTP here.
//!
//! Steps: ingestion at 64 connections (rounds alternating bare and weir, ratio per
//! round and median), a serial sender's publish latency, delivery latency at `max` 1
//! and at `max` 100 / `timeout` 500 ms with 5 senders, the seed's "at scale" run
//! (240 connections, batch 100, deadline 500 ms: rate, all delivered), and weir's
//! resident memory as 10k to 1M events queue for a subscriber whose receiver is down.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use axum::body::Bytes;
use hdrhistogram::Histogram;
use indicatif::ProgressBar;

use crate::bus_http::{start_receiver, Conn, Record};
use crate::report::{f, mib, Report, Row};
use crate::sys::{free_addr, helper, wait_listening, Proc};
use crate::target::{Binaries, Kind, Target};

const ROOT_KEY: &str = "weir-bench-root-key";
/// How long delivery may take to catch up after the last publish of a step.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);

pub struct BusParams {
    pub ingest_events: u64,
    pub ingest_connections: usize,
    pub repeat: usize,
    pub serial_events: u64,
    /// Events and rate (events/s) of the `max` 1 latency step.
    pub one_events: u64,
    pub one_rate: f64,
    /// Seconds and total rate of the `max` 100 / 500 ms step (5 senders).
    pub batch_seconds: f64,
    pub batch_rate: f64,
    pub scale_events: u64,
    pub scale_connections: usize,
    pub rss_steps: Vec<u64>,
    /// Only the metadata-at-scale step; or none of it.
    pub meta_only: bool,
    pub skip_meta: bool,
    pub meta: crate::bus_scale::ScaleParams,
}

/// weir with its bus, and the bare server.
struct Servers {
    weir: Target,
    bus: SocketAddr,
    /// The bare reference server, and where it listens.
    bare: (Proc, SocketAddr),
    _config: tempfile::NamedTempFile,
}

fn start_servers(bins: &Binaries) -> Result<Servers> {
    let config = tempfile::Builder::new()
        .prefix("weir-bench-bus-")
        .suffix(".toml")
        .tempfile()?;
    std::fs::write(
        config.path(),
        format!(
            "[bus]\nroot_key = \"{ROOT_KEY}\"\nallow_http = true\nallow_private_networks = true\n"
        ),
    )?;
    let bus = free_addr()?;
    let mut bins = bins.clone();
    bins.weir_args.extend([
        "--config".to_string(),
        config.path().display().to_string(),
        "--bus-listen".to_string(),
        bus.to_string(),
    ]);
    let weir = Target::spawn(Kind::Weir, &bins)?;
    wait_listening(bus, "weir's bus")?;
    let bare = helper("bare-http")?;
    Ok(Servers {
        weir,
        bus,
        bare,
        _config: config,
    })
}

/// A token made with the root key.
async fn token(bus: SocketAddr, name: &str) -> Result<String> {
    let mut c = Conn::open(bus, ROOT_KEY).await?;
    let (status, body) = c
        .call(
            "POST",
            "/api_tokens",
            Bytes::from(format!(r#"{{"name":"{name}"}}"#)),
        )
        .await?;
    if status != 201 {
        bail!(
            "creating a token answered {status}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&body)?;
    v["token"]
        .as_str()
        .map(str::to_string)
        .context("no token in the answer")
}

/// A new subscriber on `topic` calling `callback` with `max` and `timeout` ms.
async fn subscriber(
    bus: SocketAddr,
    name: &str,
    topic: &str,
    callback: &str,
    max: u64,
    timeout: u64,
) -> Result<()> {
    let sub = token(bus, name).await?;
    let mut c = Conn::open(bus, &sub).await?;
    let body = serde_json::json!({"topics": [topic], "callback": callback, "max": max, "timeout": timeout});
    let (status, text) = c
        .call("POST", "/subscription", Bytes::from(body.to_string()))
        .await?;
    if status != 204 {
        bail!(
            "subscribing answered {status}: {}",
            String::from_utf8_lossy(&text)
        );
    }
    Ok(())
}

/// `events` publishes over `conns` connections as fast as they go; the elapsed time.
async fn flood(
    addr: SocketAddr,
    user: &str,
    topic: &str,
    conns: usize,
    events: u64,
    record: Option<Arc<Record>>,
) -> Result<Duration> {
    let next = Arc::new(AtomicU64::new(0));
    let mut opened = Vec::with_capacity(conns);
    for _ in 0..conns {
        opened.push(Conn::open(addr, user).await?);
    }
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for mut conn in opened {
        let (next, record, topic) = (Arc::clone(&next), record.clone(), topic.to_string());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Relaxed);
                if i >= events {
                    return anyhow::Ok(());
                }
                if let Some(r) = &record {
                    r.sending(i);
                }
                conn.publish(&topic, i).await?;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(start.elapsed())
}

/// `events` publishes at `rate` per second in total over `senders` connections, each
/// sent at its scheduled time (or at once when late).
async fn paced(
    addr: SocketAddr,
    user: &str,
    topic: &str,
    senders: usize,
    rate: f64,
    events: u64,
    record: Arc<Record>,
) -> Result<()> {
    let start = tokio::time::Instant::now() + Duration::from_millis(50);
    let mut tasks = tokio::task::JoinSet::new();
    for s in 0..senders {
        let mut conn = Conn::open(addr, user).await?;
        let (record, topic) = (Arc::clone(&record), topic.to_string());
        tasks.spawn(async move {
            let mut i = s as u64;
            while i < events {
                tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
                record.sending(i);
                conn.publish(&topic, i).await?;
                i += senders as u64;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}

pub async fn run(p: &BusParams, bins: &Binaries, steps: &ProgressBar) -> Result<Vec<Report>> {
    if p.meta_only {
        steps.set_length(1);
        steps.set_message("metadata at scale");
        let report = crate::bus_scale::run(&p.meta, bins).await?;
        steps.inc(1);
        return Ok(vec![report]);
    }
    steps.set_length(if p.skip_meta { 6 } else { 7 });
    let servers = start_servers(bins)?;
    let publisher = token(servers.bus, "bench_publisher").await?;
    let mut reports = Vec::new();
    steps.set_message("ingestion, 64 connections");
    reports.push(ingest(&servers, &publisher, p).await?);
    steps.inc(1);
    steps.set_message("serial publish latency");
    reports.push(serial(&servers, &publisher, p).await?);
    steps.inc(1);
    steps.set_message("delivery latency");
    reports.push(latency(&servers, &publisher, p).await?);
    steps.inc(2);
    steps.set_message("at scale, 240 connections");
    reports.push(scale(&servers, &publisher, p).await?);
    steps.inc(1);
    drop(servers);
    steps.set_message("memory with a backlog");
    reports.push(rss(bins, p).await?);
    steps.inc(1);
    if !p.skip_meta {
        steps.set_message("metadata at scale");
        reports.push(crate::bus_scale::run(&p.meta, bins).await?);
        steps.inc(1);
    }
    Ok(reports)
}

/// Ingestion rounds, bare and weir in alternating order; weir's events are delivered
/// to a subscriber (max 100, timeout 500) while it ingests, as in production.
async fn ingest(s: &Servers, publisher: &str, p: &BusParams) -> Result<Report> {
    let mut report = Report::new(
        "bus-ingest",
        format!(
            "bus ingestion: single-event POSTs, {} keep-alive connections",
            p.ingest_connections
        ),
    );
    let mut ratios = Vec::new();
    for round in 0..p.repeat {
        let topic = format!("ingest_{}", letters(round));
        let record = Record::new(p.ingest_events)?;
        let (hook, receiver) = start_receiver(Arc::clone(&record)).await?;
        subscriber(
            s.bus,
            &format!("ingest_sub_{round}"),
            &topic,
            &format!("http://{hook}/hook"),
            100,
            500,
        )
        .await?;
        let mut rates = [0.0f64; 2];
        for k in 0..2 {
            let weir_turn = (k + round) % 2 == 1;
            let (addr, name) = if weir_turn {
                (s.bus, "weir")
            } else {
                (s.bare.1, "bare-http")
            };
            let rec = weir_turn.then(|| Arc::clone(&record));
            let took = flood(
                addr,
                publisher,
                &topic,
                p.ingest_connections,
                p.ingest_events,
                rec,
            )
            .await?;
            let rate = p.ingest_events as f64 / took.as_secs_f64();
            rates[usize::from(weir_turn)] = rate;
            report.rows.push(
                Row::new()
                    .with("round", round as u64 + 1)
                    .with("target", name)
                    .with("events", p.ingest_events)
                    .with("seconds", f(took.as_secs_f64(), 2))
                    .with("events/s", f(rate, 0)),
            );
            if weir_turn && !record.wait_received(p.ingest_events, DRAIN_LIMIT).await {
                bail!("ingestion round {round}: delivery did not catch up within {DRAIN_LIMIT:?}");
            }
        }
        receiver.abort();
        ratios.push(rates[1] / rates[0]);
    }
    report.notes.push(format!("weir / bare per round: {}; median {:.2} (goal >= 0.5; routemaster: 146 events/s per thread, 2,195/s on 10 servers)", join(&ratios), median(&mut ratios)));
    Ok(report)
}

/// One connection, one publish at a time: the publish latency seen by the sender.
async fn serial(s: &Servers, publisher: &str, p: &BusParams) -> Result<Report> {
    let mut report = Report::new(
        "bus-serial",
        "bus: a serial sender's publish latency (one keep-alive connection)",
    );
    let mut p50s = Vec::new();
    for (addr, name) in [(s.bare.1, "bare-http"), (s.bus, "weir")] {
        let mut conn = Conn::open(addr, publisher).await?;
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
        for i in 0..p.serial_events {
            let t = Instant::now();
            conn.publish("serial", i).await?;
            h.record(
                u64::try_from(t.elapsed().as_micros())
                    .unwrap_or(u64::MAX)
                    .max(1),
            )?;
        }
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        p50s.push(ms(0.5));
        report.rows.push(
            Row::new()
                .with("target", name)
                .with("requests", p.serial_events)
                .with("p50_ms", f(ms(0.5), 3))
                .with("p90_ms", f(ms(0.9), 3))
                .with("p99_ms", f(ms(0.99), 3)),
        );
    }
    report.notes.push(format!(
        "weir p50 {:.3} ms (goal <= 0.5 ms; routemaster 13 ms); bare-http p50 {:.3} ms",
        p50s[1], p50s[0]
    ));
    Ok(report)
}

/// Delivery latency at `max` 1 (one sender, paced) and at `max` 100 / `timeout`
/// 500 ms (5 paced senders).
async fn latency(s: &Servers, publisher: &str, p: &BusParams) -> Result<Report> {
    let mut report = Report::new(
        "bus-latency",
        "bus: delivery latency, publish to receipt (ms)",
    );
    let batch_events = (p.batch_seconds * p.batch_rate).round() as u64;
    let cases = [
        (
            "max 1",
            "lat_one",
            1u64,
            0u64,
            1usize,
            p.one_rate,
            p.one_events,
        ),
        (
            "max 100 / 500 ms, 5 senders",
            "lat_batch",
            100,
            500,
            5,
            p.batch_rate,
            batch_events,
        ),
    ];
    for (label, topic, max, timeout, senders, rate, events) in cases {
        let case = LatencyCase {
            label,
            topic,
            max,
            timeout,
            senders,
            rate,
            events,
        };
        latency_case(s, publisher, &case, &mut report).await?;
    }
    report.notes.push("goals: max 1 p50 <= 5 ms (routemaster 17 s); max 100 / 500 ms p50 <= 520 ms (routemaster 470 ms)".into());
    Ok(report)
}

struct LatencyCase {
    label: &'static str,
    topic: &'static str,
    max: u64,
    timeout: u64,
    senders: usize,
    rate: f64,
    events: u64,
}

async fn latency_case(
    s: &Servers,
    publisher: &str,
    c: &LatencyCase,
    report: &mut Report,
) -> Result<()> {
    let record = Record::new(c.events)?;
    let (hook, receiver) = start_receiver(Arc::clone(&record)).await?;
    let callback = format!("http://{hook}/hook");
    subscriber(
        s.bus,
        &format!("{}_sub", c.topic),
        c.topic,
        &callback,
        c.max,
        c.timeout,
    )
    .await?;
    paced(
        s.bus,
        publisher,
        c.topic,
        c.senders,
        c.rate,
        c.events,
        Arc::clone(&record),
    )
    .await?;
    let all = record.wait_received(c.events, DRAIN_LIMIT).await;
    receiver.abort();
    let (p50, p90, p99, max_ms) = record.percentiles_ms();
    for (q, v) in [("p50", p50), ("p90", p90), ("p99", p99), ("max", max_ms)] {
        report.rows.push(
            Row::new()
                .with("scenario", c.label)
                .with("percentile", q)
                .with("ms", f(v, 2))
                .with("events", c.events)
                .with("received", record.received.load(Relaxed))
                .with("rate/s", f(c.rate, 0)),
        );
    }
    if !all {
        bail!(
            "{}: {} of {} events received",
            c.label,
            record.received.load(Relaxed),
            c.events
        );
    }
    Ok(())
}

/// The seed's "at scale": 240 connections publishing as fast as they can, one
/// subscriber with batch 100 and deadline 500 ms; every event must arrive.
async fn scale(s: &Servers, publisher: &str, p: &BusParams) -> Result<Report> {
    let mut report = Report::new(
        "bus-scale",
        format!(
            "bus at scale: {} connections, batch 100, deadline 500 ms",
            p.scale_connections
        ),
    );
    let record = Record::new(p.scale_events)?;
    let (hook, receiver) = start_receiver(Arc::clone(&record)).await?;
    subscriber(
        s.bus,
        "scale_sub",
        "scale",
        &format!("http://{hook}/hook"),
        100,
        500,
    )
    .await?;
    let took = flood(
        s.bus,
        publisher,
        "scale",
        p.scale_connections,
        p.scale_events,
        Some(Arc::clone(&record)),
    )
    .await?;
    let end_us = record.now_us();
    let all = record.wait_received(p.scale_events, DRAIN_LIMIT).await;
    receiver.abort();
    let rate = p.scale_events as f64 / took.as_secs_f64();
    let drained_s = record.last_receipt_us.load(Relaxed).saturating_sub(end_us) as f64 / 1e6;
    let (p50, _, p99, _) = record.percentiles_ms();
    report.rows.push(
        Row::new()
            .with("events", p.scale_events)
            .with("publish_s", f(took.as_secs_f64(), 2))
            .with("events/s", f(rate, 0))
            .with("received", record.received.load(Relaxed))
            .with("duplicates", record.duplicates.load(Relaxed))
            .with("drain_after_s", f(drained_s, 2))
            .with("latency_p50_ms", f(p50, 1))
            .with("latency_p99_ms", f(p99, 1))
            .with("rss", mib(s.weir.rss_bytes())),
    );
    report.notes.push(format!(
        "{:.1} x routemaster's 2,195/s at 10 servers (goal >= 10 x); all received: {all}",
        rate / 2195.0
    ));
    if !all {
        bail!(
            "at scale: {} of {} events received",
            record.received.load(Relaxed),
            p.scale_events
        );
    }
    Ok(report)
}

/// weir's RSS as events queue for a subscriber whose receiver is down.
async fn rss(bins: &Binaries, p: &BusParams) -> Result<Report> {
    let s = start_servers(bins)?;
    let publisher = token(s.bus, "rss_publisher").await?;
    let dead = free_addr()?; // nobody listens there
    subscriber(
        s.bus,
        "rss_sub",
        "backlog",
        &format!("http://{dead}/hook"),
        100,
        500,
    )
    .await?;
    let mut report = Report::new(
        "bus-rss",
        "bus: weir's resident memory with events queued for a subscriber whose receiver is down",
    );
    report.rows.push(
        Row::new()
            .with("target", "weir")
            .with("queued", 0u64)
            .with("rss_bytes", s.weir.rss_bytes())
            .with("rss_mib", mib(s.weir.rss_bytes())),
    );
    let mut queued = 0;
    for &step in &p.rss_steps {
        flood(
            s.bus,
            &publisher,
            "backlog",
            64,
            step - queued.min(step),
            None,
        )
        .await?;
        queued = step.max(queued);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let listed = queued_of(s.bus, &publisher).await?;
        if listed != queued {
            bail!("{queued} published but {listed} queued for the subscriber");
        }
        report.rows.push(
            Row::new()
                .with("target", "weir")
                .with("queued", queued)
                .with("rss_bytes", s.weir.rss_bytes())
                .with("rss_mib", mib(s.weir.rss_bytes())),
        );
    }
    report.notes.push(
        "goal: <= 20 MB at 1,000,000 queued, flat from 10k (routemaster: 250 MB of Redis per 1M)"
            .into(),
    );
    Ok(report)
}

/// `events.queued` of the first subscription, from `GET /subscriptions`.
async fn queued_of(bus: SocketAddr, user: &str) -> Result<u64> {
    let mut c = Conn::open(bus, user).await?;
    let (_, body) = c.call("GET", "/subscriptions", Bytes::new()).await?;
    let v: serde_json::Value = serde_json::from_slice(&body)?;
    v[0]["events"]["queued"].as_u64().context("no queued count")
}

/// A topic-name suffix for a number (topic names are letters and `_`).
fn letters(n: usize) -> String {
    let mut n = n;
    let mut s = String::new();
    loop {
        s.insert(0, char::from(b'a' + (n % 26) as u8));
        n /= 26;
        if n == 0 {
            return s;
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn join(v: &[f64]) -> String {
    v.iter()
        .map(|r| format!("{r:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}
