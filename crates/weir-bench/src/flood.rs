//! flood: many connections, each alternating `set` and `get` over ten queues.
//!
//! As docs/benchmarks.md defines it: 64-byte items spread over `db_bench0`..`db_bench9` (each
//! request picks a queue at random), 1,000,000 sets + 1,000,000 gets split evenly over
//! the connections, for each connection count of the seeds' list. All connections are
//! open before the clock starts; the clock runs from the first request to the last
//! reply; a miss (`END` alone) counts as an operation, as in the seeds.

use std::net::SocketAddr;
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
    /// Rounds per connection count (see `--flood-repeat`).
    pub repeat: usize,
}

/// One step's outcome.
pub(crate) struct StepResult {
    pub ops: u64,
    pub misses: u64,
    pub elapsed: Duration,
    pub cpu_s: f64,
    /// The server's CPU seconds over the step (all servers', when the step ran over
    /// several), when every pid is known.
    pub server_cpu_s: Option<f64>,
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

/// The prebuilt requests of a flood: a `set` and a `get` for each queue.
pub(crate) struct Requests {
    sets: Vec<Vec<u8>>,
    gets: Vec<Vec<u8>>,
    item_bytes: usize,
}

impl Requests {
    /// Requests for `db_bench0`..`db_bench{queues-1}`, items of `item_bytes`.
    pub(crate) fn new(queues: usize, item_bytes: usize) -> Arc<Requests> {
        let data = payload(item_bytes);
        Arc::new(Requests {
            sets: (0..queues)
                .map(|i| set_request(&format!("db_bench{i}"), &data))
                .collect(),
            gets: (0..queues)
                .map(|i| get_request(&format!("db_bench{i}")))
                .collect(),
            item_bytes,
        })
    }
}

pub async fn run(targets: &[Target], p: &FloodParams, bar: &ProgressBar) -> Result<Report> {
    if p.queues == 0 || p.connections.is_empty() {
        bail!("flood needs at least one queue and one connection count");
    }
    let requests = Requests::new(p.queues, p.item_bytes);
    let mut report = Report::new(
        "flood",
        format!(
            "flood: {} B items over {} queues, {} sets + {} gets per step",
            p.item_bytes, p.queues, p.sets, p.sets
        ),
    );
    bar.set_length((p.connections.len() * targets.len() * p.repeat) as u64);
    let rounds = p.repeat.max(1);
    for &conns in &p.connections {
        for round in 0..rounds {
            let mut order: Vec<&Target> = targets.iter().collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for target in order {
                bar.set_message(format!("flood {} x{conns}", target.name));
                let r = step(target, conns, p.sets, &requests)
                    .await
                    .with_context(|| {
                        format!("flood on {} with {conns} connections", target.name)
                    })?;
                let secs = r.elapsed.as_secs_f64();
                let server_cpu = |row: Row| match r.server_cpu_s {
                    Some(s) => row
                        .with("server_cpu_s", f(s, 2))
                        .with("server_cpu_us/op", f(1e6 * s / r.ops.max(1) as f64, 2)),
                    None => row,
                };
                let row = Row::new().with("connections", conns as u64);
                let row = if rounds > 1 {
                    row.with("round", round as u64 + 1)
                } else {
                    row
                };
                report.rows.push(server_cpu(
                    row.with("target", target.name.as_str())
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
    }
    add_ratio_notes(&mut report, targets);
    Ok(report)
}

/// Per connection count, the first target's rate over each other's (the median over
/// rounds, with every round's ratio when there are several), and for each target its
/// rate at the most connections over its own peak (medians over rounds).
/// The ops/s of each (connections, round, target) of a flood report.
struct Rates(Vec<(u64, u64, String, f64)>);

impl Rates {
    fn of(report: &Report) -> Rates {
        use crate::report::Cell;
        let mut rates = Vec::new();
        for row in &report.rows {
            let (Some(c), Some(Cell::Text(t)), Some(r)) = (
                row.get("connections").and_then(|x| x.as_f64()),
                row.get("target"),
                row.get("ops/s").and_then(|x| x.as_f64()),
            ) else {
                continue;
            };
            let round = row.get("round").and_then(|x| x.as_f64()).unwrap_or(1.0);
            rates.push((c as u64, round as u64, t.clone(), r));
        }
        Rates(rates)
    }

    /// The connection counts, in the order run.
    fn counts(&self) -> Vec<u64> {
        let mut counts: Vec<u64> = self.0.iter().map(|r| r.0).collect();
        counts.dedup();
        counts
    }

    fn rate(&self, c: u64, round: u64, t: &str) -> Option<f64> {
        self.0
            .iter()
            .find(|r| r.0 == c && r.1 == round && r.2 == t)
            .map(|r| r.3)
    }

    fn rounds(&self, c: u64) -> Vec<u64> {
        let mut rs: Vec<u64> = self.0.iter().filter(|r| r.0 == c).map(|r| r.1).collect();
        rs.sort_unstable();
        rs.dedup();
        rs
    }

    fn median_rate(&self, c: u64, t: &str) -> Option<f64> {
        median(
            self.rounds(c)
                .into_iter()
                .filter_map(|round| self.rate(c, round, t))
                .collect(),
        )
    }

    /// `first`/`other` by connection count: the median over rounds, and each round.
    fn ratio_note(&self, first: &str, other: &str) -> String {
        let counts = self.counts();
        let mut parts = Vec::new();
        for &c in &counts {
            let per_round: Vec<f64> = self
                .rounds(c)
                .into_iter()
                .filter_map(|round| Some(self.rate(c, round, first)? / self.rate(c, round, other)?))
                .collect();
            let Some(m) = median(per_round.clone()) else {
                continue;
            };
            if per_round.len() > 1 {
                let each: Vec<String> = per_round.iter().map(|r| format!("{r:.2}")).collect();
                parts.push(format!("{c}:{m:.2} ({})", each.join(",")));
            } else {
                parts.push(format!("{c}:{m:.2}"));
            }
        }
        let rounds = self.rounds(counts.first().copied().unwrap_or(0)).len();
        let what = if rounds > 1 { ", median (rounds)" } else { "" };
        format!(
            "ratio {first}/{other} by connections{what}: {}",
            parts.join(" ")
        )
    }

    /// A target's rate at the most connections against its peak, when they differ.
    fn peak_note(&self, t: &str) -> Option<String> {
        let counts = self.counts();
        let peak = counts
            .iter()
            .filter_map(|&c| Some((c, self.median_rate(c, t)?)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let last = counts
            .last()
            .and_then(|&c| Some((c, self.median_rate(c, t)?)));
        let ((pc, p), (lc, l)) = (peak?, last?);
        (pc != lc).then(|| {
            format!(
                "{t}: {l:.0} ops/s at {lc} connections = {:.2} x its peak ({p:.0} at {pc})",
                l / p
            )
        })
    }
}

fn add_ratio_notes(report: &mut Report, targets: &[Target]) {
    let rates = Rates::of(report);
    if let Some((first, others)) = targets.split_first() {
        for other in others {
            report
                .notes
                .push(rates.ratio_note(&first.name, &other.name));
        }
    }
    for t in targets {
        report.notes.extend(rates.peak_note(&t.name));
    }
}

/// The median of `values` (the mean of the middle two for an even count).
pub(crate) fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    })
}

async fn step(
    target: &Target,
    conns: usize,
    sets: u64,
    requests: &Arc<Requests>,
) -> Result<StepResult> {
    let pids: Vec<u32> = target.pid.into_iter().collect();
    step_over(&[target.addr], &pids, conns, sets, requests).await
}

/// A flood step whose connections are dealt round-robin over `addrs` (several front
/// doors of one queue store); `pids` are the servers whose CPU time is measured (all
/// of them, or the figure is left out).
pub(crate) async fn step_over(
    addrs: &[SocketAddr],
    pids: &[u32],
    conns: usize,
    sets: u64,
    requests: &Arc<Requests>,
) -> Result<StepResult> {
    let connections = connect_all(addrs, conns).await?;
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
    let server_cpu_start = servers_cpu_time(pids);
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
    let server_cpu_s = match (server_cpu_start, servers_cpu_time(pids)) {
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

/// The CPU time of all `pids` together; `None` when there are none or one is unreadable.
fn servers_cpu_time(pids: &[u32]) -> Option<Duration> {
    if pids.is_empty() {
        return None;
    }
    pids.iter()
        .map(|&p| process_cpu_time(p))
        .sum::<Option<Duration>>()
}

/// Opens `conns` connections, dealt round-robin over `addrs`, a bounded number at a time.
async fn connect_all(addrs: &[SocketAddr], conns: usize) -> Result<Vec<Conn>> {
    if addrs.is_empty() {
        bail!("a flood step needs at least one server address");
    }
    let sem = Arc::new(Semaphore::new(CONNECTS_IN_FLIGHT_MAX));
    let mut tasks = JoinSet::new();
    for i in 0..conns {
        let sem = Arc::clone(&sem);
        let addr = addrs[i % addrs.len()];
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

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }
}
