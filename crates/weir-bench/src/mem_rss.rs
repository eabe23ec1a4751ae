//! Resident memory: for each N, set N items of 1 KiB, get N, then read the server's
//! VmRSS (docs/benchmarks.md; the seeds' table ends at 524,048 items).
//!
//! What it shows is whether a server keeps items (or indexes of them) in memory after
//! they are gone. The sets and gets are pipelined: only the memory afterwards matters,
//! not the speed. A row for the idle server, before any connection, comes first.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;

use crate::proto::{get_request, payload, set_request, Conn, Pipelined};
use crate::report::{mib, Report, Row};
use crate::target::Target;

const READ_BUFFER_BYTES: usize = 256 * 1024;

#[derive(Clone, Debug)]
pub struct MemRssParams {
    pub queue: String,
    pub item_bytes: usize,
    pub steps: Vec<u64>,
}

/// One row: the server's RSS after `step` (`items` stored and `hits` got back).
fn rss_row(target: &Target, step: &str, items: Option<u64>, hits: Option<u64>, bytes: u64) -> Row {
    Row::new()
        .with("step", step)
        .with("target", target.name.as_str())
        .with("items", items)
        .with("hits", hits)
        .with("rss_MiB", mib(Some(bytes)))
        .with("rss_bytes", bytes)
}

pub async fn run(
    targets: &[Target],
    p: &MemRssParams,
    bar: &ProgressBar,
    fill_bar: &ProgressBar,
) -> Result<Report> {
    let data = payload(p.item_bytes);
    let set = set_request(&p.queue, &data);
    let get = get_request(&p.queue);
    let mut report = Report::new(
        "mem-rss",
        format!(
            "resident memory: set N items of {} B, get N, then the server's VmRSS",
            p.item_bytes
        ),
    );
    bar.set_length(((p.steps.len() + 1) * targets.len()) as u64);
    for target in targets {
        let Some(pid) = target.pid else {
            report.notes.push(format!(
                "{}: skipped, no pid (give --pid {}=PID)",
                target.name, target.name
            ));
            bar.inc((p.steps.len() + 1) as u64);
            continue;
        };
        let rss = |what: &str| {
            crate::sys::vm_rss_bytes(pid)
                .with_context(|| format!("reading the RSS of {} (pid {pid}) {what}", target.name))
        };
        let idle = rss("idle")?;
        report.rows.push(rss_row(target, "idle", None, None, idle));
        bar.inc(1);
        let mut conn = Conn::connect(target.addr, READ_BUFFER_BYTES).await?;
        for &n in &p.steps {
            bar.set_message(format!("mem-rss {} N={n}", target.name));
            let ctx = || format!("mem-rss on {} at N={n}", target.name);
            fill_bar.reset();
            fill_bar.set_length(2 * n);
            fill_bar.set_message("set + get");
            conn.pipelined(&set, n, Pipelined::Set, &|k| fill_bar.inc(k))
                .await
                .with_context(ctx)?;
            let (hits, _misses) = conn
                .pipelined(&get, n, Pipelined::Get, &|k| fill_bar.inc(k))
                .await
                .with_context(ctx)?;
            if n > 0 && hits == 0 {
                bail!("{}: every get missed", ctx());
            }
            // Let background work (a syncer, freed buffers) settle before reading.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let bytes = rss("after the step")?;
            let step = n.to_string();
            report
                .rows
                .push(rss_row(target, &step, Some(n), Some(hits), bytes));
            bar.inc(1);
        }
    }
    Ok(report)
}
