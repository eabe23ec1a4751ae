//! packing (1 KiB) and packing/unpacking (64 B): one queue's backlog grows (and for
//! packing/unpacking, drains again) step by step; at each step one connection runs
//! interleaved `set`/`get` pairs and we time them.
//!
//! Only the timed part follows the seeds' one-connection request/reply loop. Building
//! the backlog between steps uses pipelined sets (and gets, to drain) in large
//! batches, because at the seeds' sizes (up to 265 million items) a request/reply
//! loop would take hours and measure nothing. The item count each row shows comes from
//! the server's `stats` (`queue_NAME_items`).
//!
//! After building the backlog, and before the clock starts, the bench calls `sync(2)`
//! (the servers run on this machine): right after gigabytes of pipelined sets the
//! kernel is still writing dirty pages back and throttles every writer, and the step
//! would time the fill instead of a queue with that backlog.
//!
//! memcached has no queues: its sets overwrite one key, so it keeps one item whatever
//! the step. It is run unfilled, as the reference for the speed of the protocol on
//! this machine; its rows show `curr_items`.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;

use crate::proto::{get_request, payload, set_request, stat_u64, Conn, Pipelined};
use crate::report::{f, mib, Report, Row};
use crate::sys::CpuMeter;
use crate::target::Target;

const READ_BUFFER_BYTES: usize = 256 * 1024;

#[derive(Clone, Debug)]
pub struct PackingParams {
    /// `packing` or `packing-unpacking`.
    pub bench: &'static str,
    pub queue: String,
    pub item_bytes: usize,
    /// Backlog at each step, in order.
    pub steps: Vec<u64>,
    /// Sets per step (as many gets again), interleaved on one connection.
    pub ops: u64,
}

/// Growth steps followed by drains of `drain_step` items back to 0.
pub fn grow_then_drain(grow: &[u64], drain_step: u64) -> Vec<u64> {
    let mut steps = grow.to_vec();
    let mut left = grow.last().copied().unwrap_or(0);
    if drain_step == 0 {
        return steps;
    }
    while left > 0 {
        left = left.saturating_sub(drain_step);
        steps.push(left);
    }
    steps
}

/// Does this server keep items per queue (`queue_NAME_items` in stats)? Checked by
/// storing one item and looking; the item is taken back.
async fn has_queues(conn: &mut Conn, queue: &str, set: &[u8], get: &[u8]) -> Result<bool> {
    conn.set(set).await.context("probe set")?;
    let stats = conn.stats().await.context("probe stats")?;
    let queues = stat_u64(&stats, &format!("queue_{queue}_items")).is_some();
    conn.get(get).await.context("probe get")?;
    Ok(queues)
}

async fn item_count(conn: &mut Conn, queue: &str, queues: bool) -> Result<u64> {
    let stats = conn.stats().await?;
    let key = if queues {
        format!("queue_{queue}_items")
    } else {
        "curr_items".to_string()
    };
    stat_u64(&stats, &key).with_context(|| format!("stats has no {key}"))
}

pub async fn run(
    targets: &[Target],
    p: &PackingParams,
    bar: &ProgressBar,
    fill_bar: &ProgressBar,
) -> Result<Report> {
    let data = payload(p.item_bytes);
    let set = set_request(&p.queue, &data);
    let get = get_request(&p.queue);
    let mut report = Report::new(
        p.bench,
        format!(
            "{}: {} B items in one queue, {} sets + {} gets per step on 1 connection",
            p.bench, p.item_bytes, p.ops, p.ops
        ),
    );
    bar.set_length((p.steps.len() * targets.len()) as u64);
    for target in targets {
        let mut conn = Conn::connect(target.addr, READ_BUFFER_BYTES).await?;
        let queues = has_queues(&mut conn, &p.queue, &set, &get)
            .await
            .with_context(|| format!("{} on {}: probing stats", p.bench, target.name))?;
        if !queues {
            report.notes.push(format!(
                "{}: no per-queue stats (not a queue server): run without backlog, as the speed reference",
                target.name
            ));
        }
        for &backlog in &p.steps {
            bar.set_message(format!("{} {} backlog {backlog}", p.bench, target.name));
            let ctx = || format!("{} on {} at backlog {backlog}", p.bench, target.name);
            if queues {
                adjust_backlog(&mut conn, p, backlog, &set, &get, fill_bar)
                    .await
                    .with_context(ctx)?;
            }
            // See the module docs: let the fill's writeback finish before timing.
            sync_all().await?;
            let before = item_count(&mut conn, &p.queue, queues)
                .await
                .with_context(ctx)?;
            let cpu = CpuMeter::start();
            let start = Instant::now();
            let misses = set_get_pairs(&mut conn, p, &set, &get)
                .await
                .with_context(ctx)?;
            let secs = start.elapsed().as_secs_f64().max(1e-9);
            let cpu_s = cpu.seconds();
            let after = item_count(&mut conn, &p.queue, queues)
                .await
                .with_context(ctx)?;
            let counts = (before, after, misses);
            report
                .rows
                .push(step_row(target, backlog, counts, 2 * p.ops, secs, cpu_s));
            bar.inc(1);
        }
    }
    add_flatness_notes(&mut report, targets);
    Ok(report)
}

/// sync(2) on the blocking pool.
async fn sync_all() -> Result<()> {
    tokio::task::spawn_blocking(|| {
        // SAFETY: sync(2) takes no arguments and touches no memory of ours.
        unsafe { libc::sync() }
    })
    .await
    .context("waiting for sync(2)")
}

/// A step's row; `counts` are the items before and after, and the misses.
fn step_row(
    target: &Target,
    backlog: u64,
    (before, after, misses): (u64, u64, u64),
    ops: u64,
    secs: f64,
    cpu_s: f64,
) -> Row {
    Row::new()
        .with("backlog", backlog)
        .with("target", target.name.as_str())
        .with("items_before", before)
        .with("items_after", after)
        .with("ops", ops)
        .with("misses", misses)
        .with("seconds", f(secs, 3))
        .with("ops/s", f(ops as f64 / secs, 0))
        .with("client_cpu_s", f(cpu_s, 2))
        .with("client_cpu_%", f(100.0 * cpu_s / secs, 0))
        .with("disk_MiB", mib(target.disk_bytes()))
        .with("rss_MiB", mib(target.rss_bytes()))
}

/// The timed part of a step: `p.ops` pairs of one set and one get; returns the misses.
async fn set_get_pairs(conn: &mut Conn, p: &PackingParams, set: &[u8], get: &[u8]) -> Result<u64> {
    let mut misses = 0u64;
    for _ in 0..p.ops {
        conn.set(set).await?;
        match conn.get(get).await? {
            Some(len) if len != p.item_bytes => {
                bail!("got an item of {len} bytes, sent {}", p.item_bytes)
            }
            Some(_) => {}
            None => misses += 1,
        }
    }
    Ok(misses)
}

/// Fills (pipelined sets) or drains (pipelined gets) the queue to `backlog` items.
async fn adjust_backlog(
    conn: &mut Conn,
    p: &PackingParams,
    backlog: u64,
    set: &[u8],
    get: &[u8],
    fill_bar: &ProgressBar,
) -> Result<()> {
    let current = item_count(conn, &p.queue, true).await?;
    if current == backlog {
        return Ok(());
    }
    let (kind, count) = if current < backlog {
        (Pipelined::Set, backlog - current)
    } else {
        (Pipelined::Get, current - backlog)
    };
    fill_bar.reset();
    fill_bar.set_length(count);
    fill_bar.set_message(match kind {
        Pipelined::Set => "filling",
        Pipelined::Get => "draining",
    });
    let request = match kind {
        Pipelined::Set => set,
        Pipelined::Get => get,
    };
    let (_, misses) = conn
        .pipelined(request, count, kind, &|n| fill_bar.inc(n))
        .await?;
    if misses > 0 {
        bail!("draining {count} items found the queue empty {misses} times");
    }
    Ok(())
}

/// The seeds' yardstick: rate at the deepest backlog against the rate at the first step.
fn add_flatness_notes(report: &mut Report, targets: &[Target]) {
    for target in targets {
        let rows: Vec<&Row> = report
            .rows
            .iter()
            .filter(|r| matches!(r.get("target"), Some(crate::report::Cell::Text(s)) if *s == target.name))
            .collect();
        let rate = |r: &Row| r.get("ops/s").and_then(|c| c.as_f64());
        let deepest = rows
            .iter()
            .max_by_key(|r| r.get("backlog").and_then(|c| c.as_f64()).unwrap_or(0.0) as u64);
        if let (Some(first), Some(deep)) = (rows.first(), deepest) {
            if let (Some(a), Some(b)) = (rate(first), rate(deep)) {
                report.notes.push(format!(
                    "{}: rate at the deepest backlog / rate at the first step = {:.2}",
                    target.name,
                    b / a
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_back_to_zero() {
        assert_eq!(grow_then_drain(&[0, 10, 25], 10), vec![0, 10, 25, 15, 5, 0]);
        assert_eq!(grow_then_drain(&[0, 20], 10), vec![0, 20, 10, 0]);
    }
}
