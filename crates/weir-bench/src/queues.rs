//! Many queues: whole-store commands and idle cost with 10,000 queues.
//!
//! Why: a server that is fast on ten queues can fall over on ten thousand. Hardening
//! found `flush_all` taking 22.5 s, `flush_all_expired` 20 s and `stats` 3 s with about
//! 10,000 queues, and the idle server burning 1.87 CPU-seconds per 10 s. The goals
//! (issue 8): `flush_all` under 1 s, `stats` under 0.3 s, idle CPU under 1% of a core.
//!
//! Per target: create N queues holding a few items each (over several connections;
//! reported as the setup time), wait for the server to settle (its background work
//! after the burst: the first fsync of every new queue, the idle queues closing their
//! files; reported as the settle time, from the end of the setup until a second in
//! which it used under 2% of a core, at most a minute), measure its CPU time over an
//! idle window (utime + stime of `/proc/PID/stat`), then time `stats` (the
//! whole reply), `flush_all_expired` and `flush_all`, each `repeat` times (the queues
//! are filled again between `flush_all`s), medians reported. Meanwhile a second
//! connection sends `version` every 5 ms: its worst wait shows whether a whole-store
//! command holds up the other connections. memcached has no queues: it is skipped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::report::{f, Cell, Report, Row};
use crate::target::Target;

#[derive(Clone, Debug)]
pub struct QueuesParams {
    pub queues: usize,
    pub items_per_queue: u64,
    pub item_bytes: usize,
    pub connections: usize,
    pub idle_seconds: f64,
    pub repeat: usize,
}

/// The goals, in seconds (CPU: share of one core).
const STATS_GOAL_S: f64 = 0.3;
const FLUSH_ALL_GOAL_S: f64 = 1.0;
const IDLE_CPU_GOAL: f64 = 0.01;
/// Longest wait for the server to settle after the setup.
const SETTLE_MAX: Duration = Duration::from_secs(60);
/// A second with less CPU than this share of a core: settled.
const SETTLED_CPU: f64 = 0.02;

pub async fn run(
    targets: &[Target],
    p: &QueuesParams,
    bar: &ProgressBar,
    fill: &ProgressBar,
) -> Result<Report> {
    let mut report = Report::new(
        "queues",
        format!(
            "{} queues of {} items of {} B: setup, idle CPU, stats, flush_all_expired, flush_all",
            p.queues, p.items_per_queue, p.item_bytes
        ),
    );
    bar.set_length((targets.len() * 5) as u64);
    for target in targets {
        if target.name == "memcached" {
            report
                .notes
                .push("memcached: skipped, it has no queues".into());
            bar.inc(5);
            continue;
        }
        bar.set_message(format!("queues {}: setup", target.name));
        let setup = fill_queues(target, p, fill).await?;
        report.rows.push(row(target, "setup", setup, None));
        bar.inc(1);
        bar.set_message(format!("queues {}: settling", target.name));
        let settle = settle(target).await?;
        report.rows.push(row(target, "settle", settle, None));
        bar.set_message(format!("queues {}: idle", target.name));
        report.rows.push(idle_row(target, p.idle_seconds).await?);
        bar.inc(1);
        for (what, request, goal) in [
            ("stats", &b"stats\r\n"[..], Some(STATS_GOAL_S)),
            ("flush_all_expired", b"flush_all_expired\r\n", None),
        ] {
            bar.set_message(format!("queues {}: {what}", target.name));
            let (took, worst, bytes) = repeat_timed(target, request, p.repeat).await?;
            report
                .rows
                .push(timed_row(target, what, took, worst, bytes, goal));
            bar.inc(1);
        }
        bar.set_message(format!("queues {}: flush_all", target.name));
        let mut runs = Vec::new();
        for i in 0..p.repeat {
            if i > 0 {
                fill_queues(target, p, fill).await?;
            }
            runs.push(timed(target, b"flush_all\r\n").await?);
        }
        let (took, worst, bytes) = medians(runs);
        report.rows.push(timed_row(
            target,
            "flush_all",
            took,
            worst,
            bytes,
            Some(FLUSH_ALL_GOAL_S),
        ));
        bar.inc(1);
    }
    Ok(report)
}

fn row(target: &Target, what: &str, seconds: f64, goal: Option<f64>) -> Row {
    measured(target, what, seconds, None, goal)
}

fn timed_row(
    target: &Target,
    what: &str,
    took: f64,
    worst: f64,
    bytes: u64,
    goal: Option<f64>,
) -> Row {
    measured(target, what, took, Some((worst, bytes)), goal)
}

/// A row of seconds; `other`: the worst wait of the other connection and the reply's
/// size.
fn measured(
    target: &Target,
    what: &str,
    seconds: f64,
    other: Option<(f64, u64)>,
    goal: Option<f64>,
) -> Row {
    Row::new()
        .with("target", target.name.as_str())
        .with("measure", what)
        .with("value", f(seconds, 3))
        .with("unit", "s")
        .with(
            "worst_other_ms",
            other.map_or(Cell::Empty, |(w, _)| f(w * 1000.0, 1)),
        )
        .with("reply_bytes", other.map(|(_, b)| b))
        .with("goal", goal.map_or("-".to_string(), |g| format!("< {g}")))
        .with(
            "met",
            goal.map_or("-", |g| if seconds < g { "yes" } else { "NOT MET" }),
        )
}

/// Waits until the server used under [`SETTLED_CPU`] of a core over a second (or
/// [`SETTLE_MAX`] passed); the seconds it took.
async fn settle(target: &Target) -> Result<f64> {
    let Some(pid) = target.pid else {
        return Ok(0.0);
    };
    let cpu = || crate::sys::process_cpu_time(pid).context("reading the server's CPU time");
    let t0 = Instant::now();
    while t0.elapsed() < SETTLE_MAX {
        let before = cpu()?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        if (cpu()? - before).as_secs_f64() < SETTLED_CPU {
            break;
        }
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// The server's CPU over an idle window, as a share of one core.
async fn idle_row(target: &Target, seconds: f64) -> Result<Row> {
    let Some(pid) = target.pid else {
        bail!(
            "{}: idle CPU needs the server's pid (--pid {}=PID)",
            target.name,
            target.name
        );
    };
    let cpu = || crate::sys::process_cpu_time(pid).context("reading the server's CPU time");
    let before = cpu()?;
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let share = (cpu()? - before).as_secs_f64() / t0.elapsed().as_secs_f64();
    Ok(Row::new()
        .with("target", target.name.as_str())
        .with("measure", "idle CPU")
        .with("value", f(share * 100.0, 2))
        .with("unit", "% of a core")
        .with("worst_other_ms", Cell::Empty)
        .with("reply_bytes", None::<u64>)
        .with("goal", format!("< {}", IDLE_CPU_GOAL * 100.0))
        .with(
            "met",
            if share < IDLE_CPU_GOAL {
                "yes"
            } else {
                "NOT MET"
            },
        ))
}

/// Creates (or refills) the queues `q00000`.. with their items over `p.connections`
/// connections, each pipelining its share; returns the seconds it took.
async fn fill_queues(target: &Target, p: &QueuesParams, fill: &ProgressBar) -> Result<f64> {
    fill.reset();
    fill.set_length(p.queues as u64);
    fill.set_message("creating queues");
    let data = vec![b'q'; p.item_bytes];
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..p.connections.max(1) {
        let (addr, data, p) = (target.addr, data.clone(), p.clone());
        let fill = fill.clone();
        tasks.spawn(async move {
            let mut conn = TcpStream::connect(addr).await.context("connecting")?;
            let mut i = c;
            while i < p.queues {
                let mut request = Vec::new();
                for _ in 0..p.items_per_queue {
                    request.extend_from_slice(
                        format!("set q{i:05} 0 0 {}\r\n", data.len()).as_bytes(),
                    );
                    request.extend_from_slice(&data);
                    request.extend_from_slice(b"\r\n");
                }
                conn.write_all(&request).await.context("sending sets")?;
                let expected = b"STORED\r\n".repeat(p.items_per_queue as usize);
                let got = read_exactly(&mut conn, expected.len()).await?;
                if got != expected {
                    bail!("queue q{i:05}: {:?}", String::from_utf8_lossy(&got));
                }
                fill.inc(1);
                i += p.connections.max(1);
            }
            Ok::<_, anyhow::Error>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.context("a filling task died")??;
    }
    Ok(t0.elapsed().as_secs_f64())
}

async fn read_exactly(conn: &mut TcpStream, n: usize) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    conn.read_exact(&mut buf).await.context("reading replies")?;
    Ok(buf)
}

/// `request` timed `repeat` times; the medians.
async fn repeat_timed(target: &Target, request: &[u8], repeat: usize) -> Result<(f64, f64, u64)> {
    let mut runs = Vec::new();
    for _ in 0..repeat.max(1) {
        runs.push(timed(target, request).await?);
    }
    Ok(medians(runs))
}

fn medians(mut runs: Vec<(f64, f64, u64)>) -> (f64, f64, u64) {
    let mid = runs.len() / 2;
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let took = runs[mid].0;
    let bytes = runs[mid].2;
    runs.sort_by(|a, b| a.1.total_cmp(&b.1));
    (took, runs[mid].1, bytes)
}

/// Sends one whole-store request and reads its whole reply (to `END`, or one line),
/// while a second connection pings; returns (seconds, worst ping wait, reply bytes).
async fn timed(target: &Target, request: &[u8]) -> Result<(f64, f64, u64)> {
    let mut conn = TcpStream::connect(target.addr)
        .await
        .context("connecting")?;
    conn.set_nodelay(true)?;
    let stop = Arc::new(AtomicBool::new(false));
    let prober = tokio::spawn(probe(target.addr, Arc::clone(&stop)));
    let t0 = Instant::now();
    conn.write_all(request).await.context("sending")?;
    let multi_line = request.starts_with(b"stats");
    let reply = read_reply(&mut conn, multi_line).await?;
    let took = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let worst = prober.await.context("the prober died")??;
    if reply.starts_with(b"SERVER_ERROR")
        || reply.starts_with(b"CLIENT_ERROR")
        || reply.starts_with(b"ERROR")
    {
        bail!(
            "{}: {:?}",
            String::from_utf8_lossy(request).trim(),
            String::from_utf8_lossy(&reply)
        );
    }
    Ok((took, worst, reply.len() as u64))
}

async fn read_reply(conn: &mut TcpStream, until_end: bool) -> Result<Vec<u8>> {
    let terminator: &[u8] = if until_end { b"END\r\n" } else { b"\r\n" };
    let mut reply = Vec::new();
    let mut chunk = vec![0u8; 256 * 1024];
    while !reply.ends_with(terminator) {
        let n = conn.read(&mut chunk).await.context("reading the reply")?;
        if n == 0 {
            bail!("closed after {} bytes", reply.len());
        }
        reply.extend_from_slice(&chunk[..n]);
    }
    Ok(reply)
}

/// Pings with `version` every 5 ms until `stop`; the worst wait in seconds.
async fn probe(addr: std::net::SocketAddr, stop: Arc<AtomicBool>) -> Result<f64> {
    let mut conn = TcpStream::connect(addr)
        .await
        .context("connecting the prober")?;
    conn.set_nodelay(true)?;
    let mut worst = 0f64;
    while !stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        conn.write_all(b"version\r\n").await?;
        read_reply(&mut conn, false).await?;
        worst = worst.max(t0.elapsed().as_secs_f64());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(worst)
}
