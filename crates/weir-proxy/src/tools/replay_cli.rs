//! `weir replay`: sends recorded captures to any URL, from a capture queue (of a
//! running weir, `--server`, or a data directory, `--data-dir`) or from a file made by
//! `weir capture export` (`--from-file`), paced as asked (`crate::replay`).
//!
//! The captures are read as the replay goes, a bounded number ahead of it, so a
//! recording of any size replays in bounded memory; a file is checked whole first,
//! so a bad line sends nothing. At the end it prints one summary line (sent, answers
//! by status class, failed, elapsed) and the first failures' reasons, and fails when
//! a request could not be sent or the captures could not all be read.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::capture_file::{self, LINE_BYTES_MAX};
use crate::replay::{Pace, ReplayOptions, ReplaySummary};
use crate::Captured;
use anyhow::{bail, Context};
use tokio::sync::mpsc;

use super::capture_cli::{
    check_file, now, open_backend, open_file, parse_time, queue_name, runtime, scan_dir, Location,
    Reach, ServerLines,
};

/// Default of `--concurrency`.
pub const REPLAY_CONCURRENCY_DEFAULT: usize = 8;
/// Default of `--timeout-ms`.
pub const REPLAY_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Captures read ahead of the replay.
const REPLAY_AHEAD: usize = 64;

#[derive(clap::Args)]
pub struct ReplayArgs {
    /// The capture queue to replay: proxy:capture:ROUTE (or just ROUTE), with
    /// --server or --data-dir
    #[arg(long, value_name = "QUEUE", conflicts_with = "from_file")]
    pub from: Option<String>,
    #[command(flatten)]
    pub at: Location,
    /// A JSON-lines file to replay instead (from `weir capture export`)
    #[arg(long, value_name = "FILE")]
    pub from_file: Option<PathBuf>,
    /// Where to send the requests: http://host:port/base
    #[arg(long, value_name = "URL")]
    pub to: String,
    /// Requests per second at most
    #[arg(long, value_name = "N", conflicts_with = "speed")]
    pub rate: Option<f64>,
    /// Keep the captured gaps between requests, divided by X (1 is real time)
    #[arg(long, value_name = "X")]
    pub speed: Option<f64>,
    /// Only captures received since TIME (as for export)
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// At most N captures, the oldest first
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// Requests in flight at most (1 keeps the captured order)
    #[arg(long, value_name = "N", default_value_t = REPLAY_CONCURRENCY_DEFAULT)]
    pub concurrency: usize,
    /// Time each request has to be answered
    #[arg(long, value_name = "MS", default_value_t = REPLAY_TIMEOUT_MS_DEFAULT)]
    pub timeout_ms: u64,
    /// A PEM file of CA certificates to trust for an https:// --to, besides the
    /// built-in roots
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
}

/// Where the captures come from, and which of them.
enum Source {
    File(PathBuf),
    Dir(PathBuf, String),
    Server {
        url: String,
        key: String,
        queue: String,
    },
}

struct Selection {
    since: Option<u64>,
    limit: Option<u64>,
}

fn source(args: &ReplayArgs) -> anyhow::Result<Source> {
    match (&args.from, &args.from_file) {
        (None, Some(path)) => {
            if args.at.server.is_some() || args.at.data_dir.is_some() {
                bail!("--from-file reads a file: --server and --data-dir go with --from QUEUE");
            }
            Ok(Source::File(path.clone()))
        }
        (Some(queue), None) => {
            let queue = queue_name(queue)?;
            Ok(match args.at.reach()? {
                Reach::Dir(dir) => Source::Dir(dir.to_path_buf(), queue),
                Reach::Server { url, key } => Source::Server {
                    url: url.to_string(),
                    key,
                    queue,
                },
            })
        }
        _ => bail!(
            "say what to replay: --from QUEUE (with --server or --data-dir) or --from-file FILE"
        ),
    }
}

/// `weir replay`.
pub fn run(args: &ReplayArgs) -> anyhow::Result<()> {
    let pace = match (args.rate, args.speed) {
        (Some(rate), _) => Pace::Rate(rate),
        (None, Some(speed)) => Pace::Speed(speed),
        (None, None) => Pace::Unpaced,
    };
    let timeout = Duration::from_millis(args.timeout_ms);
    let mut options = ReplayOptions::new(&args.to, pace, args.concurrency, timeout)
        .map_err(anyhow::Error::msg)?;
    if let Some(ca_file) = &args.ca_file {
        options = options.with_ca_file(ca_file).map_err(anyhow::Error::msg)?;
    }
    let selection = Selection {
        since: args
            .since
            .as_deref()
            .map(|t| parse_time(t, now()))
            .transpose()?,
        limit: args.limit,
    };
    let source = source(args)?;
    if let Source::File(path) = &source {
        check_file(path, "replayed")?;
    }
    let rt = runtime()?;
    let (summary, read) = rt.block_on(async {
        let (tx, rx) = mpsc::channel(REPLAY_AHEAD);
        let reading = tokio::spawn(read(source, selection, tx));
        let summary = crate::replay::replay(rx, &options).await;
        let read = match reading.await {
            Ok(read) => read,
            Err(e) => Err(anyhow::anyhow!("reading the captures: {e}")),
        };
        (summary, read)
    });
    println!("{}", summary_line(&args.to, &summary));
    for reason in &summary.failures {
        eprintln!("weir: failed: {reason}");
    }
    read.context("reading the captures")?;
    if summary.failed > 0 {
        bail!("{} of {} requests failed", summary.failed, summary.sent);
    }
    Ok(())
}

/// The summary: `replay to URL: sent N, 1xx N, ..., 5xx N, failed N, elapsed S s`.
pub fn summary_line(to: &str, s: &ReplaySummary) -> String {
    let classes: Vec<String> = s
        .by_class
        .iter()
        .enumerate()
        .map(|(i, n)| format!("{}xx {n}", i + 1))
        .collect();
    format!(
        "replay to {to}: sent {}, {}, failed {}, elapsed {:.3} s",
        s.sent,
        classes.join(", "),
        s.failed,
        s.elapsed.as_secs_f64()
    )
}

/// Feeds the replay from its source until the source ends or the replay stops
/// taking.
async fn read(
    source: Source,
    selection: Selection,
    tx: mpsc::Sender<Captured>,
) -> anyhow::Result<()> {
    match source {
        Source::File(path) => {
            tokio::task::spawn_blocking(move || read_file(&path, &selection, &tx)).await?
        }
        Source::Dir(dir, queue) => read_dir(&dir, &queue, &selection, &tx).await,
        Source::Server { url, key, queue } => {
            let mut lines =
                ServerLines::open(&url, &key, &queue, selection.since, selection.limit).await?;
            while let Some(line) = lines.next().await? {
                let (_, c) = capture_file::decode_line(line.trim_ascii_end())
                    .map_err(|reason| anyhow::anyhow!("weir sent a bad capture: {reason}"))?;
                if tx.send(c).await.is_err() {
                    break;
                }
            }
            Ok(())
        }
    }
}

fn read_file(
    path: &Path,
    selection: &Selection,
    tx: &mpsc::Sender<Captured>,
) -> anyhow::Result<()> {
    let mut lines = capture_file::Lines::new(open_file(path)?, LINE_BYTES_MAX);
    let mut sent = 0u64;
    while let Some(next) = lines.next_capture() {
        if selection.limit.is_some_and(|l| sent >= l) {
            break;
        }
        let c = next.with_context(|| path.display().to_string())?.captured;
        if selection.since.is_some_and(|s| c.at_ms < s) {
            continue;
        }
        if tx.blocking_send(c).is_err() {
            break;
        }
        sent += 1;
    }
    Ok(())
}

/// Reads a capture queue of a data directory: the same walk as a running weir's
/// (`GET /captures/QUEUE`, `captures.rs`), through the backend opened here.
async fn read_dir(
    dir: &Path,
    queue: &str,
    selection: &Selection,
    tx: &mpsc::Sender<Captured>,
) -> anyhow::Result<()> {
    let opened = dir.to_path_buf();
    // Opening reads the store's files: off the runtime's threads.
    let backend = tokio::task::spawn_blocking(move || open_backend(&opened)).await??;
    let walked = walk_dir(&backend, dir, queue, selection, tx).await;
    let closed = backend.close().await.context("closing the store");
    walked?;
    closed
}

async fn walk_dir(
    backend: &weir_backend::Backend,
    dir: &Path,
    queue: &str,
    selection: &Selection,
    tx: &mpsc::Sender<Captured>,
) -> anyhow::Result<()> {
    let scan = scan_dir(backend, dir, queue, selection.since).await?;
    capture_file::walk_captures(
        scan,
        queue,
        selection.since,
        selection.limit,
        |_, c| async move { tx.send(c).await.is_ok() },
    )
    .await?;
    Ok(())
}
