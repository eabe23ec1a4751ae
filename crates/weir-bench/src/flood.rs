//! flood: many connections, each alternating `set` and `get` over ten queues.
//!
//! DESIGN.md section 4: 64-byte items spread over `db_bench0`..`db_bench9` (each
//! request picks a queue at random), 1,000,000 sets + 1,000,000 gets split evenly over
//! the connections, for each connection count of the seeds' list. All connections are
//! open before the clock starts; the clock runs from the first request to the last
//! reply; a miss (`END` alone) counts as an operation, as in the seeds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::proto::{get_request, payload, set_request, Conn};
use crate::report::{f, Report, Row};
use crate::sys::{process_cpu_time, CpuMeter};
use crate::target::Target;

/// Connections opened at once while setting up a step (a server's listen backlog is
/// finite; memcached's default is 1024).
const CONNECTS_IN_FLIGHT_MAX: usize = 256;
/// Read buffer per connection: a flood reply is under 100 bytes, and 8000 connections
/// must not cost the client hundreds of MiB.
const READ_BUFFER_BYTES: usize = 2048;

#[derive(Clone, Debug)]
pub struct FloodParams {
    pub connections: Vec<usize>,
    /// Sets in total per step (as many gets again).
    pub sets: u64,
    pub queues: usize,
    pub item_bytes: usize,
}

/// One step's outcome.
struct StepResult {
    ops: u64,
    misses: u64,
    elapsed: Duration,
    cpu_s: f64,
    /// The server's CPU seconds over the step, when its pid is known.
    server_cpu_s: Option<f64>,
}

/// A tiny xorshift generator: the queue choice must cost nothing next to a request.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

struct Requests {
    sets: Vec<Vec<u8>>,
    gets: Vec<Vec<u8>>,
    item_bytes: usize,
}

pub async fn run(targets: &[Target], p: &FloodParams, bar: &ProgressBar) -> Result<Report> {
    if p.queues == 0 || p.connections.is_empty() {
        bail!("flood needs at least one queue and one connection count");
    }
    let data = payload(p.item_bytes);
    let requests = Arc::new(Requests {
        sets: (0..p.queues)
            .map(|i| set_request(&format!("db_bench{i}"), &data))
            .collect(),
        gets: (0..p.queues)
            .map(|i| get_request(&format!("db_bench{i}")))
            .collect(),
        item_bytes: p.item_bytes,
    });
    let mut report = Report::new(
        "flood",
        format!(
            "flood: {} B items over {} queues, {} sets + {} gets per step",
            p.item_bytes, p.queues, p.sets, p.sets
        ),
    );
    bar.set_length((p.connections.len() * targets.len()) as u64);
    for &conns in &p.connections {
        for target in targets {
            bar.set_message(format!("flood {} x{conns}", target.name));
            let r = step(target, conns, p.sets, &requests)
                .await
                .with_context(|| format!("flood on {} with {conns} connections", target.name))?;
            let secs = r.elapsed.as_secs_f64();
            let server_cpu = |row: Row| match r.server_cpu_s {
                Some(s) => row
                    .with("server_cpu_s", f(s, 2))
                    .with("server_cpu_us/op", f(1e6 * s / r.ops.max(1) as f64, 2)),
                None => row,
            };
            report.rows.push(server_cpu(
                Row::new()
                    .with("connections", conns as u64)
                    .with("target", target.name.as_str())
                    .with("ops", r.ops)
                    .with("misses", r.misses)
                    .with("seconds", f(secs, 3))
                    .with("ops/s", f(r.ops as f64 / secs, 0))
                    .with("client_cpu_s", f(r.cpu_s, 2))
                    .with("client_cpu_%", f(100.0 * r.cpu_s / secs, 0)),
            ));
            bar.inc(1);
            // Let the server retire the closed connections before the next step.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    add_ratio_notes(&mut report, targets);
    Ok(report)
}

/// "weir/memcached at N connections: 0.93" for each connection count.
fn add_ratio_notes(report: &mut Report, targets: &[Target]) {
    if targets.len() < 2 {
        return;
    }
    let first = &targets[0].name;
    for other in &targets[1..] {
        let mut parts = Vec::new();
        for row in &report.rows {
            let (Some(c), Some(t)) = (row.get("connections"), row.get("target")) else {
                continue;
            };
            if !matches!(t, crate::report::Cell::Text(s) if s == first) {
                continue;
            }
            let rate = |name: &str| {
                report
                    .rows
                    .iter()
                    .find(|r| {
                        r.get("connections").and_then(|x| x.as_f64()) == c.as_f64()
                            && matches!(r.get("target"), Some(crate::report::Cell::Text(s)) if s == name)
                    })
                    .and_then(|r| r.get("ops/s"))
                    .and_then(|x| x.as_f64())
            };
            if let (Some(a), Some(b)) = (rate(first), rate(&other.name)) {
                parts.push(format!("{}:{:.2}", c.as_f64().unwrap_or(0.0), a / b));
            }
        }
        report.notes.push(format!(
            "ratio {first}/{} by connections: {}",
            other.name,
            parts.join(" ")
        ));
    }
}

async fn step(
    target: &Target,
    conns: usize,
    sets: u64,
    requests: &Arc<Requests>,
) -> Result<StepResult> {
    let connections = connect_all(target, conns).await?;
    let (go_tx, go_rx) = watch::channel(false);
    let base = sets / conns as u64;
    let extra = sets % conns as u64;
    let mut tasks = JoinSet::new();
    for (i, mut conn) in connections.into_iter().enumerate() {
        let pairs = base + u64::from((i as u64) < extra);
        let requests = Arc::clone(requests);
        let mut go = go_rx.clone();
        tasks.spawn(async move {
            go.wait_for(|v| *v)
                .await
                .context("the step was abandoned")?;
            let mut rng = XorShift((i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let queues = requests.sets.len() as u64;
            let mut misses = 0u64;
            for _ in 0..pairs {
                let q = (rng.next() % queues) as usize;
                conn.set(&requests.sets[q]).await?;
                let q = (rng.next() % queues) as usize;
                match conn.get(&requests.gets[q]).await? {
                    Some(len) if len != requests.item_bytes => {
                        bail!(
                            "got an item of {len} bytes, sent only {} byte items",
                            requests.item_bytes
                        )
                    }
                    Some(_) => {}
                    None => misses += 1,
                }
            }
            Ok::<_, anyhow::Error>((Instant::now(), pairs * 2, misses))
        });
    }
    // Give every task the chance to park on the start signal.
    tokio::task::yield_now().await;
    let server_cpu_start = target.pid.and_then(process_cpu_time);
    let cpu = CpuMeter::start();
    let start = Instant::now();
    go_tx.send(true).context("starting the step")?;
    let mut end = start;
    let mut ops = 0u64;
    let mut misses = 0u64;
    while let Some(joined) = tasks.join_next().await {
        let (t, o, m) = joined.context("a connection task failed")??;
        end = end.max(t);
        ops += o;
        misses += m;
    }
    let cpu_s = cpu.seconds();
    let server_cpu_s = match (server_cpu_start, target.pid.and_then(process_cpu_time)) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a).as_secs_f64()),
        _ => None,
    };
    Ok(StepResult {
        ops,
        misses,
        elapsed: end.duration_since(start).max(Duration::from_nanos(1)),
        cpu_s,
        server_cpu_s,
    })
}

/// Opens `conns` connections, a bounded number at a time.
async fn connect_all(target: &Target, conns: usize) -> Result<Vec<Conn>> {
    let sem = Arc::new(Semaphore::new(CONNECTS_IN_FLIGHT_MAX));
    let mut tasks = JoinSet::new();
    for i in 0..conns {
        let sem = Arc::clone(&sem);
        let addr = target.addr;
        tasks.spawn(async move {
            let _permit = sem.acquire().await.context("connect limiter closed")?;
            Conn::connect(addr, READ_BUFFER_BYTES)
                .await
                .with_context(|| format!("connection {} of {conns}", i + 1))
        });
    }
    let mut out = Vec::with_capacity(conns);
    while let Some(joined) = tasks.join_next().await {
        out.push(joined.context("a connect task failed")??);
    }
    Ok(out)
}
