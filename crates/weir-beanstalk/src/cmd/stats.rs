//! `stats-job`, `stats-tube`, `stats`, `list-tubes`, `list-tubes-watched`: the YAML
//! documents of beanstalkd 1.12, key for key, in its order. Values weir does not
//! keep are 0 (listed in docs/beanstalk.md): urgent counts, per-job
//! timeout/release/bury/kick counts, per-tube `cmd-delete`, rusage, the binlog's.

use std::collections::BTreeSet;
use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;

use weir_backend::jobs::{JobState, TubeStats};
use weir_backend::Error;

use crate::cmd::ctx::Ctx;
use crate::command::Command;
use crate::names;
use crate::reply;
use crate::session::Named;

/// Whether the tube exists: it has a queue, or a connection refers to it, or it is
/// `default` (which beanstalkd always has).
pub async fn tube_exists(ctx: &Ctx<'_>, named: &Named) -> Result<bool, Error> {
    if named.tube == "default" || ctx.shared.tube_state(&named.tube) != Default::default() {
        return Ok(true);
    }
    let stats = ctx
        .shared
        .backend
        .stats(Some(vec![named.queue.clone()]))
        .await?;
    Ok(!stats.is_empty())
}

fn state_name(state: JobState) -> &'static str {
    match state {
        JobState::Ready => "ready",
        JobState::Reserved => "reserved",
        JobState::Buried => "buried",
        JobState::Delayed => "delayed",
    }
}

pub async fn stats_job(ctx: &mut Ctx<'_>, id: u64) {
    let found = match ctx.shared.backend.find_job(id).await {
        Ok(Some(found)) => found,
        Ok(None) => return ctx.reply(reply::NOT_FOUND),
        Err(e) => return ctx.failed("stats-job", &e),
    };
    let Some(tube) = names::tube_of(&found.tube) else {
        return ctx.reply(reply::NOT_FOUND);
    };
    // What this connection knows of a job it holds; another's is not seen.
    let held = ctx.session.held.get(&id);
    let now_ms = weir_backend::now_ms();
    let job = &found.job;
    let (delay_ms, time_left) = match held {
        Some(h) => (0, h.tube.time_left(&h.reserved).map_or(0, |d| d.as_secs())),
        None if job.due_ms > 0 => (
            job.due_ms.saturating_sub(job.enqueued_at_ms),
            job.due_ms.saturating_sub(now_ms) / 1000,
        ),
        None => (0, 0),
    };
    let reserves = held.map_or(0, |h| h.reserved.deliveries);
    let age_ms = now_ms.saturating_sub(job.enqueued_at_ms);
    let mut y = String::from("---\n");
    let _ = write!(
        y,
        "id: {id}\ntube: {tube}\nstate: {}\npri: {}\nage: {}\ndelay: {}\nttr: {}\n\
         time-left: {time_left}\nfile: 0\nreserves: {reserves}\ntimeouts: 0\n\
         releases: 0\nburies: 0\nkicks: 0\n",
        state_name(found.state),
        found.job.priority,
        age_ms / 1000,
        delay_ms / 1000,
        found.job.ttr.as_secs(),
    );
    reply::ok(ctx.out, y.as_bytes());
}

pub async fn stats_tube(ctx: &mut Ctx<'_>, tube: &str) {
    let Some(named) = Named::new(tube) else {
        return ctx.reply(reply::NOT_FOUND);
    };
    match tube_exists(ctx, &named).await {
        Ok(true) => {}
        Ok(false) => return ctx.reply(reply::NOT_FOUND),
        Err(e) => return ctx.failed("stats-tube", &e),
    }
    let stats = match tube_stats(ctx, &named.queue).await {
        Ok(stats) => stats,
        Err(e) => return ctx.failed("stats-tube", &e),
    };
    let state = ctx.shared.tube_state(tube);
    let left = state.paused_until.map_or(0, |u| {
        u.saturating_duration_since(std::time::Instant::now())
            .as_secs()
    });
    let pause = if state.paused_until.is_some() {
        state.pause.as_secs()
    } else {
        0
    };
    let mut y = String::from("---\n");
    let _ = write!(
        y,
        "name: {tube}\ncurrent-jobs-urgent: 0\ncurrent-jobs-ready: {}\n\
         current-jobs-reserved: {}\ncurrent-jobs-delayed: {}\ncurrent-jobs-buried: {}\n\
         total-jobs: {}\ncurrent-using: {}\ncurrent-watching: {}\ncurrent-waiting: {}\n\
         cmd-delete: 0\ncmd-pause-tube: {}\npause: {pause}\npause-time-left: {left}\n",
        stats.ready,
        stats.reserved,
        stats.delayed,
        stats.buried,
        stats.total_put,
        state.using,
        state.watching,
        state.waiting,
        state.pauses,
    );
    reply::ok(ctx.out, y.as_bytes());
}

async fn tube_stats(ctx: &Ctx<'_>, queue: &str) -> Result<TubeStats, Error> {
    ctx.shared.backend.tube(queue).await?.stats().await
}

/// Every tube: `default`, each queue whose name is a tube's, and each tube a
/// connection refers to.
async fn all_tubes(ctx: &Ctx<'_>) -> Result<BTreeSet<String>, Error> {
    let mut tubes: BTreeSet<String> = ctx.shared.known_tubes().into_iter().collect();
    tubes.insert("default".to_owned());
    for queue in ctx.shared.backend.stats(None).await? {
        if let Some(tube) = names::tube_of(&queue.name) {
            tubes.insert(tube);
        }
    }
    Ok(tubes)
}

pub async fn list_tubes(ctx: &mut Ctx<'_>) {
    match all_tubes(ctx).await {
        Ok(tubes) => {
            let mut y = Vec::new();
            reply::tube_list(&mut y, tubes.iter().map(String::as_str));
            reply::ok(ctx.out, &y);
        }
        Err(e) => ctx.failed("list-tubes", &e),
    }
}

pub fn list_tubes_watched(ctx: &mut Ctx<'_>) {
    let mut y = Vec::new();
    reply::tube_list(&mut y, ctx.session.watched.iter().map(|n| n.tube.as_str()));
    reply::ok(ctx.out, &y);
}

/// The job counts of every tube, summed, and the tube count.
async fn totals(ctx: &Ctx<'_>) -> Result<(TubeStats, usize), Error> {
    let tubes = all_tubes(ctx).await?;
    let mut sum = TubeStats::default();
    for tube in &tubes {
        let Some(queue) = names::queue_of(tube) else {
            continue;
        };
        if ctx
            .shared
            .backend
            .stats(Some(vec![queue.clone()]))
            .await?
            .is_empty()
        {
            continue;
        }
        let s = tube_stats(ctx, &queue).await?;
        sum.ready += s.ready;
        sum.reserved += s.reserved;
        sum.buried += s.buried;
        sum.delayed += s.delayed;
        sum.total_put += s.total_put;
    }
    Ok((sum, tubes.len()))
}

/// A small file of `/proc`, trimmed; empty when it cannot be read.
fn proc_text(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

pub async fn stats(ctx: &mut Ctx<'_>) {
    let (sum, tube_count) = match totals(ctx).await {
        Ok(totals) => totals,
        Err(e) => return ctx.failed("stats", &e),
    };
    let c = &ctx.shared.counters;
    let mut y = String::from("---\n");
    let _ = write!(
        y,
        "current-jobs-urgent: 0\ncurrent-jobs-ready: {}\ncurrent-jobs-reserved: {}\n\
         current-jobs-delayed: {}\ncurrent-jobs-buried: {}\n",
        sum.ready, sum.reserved, sum.delayed, sum.buried
    );
    for (key, command) in COUNTED {
        let _ = writeln!(y, "{key}: {}", c.of(command));
    }
    let s = ctx.shared;
    let _ = write!(
        y,
        "job-timeouts: 0\ntotal-jobs: {}\nmax-job-size: {}\ncurrent-tubes: {tube_count}\n\
         current-connections: {}\ncurrent-producers: {}\ncurrent-workers: {}\n\
         current-waiting: {}\ntotal-connections: {}\npid: {}\nversion: \"weir-{}\"\n\
         rusage-utime: 0.000000\nrusage-stime: 0.000000\nuptime: {}\n\
         binlog-oldest-index: 0\nbinlog-current-index: 0\nbinlog-records-migrated: 0\n\
         binlog-records-written: 0\nbinlog-max-size: 0\ndraining: {}\nid: {}\n\
         hostname: {}\nos: {}\nplatform: {}\n",
        sum.total_put,
        s.settings.parse.job_bytes_max,
        c.connections_current.load(Relaxed),
        c.producers.load(Relaxed),
        c.workers.load(Relaxed),
        c.waiting.load(Relaxed),
        c.connections_total.load(Relaxed),
        std::process::id(),
        env!("CARGO_PKG_VERSION"),
        s.started.elapsed().as_secs(),
        s.is_stopping(),
        s.instance_id,
        proc_text("/proc/sys/kernel/hostname"),
        proc_text("/proc/sys/kernel/version"),
        std::env::consts::ARCH,
    );
    reply::ok(ctx.out, y.as_bytes());
}

/// The `cmd-*` keys of `stats`, in beanstalkd's order.
const COUNTED: [(&str, Command); 22] = [
    ("cmd-put", Command::Put),
    ("cmd-peek", Command::Peek),
    ("cmd-peek-ready", Command::PeekReady),
    ("cmd-peek-delayed", Command::PeekDelayed),
    ("cmd-peek-buried", Command::PeekBuried),
    ("cmd-reserve", Command::Reserve),
    ("cmd-reserve-with-timeout", Command::ReserveWithTimeout),
    ("cmd-delete", Command::Delete),
    ("cmd-release", Command::Release),
    ("cmd-use", Command::Use),
    ("cmd-watch", Command::Watch),
    ("cmd-ignore", Command::Ignore),
    ("cmd-bury", Command::Bury),
    ("cmd-kick", Command::Kick),
    ("cmd-touch", Command::Touch),
    ("cmd-stats", Command::Stats),
    ("cmd-stats-job", Command::StatsJob),
    ("cmd-stats-tube", Command::StatsTube),
    ("cmd-list-tubes", Command::ListTubes),
    ("cmd-list-tube-used", Command::ListTubeUsed),
    ("cmd-list-tubes-watched", Command::ListTubesWatched),
    ("cmd-pause-tube", Command::PauseTube),
];
