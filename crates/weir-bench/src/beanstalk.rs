//! beanstalk: the beanstalkd work-queue benchmark, against Debian's beanstalkd in its
//! three durability modes, weir's door in two, and any server that speaks the
//! protocol.
//!
//! As docs/benchmarks.md defines it:
//! - **throughput**: at each connection count, every connection works on a tube of
//!   its own and repeats put (100-byte job) + reserve-with-timeout 0 (one write) then
//!   delete; one op is one job through all three. The step ends after `--jobs` ops in
//!   all or `--seconds`, whichever comes first. Rounds alternate the targets' order;
//!   the summary is the median over rounds.
//! - **memory**: the server's VmRSS and VmHWM with `--backlog` ready jobs queued, and
//!   with as many delayed jobs (a fresh spawned server for each).
//! - **restart**: with that backlog in a binlog, the server is killed (SIGKILL) and
//!   started on the same binlog; the time until it accepts, and until `stats` answers
//!   with every job back. (Both in `beanstalk_backlog.rs`.)
//!
//! beanstalkd with `-f 0` fsyncs every write, so a backlog of a million would take a
//! million fsyncs to fill: the memory and restart steps leave it out (its binlog and
//! memory are those of `-f 1000`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use tokio::runtime::Runtime;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::beanstalk_backlog;
use crate::beanstalk_params::server_output;
pub use crate::beanstalk_params::{BeanstalkParams, Servers};
use crate::beanstalk_proto::{put_reserve_request, BsConn};
use crate::beanstalk_server::BsTarget;
use crate::flood::median;
use crate::proto::payload;
use crate::report::{f, Report, Row};
use crate::sys::{process_cpu_time, CpuMeter};

/// Connections opened at once while setting up a step.
const CONNECTS_IN_FLIGHT_MAX: usize = 256;

/// The reports of a run: every round, the medians, memory, restart.
pub fn run(
    rt: &Runtime,
    servers: &Servers,
    p: &BeanstalkParams,
    bar: &ProgressBar,
    fill: &ProgressBar,
) -> Result<Vec<Report>> {
    if p.connections.is_empty() || p.connections.contains(&0) {
        bail!("beanstalk needs connection counts of at least 1");
    }
    let targets = servers.all()?;
    let backlog_targets = if p.backlog > 0 {
        servers
            .kinds
            .iter()
            .filter(|k| !k.syncs_every_write())
            .count()
            + servers.external.len()
    } else {
        0
    };
    bar.reset();
    bar.set_length((p.connections.len() * p.rounds * targets.len() + 2 * backlog_targets) as u64);
    let (rounds, medians) = throughput(rt, &targets, p, bar)?;
    drop(targets);
    let mut reports = vec![rounds, medians];
    if p.backlog > 0 {
        let (rss, restart) = beanstalk_backlog::backlog(rt, servers, p, bar, fill)?;
        reports.push(rss);
        if !p.skip_restart {
            reports.push(restart);
        }
    }
    Ok(reports)
}

/// One throughput step's outcome.
struct StepResult {
    ops: u64,
    elapsed: Duration,
    cpu_s: f64,
    server_cpu_s: Option<f64>,
}

/// Every (connections, round, target) step, then the medians over rounds.
fn throughput(
    rt: &Runtime,
    targets: &[BsTarget],
    p: &BeanstalkParams,
    bar: &ProgressBar,
) -> Result<(Report, Report)> {
    let body = Arc::new(payload(p.size));
    let request = Arc::new(put_reserve_request(&body));
    let mut rounds = Report::new(
        "beanstalk-rounds",
        format!(
            "beanstalk: put + reserve + delete of {} B jobs, each round (at most {} jobs or {} s a step)",
            p.size, p.jobs, p.seconds
        ),
    );
    for &conns in &p.connections {
        for round in 0..p.rounds {
            let mut order: Vec<&BsTarget> = targets.iter().collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for t in order {
                bar.set_message(format!("beanstalk {} x{conns}", t.name));
                let r = rt
                    .block_on(step(t, conns, p, &body, &request))
                    .with_context(|| {
                        format!(
                            "beanstalk on {} with {conns} connections{}",
                            t.name,
                            server_output(t)
                        )
                    })?;
                rounds.rows.push(step_row(t, conns, round, &r));
                bar.inc(1);
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    let medians = medians_of(&rounds, targets, p);
    Ok((rounds, medians))
}

fn step_row(t: &BsTarget, conns: usize, round: usize, r: &StepResult) -> Row {
    let secs = r.elapsed.as_secs_f64();
    let row = Row::new()
        .with("connections", conns as u64)
        .with("round", round as u64 + 1)
        .with("target", t.name.as_str())
        .with("ops", r.ops)
        .with("seconds", f(secs, 3))
        .with("ops/s", f(r.ops as f64 / secs, 0))
        .with("client_cpu_s", f(r.cpu_s, 2))
        .with("client_cpu_%", f(100.0 * r.cpu_s / secs, 0));
    match r.server_cpu_s {
        Some(s) => row
            .with("server_cpu_s", f(s, 2))
            .with("server_cpu_us/op", f(1e6 * s / r.ops.max(1) as f64, 1)),
        None => row,
    }
}

/// Per connection count and target: the median ops/s over rounds, its range, and the
/// median server CPU per op.
fn medians_of(rounds: &Report, targets: &[BsTarget], p: &BeanstalkParams) -> Report {
    let mut out = Report::new(
        "beanstalk",
        format!(
            "beanstalk: put + reserve + delete of {} B jobs, ops/s, median of {} alternating round(s)",
            p.size, p.rounds
        ),
    );
    let values = |conns: usize, t: &str, key: &str| -> Vec<f64> {
        rounds
            .rows
            .iter()
            .filter(|r| {
                r.get("connections").and_then(|c| c.as_f64()) == Some(conns as f64)
                    && r.get("target").map(|c| c.text()) == Some(t.to_string())
            })
            .filter_map(|r| r.get(key).and_then(|c| c.as_f64()))
            .collect()
    };
    for &conns in &p.connections {
        for t in targets {
            let rates = values(conns, &t.name, "ops/s");
            let lo = rates.iter().copied().fold(f64::MAX, f64::min);
            let hi = rates.iter().copied().fold(0.0, f64::max);
            let mut row = Row::new()
                .with("connections", conns as u64)
                .with("target", t.name.as_str())
                .with("ops/s", f(median(rates).unwrap_or(0.0), 0))
                .with("min", f(lo, 0))
                .with("max", f(hi, 0))
                .with(
                    "client_cpu_%",
                    f(
                        median(values(conns, &t.name, "client_cpu_%")).unwrap_or(0.0),
                        0,
                    ),
                );
            if let Some(m) = median(values(conns, &t.name, "server_cpu_us/op")) {
                row = row.with("server_cpu_us/op", f(m, 1));
            }
            out.rows.push(row);
        }
    }
    out
}

/// One throughput step on `t`: `conns` connections, each on its own tube.
async fn step(
    t: &BsTarget,
    conns: usize,
    p: &BeanstalkParams,
    body: &Arc<Vec<u8>>,
    request: &Arc<Vec<u8>>,
) -> Result<StepResult> {
    let connections = connect_all(t.addr, conns).await?;
    let (go_tx, go_rx) = watch::channel(None::<Instant>);
    let base = p.jobs / conns as u64;
    let extra = p.jobs % conns as u64;
    let mut tasks = JoinSet::new();
    for (i, mut conn) in connections.into_iter().enumerate() {
        let share = base + u64::from((i as u64) < extra);
        let (body, request, mut go) = (Arc::clone(body), Arc::clone(request), go_rx.clone());
        tasks.spawn(async move {
            let deadline = (*go
                .wait_for(|v| v.is_some())
                .await
                .context("the step was abandoned")?)
            .unwrap_or_else(Instant::now);
            let mut done = 0u64;
            while done < share && Instant::now() < deadline {
                let id = conn.put_reserve(&request, &body).await?;
                conn.delete(id).await?;
                done += 1;
            }
            Ok::<_, anyhow::Error>((Instant::now(), done))
        });
    }
    tokio::task::yield_now().await;
    let server_cpu = || t.pid.and_then(process_cpu_time);
    let server_start = server_cpu();
    let cpu = CpuMeter::start();
    let start = Instant::now();
    go_tx
        .send(Some(start + Duration::from_secs_f64(p.seconds.max(0.001))))
        .context("starting the step")?;
    let (mut end, mut ops) = (start, 0u64);
    while let Some(joined) = tasks.join_next().await {
        let (e, n) = joined.context("a connection task failed")??;
        end = end.max(e);
        ops += n;
    }
    let cpu_s = cpu.seconds();
    let server_cpu_s = match (server_start, server_cpu()) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a).as_secs_f64()),
        _ => None,
    };
    Ok(StepResult {
        ops,
        elapsed: end.duration_since(start).max(Duration::from_nanos(1)),
        cpu_s,
        server_cpu_s,
    })
}

/// Opens `conns` connections, connection `i` working on tube `weir-bench-i`.
async fn connect_all(addr: SocketAddr, conns: usize) -> Result<Vec<BsConn>> {
    let sem = Arc::new(Semaphore::new(CONNECTS_IN_FLIGHT_MAX));
    let mut tasks = JoinSet::new();
    for i in 0..conns {
        let sem = Arc::clone(&sem);
        tasks.spawn(async move {
            let _permit = sem.acquire().await.context("connect limiter closed")?;
            let mut conn = BsConn::connect(addr)
                .await
                .with_context(|| format!("connection {} of {conns}", i + 1))?;
            conn.work_on(&format!("weir-bench-{i}")).await?;
            Ok::<_, anyhow::Error>(conn)
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
    use super::*;
    use crate::beanstalk_server::{find_beanstalkd, BEANSTALKD_KINDS};

    /// The quick run against every spawned beanstalkd completes and reports sensible
    /// rows; skipped, with a message, where beanstalkd is not installed. (weir's kinds
    /// run in `tests/smoke.rs`, which has the weir binary.)
    #[test]
    fn quick_run_against_spawned_beanstalkd() {
        let Ok(bin) = find_beanstalkd(None) else {
            eprintln!("skipped: beanstalkd is not installed (Debian: apt-get install beanstalkd)");
            return;
        };
        let rt = Runtime::new().unwrap();
        let servers = Servers {
            bin: Some(bin),
            kinds: BEANSTALKD_KINDS.to_vec(),
            ..Servers::default()
        };
        let p = BeanstalkParams {
            connections: vec![1, 4],
            jobs: 200,
            seconds: 5.0,
            size: 100,
            rounds: 2,
            backlog: 2000,
            delay_seconds: 3600,
            skip_restart: false,
        };
        let hidden = ProgressBar::hidden();
        let reports = run(&rt, &servers, &p, &hidden, &hidden).unwrap();
        let names: Vec<&str> = reports.iter().map(|r| r.bench).collect();
        assert_eq!(
            names,
            [
                "beanstalk-rounds",
                "beanstalk",
                "beanstalk-rss",
                "beanstalk-restart"
            ]
        );
        // 2 counts x 2 rounds x 3 servers, every step done in full.
        assert_eq!(reports[0].rows.len(), 12);
        for row in &reports[0].rows {
            assert_eq!(row.get("ops").and_then(|c| c.as_f64()), Some(200.0));
        }
        assert_eq!(reports[1].rows.len(), 6);
        // f1000 and no binlog, ready and delayed; restarts only with a binlog.
        assert_eq!(reports[2].rows.len(), 4);
        assert_eq!(reports[3].rows.len(), 2);
    }
}
