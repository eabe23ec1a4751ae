//! `weir-bench bus --bus-meta-only` (and the last step of `weir-bench bus`): the bus
//! at its documented maximum, `subscribers` subscriptions each on all of `topics`
//! topics (200 x 1,000 by default). Measured per round, reported per round and as
//! the median of the rounds:
//!
//! - metadata changes, each timed alone on one keep-alive connection: a token
//!   created (root key), a subscription dropped (`DELETE /subscriber`) and made
//!   again on every topic (`POST /subscription`), the token deleted;
//! - a serial sender's publish latency, each publish to the next topic in turn;
//! - the weir process's CPU while idle (from `/proc/PID/stat`), first in the
//!   round, 2 s after the setup or the previous round's restart;
//! - restart: SIGTERM, wait for the exit, start the same data directory again, and
//!   time from the start until a publish is answered 200.
//!
//! weir is spawned here (its own data directory, kept across restarts); every
//! subscriber's callback is a receiver in this process that answers 204.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use axum::body::Bytes;
use hdrhistogram::Histogram;

use crate::bus_http::{start_receiver, Conn, Record};
use crate::report::{f, Report, Row};
use crate::sys::{free_addr, process_cpu_time, signal};
use crate::target::{find_weir, Binaries};

const ROOT_KEY: &str = "weir-bench-root-key";
/// How long a start may take before the step fails.
const START_LIMIT: Duration = Duration::from_secs(300);

pub struct ScaleParams {
    pub subscribers: usize,
    pub topics: usize,
    pub rounds: usize,
    /// Changes of each kind per round.
    pub changes: usize,
    /// Serial publishes per round.
    pub publishes: u64,
    /// Seconds of each idle CPU measurement.
    pub idle_seconds: f64,
}

/// weir with its bus on a data directory that outlives a restart.
struct Weir {
    bin: PathBuf,
    args: Vec<String>,
    dir: tempfile::TempDir,
    bus: SocketAddr,
    child: Option<Child>,
}

impl Weir {
    fn new(bins: &Binaries, p: &ScaleParams) -> Result<Weir> {
        let mut builder = tempfile::Builder::new();
        builder.prefix("weir-bench-bus-scale-");
        let dir = match &bins.work_dir {
            Some(parent) => builder.tempdir_in(parent),
            None => builder.tempdir(),
        }?;
        let config = dir.path().join("bus.toml");
        std::fs::write(
            &config,
            format!(
                "[bus]\nroot_key = \"{ROOT_KEY}\"\nallow_http = true\nallow_private_networks = true\n\
                 topics_max = {}\nsubscribers_max = {}\n",
                p.topics.max(1),
                p.subscribers.max(1)
            ),
        )?;
        let bus = free_addr()?;
        let mut args = vec![
            "serve".to_string(),
            "--listen".to_string(),
            free_addr()?.to_string(),
            "--http-listen".to_string(),
            free_addr()?.to_string(),
            "--data-dir".to_string(),
            dir.path().join("data").display().to_string(),
            "--config".to_string(),
            config.display().to_string(),
            "--bus-listen".to_string(),
            bus.to_string(),
        ];
        args.extend(bins.weir_args.iter().cloned());
        Ok(Weir {
            bin: find_weir(bins.weir.as_deref())?,
            args,
            dir,
            bus,
            child: None,
        })
    }

    fn start(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("server.log"))?;
        let child = Command::new(&self.bin)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        self.child = Some(child);
        Ok(())
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGTERM, and waits for the exit (SIGKILL after a minute).
    fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let _ = signal(child.id(), libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        child.kill()?;
        child.wait()?;
        bail!("weir did not stop within a minute of SIGTERM")
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines
            .get(lines.len().saturating_sub(20)..)
            .unwrap_or_default()
            .join("\n")
    }
}

impl Drop for Weir {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// A topic name for a number (topic names are letters and `_`).
fn topic(i: usize) -> String {
    let mut n = i;
    let mut s = String::from("t_");
    for _ in 0..4 {
        s.push(char::from(b'a' + (n % 26) as u8));
        n /= 26;
    }
    s
}

async fn call(c: &mut Conn, method: &str, path: &str, body: String, want: u16) -> Result<Bytes> {
    let (status, text) = c.call(method, path, Bytes::from(body)).await?;
    if status != want {
        bail!(
            "{method} {path} answered {status}: {}",
            String::from_utf8_lossy(&text)
        );
    }
    Ok(text)
}

async fn new_token(root: &mut Conn, name: &str) -> Result<String> {
    let body = call(
        root,
        "POST",
        "/api_tokens",
        format!(r#"{{"name":"{name}"}}"#),
        201,
    )
    .await?;
    let v: serde_json::Value = serde_json::from_slice(&body)?;
    v.get("token")
        .and_then(|t| t.as_str())
        .map(str::to_string)
        .context("no token in the answer")
}

fn subscription(topics: &[String], callback: &str) -> String {
    serde_json::json!({"topics": topics, "callback": callback, "max": 100, "timeout": 500})
        .to_string()
}

/// The standing state: a publisher that claimed every topic, and `subscribers`
/// subscriptions on all of them. Returns the publisher's and subscribers' tokens.
async fn populate(
    bus: SocketAddr,
    p: &ScaleParams,
    topics: &[String],
    callback: &str,
) -> Result<(String, Vec<String>)> {
    let mut root = Conn::open(bus, ROOT_KEY).await?;
    let publisher = new_token(&mut root, "scale_publisher").await?;
    let mut pc = Conn::open(bus, &publisher).await?;
    for (i, t) in topics.iter().enumerate() {
        pc.publish(t, i as u64).await?;
    }
    let mut subs = Vec::with_capacity(p.subscribers);
    for i in 0..p.subscribers {
        // Fresh connections: a slow subscription may outlast an idle one's timeout.
        let mut root = Conn::open(bus, ROOT_KEY).await?;
        let token = new_token(&mut root, &format!("scale_sub_{i}")).await?;
        let mut c = Conn::open(bus, &token).await?;
        call(
            &mut c,
            "POST",
            "/subscription",
            subscription(topics, callback),
            204,
        )
        .await?;
        subs.push(token);
    }
    Ok((publisher, subs))
}

fn histogram() -> Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 3_600_000_000, 3)?)
}

fn record_since(h: &mut Histogram<u64>, t: Instant) -> Result<()> {
    let us = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
    h.record(us.max(1))?;
    Ok(())
}

/// Latencies of one round's metadata changes: token create, unsubscribe, subscribe
/// (on every topic), token delete.
struct ChangeTimes {
    create: Histogram<u64>,
    unsubscribe: Histogram<u64>,
    subscribe: Histogram<u64>,
    delete: Histogram<u64>,
}

async fn changes(
    bus: SocketAddr,
    p: &ScaleParams,
    round: usize,
    topics: &[String],
    subs: &[String],
    callback: &str,
) -> Result<ChangeTimes> {
    let mut t = ChangeTimes {
        create: histogram()?,
        unsubscribe: histogram()?,
        subscribe: histogram()?,
        delete: histogram()?,
    };
    for i in 0..p.changes {
        // Fresh connections, opened before the clock starts: a slow change may
        // outlast an idle one's timeout.
        let mut root = Conn::open(bus, ROOT_KEY).await?;
        let start = Instant::now();
        let token = new_token(&mut root, &format!("churn_{round}_{i}")).await?;
        record_since(&mut t.create, start)?;
        let start = Instant::now();
        call(
            &mut root,
            "DELETE",
            &format!("/api_tokens/{token}"),
            String::new(),
            204,
        )
        .await?;
        record_since(&mut t.delete, start)?;
        let Some(sub) = subs.get(i % subs.len().max(1)) else {
            continue;
        };
        let mut c = Conn::open(bus, sub).await?;
        let start = Instant::now();
        call(&mut c, "DELETE", "/subscriber", String::new(), 204).await?;
        record_since(&mut t.unsubscribe, start)?;
        let mut c = Conn::open(bus, sub).await?;
        let start = Instant::now();
        let body = subscription(topics, callback);
        call(&mut c, "POST", "/subscription", body, 204).await?;
        record_since(&mut t.subscribe, start)?;
    }
    Ok(t)
}

async fn publishes(
    bus: SocketAddr,
    publisher: &str,
    topics: &[String],
    n: u64,
) -> Result<Histogram<u64>> {
    let mut h = histogram()?;
    let mut c = Conn::open(bus, publisher).await?;
    for i in 0..n {
        let t = topics
            .get(i as usize % topics.len().max(1))
            .context("no topics")?;
        let start = Instant::now();
        c.publish(t, i).await?;
        record_since(&mut h, start)?;
    }
    Ok(h)
}

/// CPU used by `pid` over `seconds`, as a percentage of one core.
async fn idle_cpu(pid: u32, seconds: f64) -> Result<f64> {
    let before = process_cpu_time(pid).context("reading /proc/PID/stat")?;
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let after = process_cpu_time(pid).context("reading /proc/PID/stat")?;
    let used = after.saturating_sub(before).as_secs_f64();
    Ok(100.0 * used / start.elapsed().as_secs_f64())
}

/// Stops weir, starts it again, and times until a publish is answered 200.
async fn restart(w: &mut Weir, publisher: &str, topic: &str) -> Result<Duration> {
    w.stop()?;
    let start = Instant::now();
    w.start()?;
    loop {
        if start.elapsed() > START_LIMIT {
            bail!(
                "weir's bus did not take a publish within {START_LIMIT:?} of a start; its log:\n{}",
                w.log_tail()
            );
        }
        if let Ok(mut c) = Conn::open(w.bus, publisher).await {
            if c.publish(topic, 0).await.is_ok() {
                return Ok(start.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// Waits until the bus answers `/pulse`.
async fn wait_up(w: &Weir) -> Result<()> {
    let start = Instant::now();
    loop {
        if let Ok(mut c) = Conn::open(w.bus, "").await {
            if let Ok((200..=299, _)) = c.call("GET", "/pulse", Bytes::new()).await {
                return Ok(());
            }
        }
        if start.elapsed() > START_LIMIT {
            bail!("weir's bus did not answer; its log:\n{}", w.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One round's figures, in the order of [`COLUMNS`].
type Figures = [f64; 12];
const COLUMNS: [&str; 12] = [
    "token_create_p50_ms",
    "token_create_p99_ms",
    "unsubscribe_p50_ms",
    "unsubscribe_p99_ms",
    "subscribe_p50_ms",
    "subscribe_p99_ms",
    "token_delete_p50_ms",
    "token_delete_p99_ms",
    "publish_p50_ms",
    "publish_p99_ms",
    "idle_cpu_percent",
    "restart_s",
];

async fn round(
    w: &mut Weir,
    p: &ScaleParams,
    i: usize,
    state: &(Vec<String>, String, Vec<String>, String),
) -> Result<Figures> {
    let (topics, publisher, subs, callback) = state;
    // Idle first, once the start (or the setup) has settled: after the changes the
    // workers of dropped subscriptions are still deleting their readers.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pid = w.pid().context("weir is not running")?;
    let cpu = idle_cpu(pid, p.idle_seconds).await?;
    let c = changes(w.bus, p, i, topics, subs, callback).await?;
    let publish = publishes(w.bus, publisher, topics, p.publishes).await?;
    let first = topics.first().context("no topics")?;
    let took = restart(w, publisher, first).await?;
    Ok([
        ms(&c.create, 0.5),
        ms(&c.create, 0.99),
        ms(&c.unsubscribe, 0.5),
        ms(&c.unsubscribe, 0.99),
        ms(&c.subscribe, 0.5),
        ms(&c.subscribe, 0.99),
        ms(&c.delete, 0.5),
        ms(&c.delete, 0.99),
        ms(&publish, 0.5),
        ms(&publish, 0.99),
        cpu,
        took.as_secs_f64(),
    ])
}

pub async fn run(p: &ScaleParams, bins: &Binaries) -> Result<Report> {
    let mut w = Weir::new(bins, p)?;
    w.start()?;
    wait_up(&w).await?;
    let record = Record::new(1)?;
    let (hook, receiver) = start_receiver(Arc::clone(&record)).await?;
    let callback = format!("http://{hook}/hook");
    let topics: Vec<String> = (0..p.topics.max(1)).map(topic).collect();
    let setup = Instant::now();
    let (publisher, subs) = populate(w.bus, p, &topics, &callback).await?;
    let setup_s = setup.elapsed().as_secs_f64();
    let state = (topics, publisher, subs, callback);
    let mut report = Report::new(
        "bus-meta-scale",
        format!(
            "bus at scale: {} subscriptions x {} topics (medians of {} rounds in the last row)",
            p.subscribers,
            p.topics,
            p.rounds.max(1)
        ),
    );
    let mut all: Vec<Figures> = Vec::new();
    for i in 0..p.rounds.max(1) {
        let figures = round(&mut w, p, i, &state).await?;
        report.rows.push(row(&format!("{}", i + 1), &figures));
        all.push(figures);
    }
    receiver.abort();
    let mut medians = [0.0; 12];
    for (k, m) in medians.iter_mut().enumerate() {
        let mut v: Vec<f64> = all.iter().filter_map(|r| r.get(k).copied()).collect();
        v.sort_by(f64::total_cmp);
        *m = v.get(v.len() / 2).copied().unwrap_or(f64::NAN);
    }
    report.rows.push(row("median", &medians));
    report.notes.push(format!(
        "setup ({} topics claimed, {} subscriptions on every topic) took {setup_s:.1} s; {} changes of each kind and {} serial publishes per round; idle CPU over {} s; restart = SIGTERM, exit, start, first publish answered",
        p.topics, p.subscribers, p.changes, p.publishes, p.idle_seconds
    ));
    report.notes.push("goals: every metadata change p99 <= 10 ms, publish p50 <= 1 ms, idle CPU < 1% of a core, restart <= 1 s".into());
    Ok(report)
}

fn row(round: &str, v: &Figures) -> Row {
    let mut r = Row::new().with("round", round);
    for (name, value) in COLUMNS.iter().zip(v) {
        r = r.with(name, f(*value, 3));
    }
    r
}
