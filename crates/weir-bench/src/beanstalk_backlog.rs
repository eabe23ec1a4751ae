//! The memory and restart steps of the `beanstalk` benchmark (docs/benchmarks.md):
//! a backlog of ready or delayed jobs put pipelined into a fresh server, its VmRSS and
//! VmHWM, then (spawned, with files) SIGKILL, a start on the same binlog or data directory, and the
//! time until the server accepts and until `stats` counts every job again.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use tokio::runtime::Runtime;

use crate::beanstalk_params::{server_output, BeanstalkParams, Servers};
use crate::beanstalk_proto::{put_request, stat_u64, BsConn};
use crate::beanstalk_server::{BsServer, BsTarget};
use crate::proto::payload;
use crate::report::{f, mib, Report, Row};
use crate::sys;

/// How long a restarted server may take to answer `stats` with every job back.
const RESTART_TIMEOUT: Duration = Duration::from_secs(300);

/// The jobs of a backlog step: ready, or delayed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum JobState {
    Ready,
    Delayed,
}

impl JobState {
    fn word(self) -> &'static str {
        match self {
            JobState::Ready => "ready",
            JobState::Delayed => "delayed",
        }
    }

    fn stat(self) -> &'static str {
        match self {
            JobState::Ready => "current-jobs-ready",
            JobState::Delayed => "current-jobs-delayed",
        }
    }
}

/// The memory and restart steps: for each server (spawned ones fresh for each state),
/// fill the backlog, read RSS, then (with a binlog) kill, restart and time the replay.
pub(crate) fn backlog(
    rt: &Runtime,
    servers: &Servers,
    p: &BeanstalkParams,
    bar: &ProgressBar,
    fill: &ProgressBar,
) -> Result<(Report, Report)> {
    let mut rss = Report::new(
        "beanstalk-rss",
        format!(
            "beanstalk: server memory with {} jobs of {} B queued (ready; delayed {} s)",
            p.backlog, p.size, p.delay_seconds
        ),
    );
    let mut restart = Report::new(
        "beanstalk-restart",
        format!(
            "beanstalk: restart with {} jobs of {} B on disk (SIGKILL, then start on the same binlog or data directory)",
            p.backlog, p.size
        ),
    );
    for &kind in &servers.kinds {
        if kind.syncs_every_write() {
            rss.notes.push(format!(
                "{}: left out (an fsync per put: {} fsyncs to fill; its memory and files are those of {})",
                kind.name(),
                p.backlog,
                if kind.is_weir() { "weir-periodic" } else { "-f 1000" }
            ));
            continue;
        }
        for state in [JobState::Ready, JobState::Delayed] {
            let mut t = servers.fresh(kind)?;
            backlog_on(rt, &mut t, state, p, fill, &mut rss, &mut restart)?;
            bar.inc(1);
        }
    }
    for mut t in servers.externals() {
        if t.pid.is_none() {
            rss.notes.push(format!(
                "{}: no RSS without its pid (give --pid {}=PID)",
                t.name, t.name
            ));
        }
        for state in [JobState::Ready, JobState::Delayed] {
            backlog_on(rt, &mut t, state, p, fill, &mut rss, &mut restart)?;
            bar.inc(1);
        }
        rss.notes.push(format!(
            "{}: a given server, so its delayed row counts the ready jobs too; the jobs stay in tubes weir-bench-ready and weir-bench-delayed",
            t.name
        ));
    }
    if restart.rows.is_empty() {
        restart.notes.push(
            "no restart measured: it needs a spawned server with files (--spawn beanstalkd-f1000 or weir-periodic)"
                .to_string(),
        );
    }
    Ok((rss, restart))
}

/// One backlog step on `t`: fill, memory, and (spawned with a binlog) restart.
fn backlog_on(
    rt: &Runtime,
    t: &mut BsTarget,
    state: JobState,
    p: &BeanstalkParams,
    fill: &ProgressBar,
    rss: &mut Report,
    restart: &mut Report,
) -> Result<()> {
    let name = t.name.clone();
    let ctx = || {
        format!(
            "beanstalk backlog of {} {} jobs on {name}",
            p.backlog,
            state.word()
        )
    };
    let idle = t.pid.and_then(|pid| sys::vm_rss_bytes(pid).ok());
    fill.reset();
    fill.set_length(p.backlog);
    fill.set_message(format!("{} {} jobs", t.name, state.word()));
    let started = Instant::now();
    rt.block_on(fill_backlog(t.addr, state, p, fill))
        .with_context(|| format!("{}{}", ctx(), server_output(t)))?;
    let fill_s = started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(200));
    let status = |field: &str| {
        t.pid
            .and_then(|pid| sys::proc_status_bytes(pid, field).ok())
    };
    let (now, hwm) = (status("VmRSS"), status("VmHWM"));
    let per_job = match (idle, now) {
        (Some(i), Some(n)) if p.backlog > 0 => Some(n.saturating_sub(i) / p.backlog),
        _ => None,
    };
    let binlog = t
        .server
        .as_ref()
        .and_then(BsServer::store_dir)
        .and_then(|d| sys::disk_usage_bytes(&d).ok());
    rss.rows.push(
        Row::new()
            .with("target", t.name.as_str())
            .with("state", format!("{} {}", p.backlog, state.word()))
            .with("idle_MiB", mib(idle))
            .with("rss_MiB", mib(now))
            .with("hwm_MiB", mib(hwm))
            .with("bytes/job", per_job)
            .with("fill_s", f(fill_s, 2))
            .with("fill_jobs/s", f(p.backlog as f64 / fill_s.max(1e-9), 0))
            .with("disk_MiB", mib(binlog))
            .with("rss_bytes", now),
    );
    if !p.skip_restart && binlog.is_some() {
        let row = restart_on(rt, t, state, p).with_context(ctx)?;
        restart.rows.push(row.with("disk_MiB", mib(binlog)));
    }
    Ok(())
}

/// Puts the backlog, pipelined on one connection, and checks that `stats` counts it.
async fn fill_backlog(
    addr: SocketAddr,
    state: JobState,
    p: &BeanstalkParams,
    fill: &ProgressBar,
) -> Result<()> {
    let mut conn = BsConn::connect(addr).await?;
    conn.work_on(&format!("weir-bench-{}", state.word()))
        .await?;
    let delay = match state {
        JobState::Ready => 0,
        JobState::Delayed => p.delay_seconds,
    };
    let request = put_request(delay, &payload(p.size));
    conn.put_pipelined(&request, p.backlog, &|k| fill.inc(k))
        .await?;
    let stats = conn.stats().await?;
    let queued = stat_u64(&stats, state.stat()).unwrap_or(0);
    if queued < p.backlog {
        bail!(
            "stats says {} {queued} after {} puts",
            state.stat(),
            p.backlog
        );
    }
    Ok(())
}

/// Kills the spawned server with SIGKILL, starts it on the same binlog, and times
/// until it accepts and until `stats` shows the whole backlog again.
fn restart_on(rt: &Runtime, t: &mut BsTarget, state: JobState, p: &BeanstalkParams) -> Result<Row> {
    let server = t
        .server
        .as_mut()
        .context("restart needs a spawned server")?;
    server.kill(libc::SIGKILL)?;
    let started = Instant::now();
    server.start()?;
    server.wait_accepting()?;
    let accept_s = started.elapsed().as_secs_f64();
    let addr = server.addr;
    rt.block_on(async {
        tokio::time::timeout(RESTART_TIMEOUT, wait_for_jobs(addr, state, p.backlog))
            .await
            .with_context(|| format!("the jobs were not back within {RESTART_TIMEOUT:?}"))?
    })?;
    let serving_s = started.elapsed().as_secs_f64();
    t.refresh_pid();
    let after = t.pid.and_then(|pid| sys::vm_rss_bytes(pid).ok());
    Ok(Row::new()
        .with("target", t.name.as_str())
        .with("state", format!("{} {}", p.backlog, state.word()))
        .with("signal", "KILL")
        .with("accept_s", f(accept_s, 3))
        .with("jobs_back_s", f(serving_s, 3))
        .with("rss_MiB", mib(after)))
}

/// Asks `stats` until it counts `jobs` in `state` (reconnecting while the server
/// comes up).
async fn wait_for_jobs(addr: SocketAddr, state: JobState, jobs: u64) -> Result<()> {
    loop {
        if let Ok(mut conn) = BsConn::connect(addr).await {
            if let Ok(stats) = conn.stats().await {
                let n = stat_u64(&stats, state.stat()).unwrap_or(0);
                if n >= jobs {
                    return Ok(());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
