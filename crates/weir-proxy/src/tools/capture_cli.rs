//! Record now, replay later, from the command line: `weir capture export` writes a
//! capture queue's kept captures to a JSON-lines file and `weir capture import`
//! appends such a file to a capture queue (of this weir or another); `weir replay`
//! (`replay_cli.rs`) sends them to any URL. The helpers they share live here.
//!
//! A queue is reached one of two ways. `--server URL` asks a running weir over its
//! HTTP port (`captures.rs`; it needs the admin key, from `--key` or
//! `WEIR_ADMIN_KEY`). `--data-dir DIR` opens the data directory as the embedded
//! backend (`weir_backend::Embedded::open`) and does the same work as those endpoints
//! through it, which only works while no weir runs on it: the directory is locked
//! then, and the command says to use `--server`.
//!
//! Files are checked whole before anything is sent or appended, so a bad line (named
//! by its number) changes nothing. An import is then appended in pieces of at most
//! 32 MiB, each all or nothing; should one fail (a full disk, a full queue), the
//! command says how many captures went in before it.

use std::io::{BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::capture_file::{self, LINE_BYTES_MAX};
use anyhow::{bail, Context};

use super::captures::{CAPTURE_QUEUE_PREFIX, IMPORT_BYTES_MAX};
use super::server_client::{Answer, ServerClient};
use super::ADMIN_KEY_ENV;

/// Where a capture queue is: a running weir, or a data directory.
#[derive(clap::Args, Debug, Clone)]
pub struct Location {
    /// A running weir's HTTP port, e.g. http://127.0.0.1:22134 (needs its admin key)
    #[arg(long, value_name = "URL", conflicts_with = "data_dir")]
    pub server: Option<String>,
    /// The data directory, when no weir runs on it (it is locked while one does)
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// The admin key for --server [default: $WEIR_ADMIN_KEY]
    #[arg(long, value_name = "KEY")]
    pub key: Option<String>,
}

#[derive(clap::Subcommand)]
pub enum CaptureCommand {
    /// Write a capture queue's kept captures to a JSON-lines file; nothing is consumed.
    Export(ExportArgs),
    /// Append the captures of a JSON-lines file to a capture queue.
    Import(ImportArgs),
}

#[derive(clap::Args)]
pub struct ExportArgs {
    /// The capture queue: proxy:capture:ROUTE (or just ROUTE)
    #[arg(long, value_name = "QUEUE")]
    pub queue: String,
    #[command(flatten)]
    pub at: Location,
    /// Only captures received since TIME: Unix ms, RFC 3339 (2024-05-01T12:00:00Z),
    /// or a duration ago (10m, 2h)
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// At most N captures, the oldest first
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// The file to write, or - for standard output
    #[arg(long, value_name = "FILE", default_value = "-")]
    pub out: String,
}

#[derive(clap::Args)]
pub struct ImportArgs {
    /// The capture queue: proxy:capture:ROUTE (or just ROUTE); created if missing
    #[arg(long, value_name = "QUEUE")]
    pub queue: String,
    #[command(flatten)]
    pub at: Location,
    /// The JSON-lines file to read
    #[arg(long = "in", value_name = "FILE")]
    pub input: PathBuf,
}

/// `proxy:capture:ROUTE`, from itself or from `ROUTE`.
pub fn queue_name(given: &str) -> anyhow::Result<String> {
    let name = if given.starts_with(CAPTURE_QUEUE_PREFIX) {
        given.to_string()
    } else {
        format!("{CAPTURE_QUEUE_PREFIX}{given}")
    };
    if name.len() == CAPTURE_QUEUE_PREFIX.len() || weir_backend::validate_queue_name(&name).is_err()
    {
        bail!("{given:?} is not a capture queue (proxy:capture:ROUTE)");
    }
    Ok(name)
}

/// A time as Unix ms: Unix ms, RFC 3339 with a zone (`Z` or `+HH:MM`), or a
/// duration before `now` (`90s`, `10m`, `2h`, `1day`).
pub fn parse_time(text: &str, now: SystemTime) -> anyhow::Result<u64> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse().context("a time in Unix ms");
    }
    if let Some(ms) = rfc3339_ms(text) {
        return ms;
    }
    if let Ok(ago) = humantime::parse_duration(text) {
        let at = now.checked_sub(ago).unwrap_or(UNIX_EPOCH);
        return Ok(unix_ms(at));
    }
    bail!("time {text:?}: Unix ms, RFC 3339 (2024-05-01T12:00:00Z) or a duration ago (10m, 2h)")
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `None` when `text` does not look like a date; else the time or why it is wrong.
fn rfc3339_ms(text: &str) -> Option<anyhow::Result<u64>> {
    let b = text.as_bytes();
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let (base, offset_s): (&str, i64) = if let Some(base) = text.strip_suffix(['Z', 'z']) {
        (base, 0)
    } else {
        let split = text.len() - 6;
        let (base, zone) = (text.get(..split)?, text.get(split..)?);
        let zb = zone.as_bytes();
        let sign = match zb[0] {
            b'+' => 1,
            b'-' => -1,
            _ => {
                return Some(Err(anyhow::anyhow!(
                    "time {text:?}: RFC 3339 needs a zone, Z or +HH:MM"
                )))
            }
        };
        let hh: i64 = zone.get(1..3)?.parse().ok()?;
        let mm: i64 = zone.get(4..6)?.parse().ok()?;
        if zb[3] != b':' || hh > 23 || mm > 59 {
            return Some(Err(anyhow::anyhow!("time {text:?}: a bad zone")));
        }
        (base, sign * (hh * 3600 + mm * 60))
    };
    let t = match humantime::parse_rfc3339_weak(base) {
        Ok(t) => t,
        Err(e) => return Some(Err(anyhow::anyhow!("time {text:?}: {e}"))),
    };
    let ms = i64::try_from(unix_ms(t)).unwrap_or(i64::MAX) - offset_s * 1000;
    Some(u64::try_from(ms).map_err(|_| anyhow::anyhow!("time {text:?}: before 1970")))
}

pub(crate) fn now() -> SystemTime {
    SystemTime::now()
}

/// Opens a data directory for a command, as the embedded backend; a locked one (a
/// weir runs on it) says to use `--server`.
pub(crate) fn open_backend(dir: &Path) -> anyhow::Result<weir_backend::Backend> {
    if !dir.is_dir() {
        bail!("no data directory at {}", dir.display());
    }
    match weir_backend::Embedded::open(dir) {
        Ok(embedded) => Ok(weir_backend::Backend::Embedded(embedded)),
        Err(e) if e.kind() == weir_backend::Kind::Locked => bail!(
            "the data directory {} is in use by a running weir: use --server URL (its HTTP port, with the admin key) instead, or stop it first",
            dir.display()
        ),
        Err(e) => Err(e).with_context(|| format!("opening the data directory {}", dir.display())),
    }
}

/// A walk over the captures of `queue` received at `since` or later, in the data
/// directory `dir` opened as `backend`, as the `/captures` endpoints start one.
pub(crate) async fn scan_dir(
    backend: &weir_backend::Backend,
    dir: &Path,
    queue: &str,
    since: Option<u64>,
) -> anyhow::Result<weir_backend::Scan> {
    match backend.scan(queue, capture_file::scan_from(since)).await {
        Ok(scan) => Ok(scan),
        Err(e) if e.kind() == weir_backend::Kind::NotFound => {
            bail!("no queue {queue} in {}", dir.display())
        }
        Err(e) => Err(e.into()),
    }
}

/// How a command reaches a queue: over a running weir's HTTP port with the admin
/// key (`--server`), or by opening a stopped weir's data directory (`--data-dir`).
pub(crate) enum Reach<'a> {
    Server { url: &'a str, key: String },
    Dir(&'a Path),
}

impl Location {
    /// How to reach the queue, from the one of `--server` and `--data-dir` given
    /// (and, for `--server`, the admin key from `--key` or the environment).
    pub(crate) fn reach(&self) -> anyhow::Result<Reach<'_>> {
        match (&self.server, &self.data_dir) {
            (Some(url), None) => {
                let key = self
                    .key
                    .clone()
                    .or_else(|| std::env::var(ADMIN_KEY_ENV).ok().filter(|k| !k.is_empty()))
                    .with_context(|| {
                        format!("--server needs the admin key: --key KEY or {ADMIN_KEY_ENV}")
                    })?;
                Ok(Reach::Server { url, key })
            }
            (None, Some(dir)) => Ok(Reach::Dir(dir)),
            _ => bail!("say where the queue is: --server URL (a running weir) or --data-dir DIR"),
        }
    }
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")
}

fn captures_url(base: &str, queue: &str) -> String {
    format!("{}/captures/{queue}", base.trim_end_matches('/'))
}

/// `GET /captures/QUEUE`, read a line at a time as it streams in.
pub(crate) struct ServerLines {
    response: Answer,
    pending: Vec<u8>,
    /// Where the next line starts in `pending`.
    start: usize,
}

impl ServerLines {
    pub(crate) async fn open(
        url: &str,
        key: &str,
        queue: &str,
        since: Option<u64>,
        limit: Option<u64>,
    ) -> anyhow::Result<ServerLines> {
        let mut query = Vec::new();
        query.extend(since.map(|s| format!("since={s}")));
        query.extend(limit.map(|l| format!("limit={l}")));
        let mut url = captures_url(url, queue);
        if !query.is_empty() {
            url = format!("{url}?{}", query.join("&"));
        }
        let response = ServerClient::new(key)?
            .get(&url)
            .await
            .context("asking weir")?;
        Ok(ServerLines {
            response,
            pending: Vec::new(),
            start: 0,
        })
    }

    /// The next line, with its `\n`; `None` once the export ended whole.
    pub(crate) async fn next(&mut self) -> anyhow::Result<Option<Vec<u8>>> {
        loop {
            if let Some(i) = self.pending[self.start..].iter().position(|&b| b == b'\n') {
                let line = self.pending[self.start..self.start + i + 1].to_vec();
                self.start += i + 1;
                return Ok(Some(line));
            }
            self.pending.drain(..self.start);
            self.start = 0;
            if self.pending.len() > LINE_BYTES_MAX {
                bail!("weir sent a line over {LINE_BYTES_MAX} bytes");
            }
            match self
                .response
                .chunk()
                .await
                .context("the export broke off")?
            {
                Some(chunk) => self.pending.extend_from_slice(&chunk),
                None if self.pending.is_empty() => return Ok(None),
                None => bail!("the export ended mid-line"),
            }
        }
    }
}

/// `weir capture export`.
pub fn export(args: &ExportArgs) -> anyhow::Result<()> {
    let queue = queue_name(&args.queue)?;
    let since = args
        .since
        .as_deref()
        .map(|t| parse_time(t, now()))
        .transpose()?;
    let reach = args.at.reach()?;
    let rt = runtime()?;
    let mut out = Output::open(&args.out)?;
    let result = match reach {
        Reach::Dir(dir) => rt.block_on(export_dir(dir, &queue, since, args.limit, &mut out)),
        Reach::Server { url, key } => rt.block_on(async {
            let mut lines = ServerLines::open(url, &key, &queue, since, args.limit).await?;
            let mut n = 0u64;
            while let Some(line) = lines.next().await? {
                out.write(&line)?;
                n += 1;
            }
            anyhow::Ok(n)
        }),
    };
    let n = match result {
        Ok(n) => n,
        Err(e) => {
            out.abandon();
            return Err(e);
        }
    };
    out.finish()?;
    eprintln!("exported {n} captures from {queue}");
    Ok(())
}

/// An export from a data directory: the same walk as a running weir's (`GET
/// /captures/QUEUE`, `captures.rs`), through the backend opened here.
async fn export_dir(
    dir: &Path,
    queue: &str,
    since: Option<u64>,
    limit: Option<u64>,
    out: &mut Output,
) -> anyhow::Result<u64> {
    let backend = open_backend(dir)?;
    let walked = export_walk(&backend, dir, queue, since, limit, out).await;
    let closed = backend.close().await.context("closing the store");
    let n = walked?;
    closed?;
    Ok(n)
}

/// The captures of `queue` written to `out`; how many.
async fn export_walk(
    backend: &weir_backend::Backend,
    dir: &Path,
    queue: &str,
    since: Option<u64>,
    limit: Option<u64>,
    out: &mut Output,
) -> anyhow::Result<u64> {
    let scan = scan_dir(backend, dir, queue, since).await?;
    let mut failed = None;
    let done = capture_file::walk_scan(scan, queue, since, limit, |line| {
        let go_on = match out.write(&line) {
            Ok(()) => true,
            Err(e) => {
                failed = Some(e);
                false
            }
        };
        async move { go_on }
    })
    .await?;
    match failed {
        Some(e) => Err(e),
        None => Ok(done.captures),
    }
}

/// Standard output, or a file (mode 0600) written beside its name and renamed into
/// place once whole (a failed export leaves no partial file behind).
struct Output {
    writer: Box<dyn Write>,
    file: Option<(PathBuf, PathBuf)>,
}

impl Output {
    fn open(target: &str) -> anyhow::Result<Output> {
        if target == "-" {
            return Ok(Output {
                writer: Box::new(std::io::BufWriter::new(std::io::stdout())),
                file: None,
            });
        }
        let path = PathBuf::from(target);
        let mut partial = path.clone().into_os_string();
        partial.push(".partial");
        let partial = PathBuf::from(partial);
        // Captures hold clients' cookies and tokens: readable by the owner only.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&partial)
            .with_context(|| format!("creating {}", partial.display()))?;
        Ok(Output {
            writer: Box::new(std::io::BufWriter::new(file)),
            file: Some((partial, path)),
        })
    }

    fn write(&mut self, line: &[u8]) -> anyhow::Result<()> {
        self.writer.write_all(line).context("writing the export")
    }

    fn finish(mut self) -> anyhow::Result<()> {
        self.writer.flush().context("writing the export")?;
        if let Some((partial, path)) = self.file.take() {
            std::fs::rename(&partial, &path)
                .with_context(|| format!("renaming {} to {}", partial.display(), path.display()))?;
        }
        Ok(())
    }

    fn abandon(mut self) {
        if let Some((partial, _)) = self.file.take() {
            let _ = std::fs::remove_file(partial);
        }
    }
}

/// Checks a whole capture file; a bad line stops everything, naming it. `nothing`
/// says what did not happen ("imported", "replayed").
pub(crate) fn check_file(path: &Path, nothing: &str) -> anyhow::Result<u64> {
    let file = open_file(path)?;
    capture_file::check_all(file, LINE_BYTES_MAX).with_context(|| {
        format!(
            "{} is not a capture file, so nothing was {nothing}",
            path.display()
        )
    })
}

pub(crate) fn open_file(path: &Path) -> anyhow::Result<BufReader<std::fs::File>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    Ok(BufReader::with_capacity(1 << 16, file))
}

/// The file's lines in pieces of at most `IMPORT_BYTES_MAX` bytes, each handed to
/// `piece` with its count of captures; returns the captures handed over.
fn in_pieces(
    path: &Path,
    mut piece: impl FnMut(&[u8], u64) -> anyhow::Result<()>,
) -> anyhow::Result<u64> {
    let mut lines = capture_file::Lines::new(open_file(path)?, LINE_BYTES_MAX);
    let (mut buf, mut count, mut done) = (Vec::new(), 0u64, 0u64);
    while let Some(line) = lines.next_line() {
        let (_, line) = line?;
        if !buf.is_empty() && buf.len() + line.len() + 1 > IMPORT_BYTES_MAX {
            piece(&buf, count)?;
            done += count;
            (count, buf) = (0, Vec::new());
        }
        buf.extend_from_slice(line);
        buf.push(b'\n');
        count += 1;
    }
    if count > 0 {
        piece(&buf, count)?;
        done += count;
    }
    Ok(done)
}

/// `weir capture import`.
pub fn import(args: &ImportArgs) -> anyhow::Result<()> {
    let queue = queue_name(&args.queue)?;
    let reach = args.at.reach()?;
    check_file(&args.input, "imported")?;
    let mut imported = 0u64;
    let result = match reach {
        Reach::Dir(dir) => import_dir(dir, &queue, &args.input, &mut imported),
        Reach::Server { url, key } => {
            let rt = runtime()?;
            let client = rt.block_on(async { ServerClient::new(&key) })?;
            let url = captures_url(url, &queue);
            // One piece in memory at a time: each is sent before the next is read.
            in_pieces(&args.input, |text, _| {
                imported += rt.block_on(post_piece(&client, &url, text))?;
                Ok(())
            })
            .map(|_| ())
        }
    };
    if let Err(e) = result {
        bail!("{e:#} ({imported} captures were imported into {queue} before this)");
    }
    eprintln!("imported {imported} captures into {queue}");
    Ok(())
}

/// One piece of an import; how many captures weir appended.
async fn post_piece(client: &ServerClient, url: &str, text: &[u8]) -> anyhow::Result<u64> {
    let text = client
        .post(url, "application/x-ndjson", text.to_vec())
        .await
        .context("sending to weir")?
        .bytes()
        .await
        .context("reading weir's answer")?;
    let answer: serde_json::Value =
        serde_json::from_slice(&text).context("reading weir's answer")?;
    Ok(answer["imported"].as_u64().unwrap_or(0))
}

/// An import into a data directory: the same appends as through a running weir
/// (`captures::append_captures`: kept by the queue's `record` reader, each piece all
/// or nothing), through the backend opened here.
fn import_dir(dir: &Path, queue: &str, input: &Path, imported: &mut u64) -> anyhow::Result<()> {
    let backend = open_backend(dir)?;
    let rt = runtime()?;
    let appended = in_pieces(input, |text, count| {
        let items = capture_file::items_of(text, LINE_BYTES_MAX)?;
        rt.block_on(super::captures::append_captures(&backend, queue, &items))?;
        *imported += count;
        Ok(())
    });
    let closed = rt.block_on(backend.close()).context("closing the store");
    appended?;
    closed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_in_ms_rfc3339_or_ago() {
        let now = UNIX_EPOCH + Duration::from_millis(1_714_564_800_000);
        assert_eq!(parse_time("1700000000000", now).unwrap(), 1_700_000_000_000);
        assert_eq!(parse_time("0", now).unwrap(), 0);
        assert_eq!(
            parse_time("2024-05-01T12:00:00Z", now).unwrap(),
            1_714_564_800_000
        );
        assert_eq!(
            parse_time("2024-05-01T14:00:00+02:00", now).unwrap(),
            1_714_564_800_000
        );
        assert_eq!(
            parse_time("2024-05-01T10:30:00-01:30", now).unwrap(),
            1_714_564_800_000
        );
        assert_eq!(
            parse_time("2024-05-01T12:00:00.250Z", now).unwrap(),
            1_714_564_800_250
        );
        assert_eq!(parse_time("10m", now).unwrap(), 1_714_564_800_000 - 600_000);
        assert_eq!(
            parse_time("1h 30m", now).unwrap(),
            1_714_564_800_000 - 5_400_000
        );
        assert_eq!(parse_time("100years", now).unwrap(), 0);
        for bad in [
            "",
            "yesterday",
            "10 parsecs",
            "-5",
            "99999999999999999999999",
        ] {
            assert!(parse_time(bad, now).is_err(), "{bad}");
        }
        let e = parse_time("2024-05-01T12:00:00", now).unwrap_err();
        assert!(e.to_string().contains("zone"), "{e}");
        for bad in [
            "2024-13-01T12:00:00Z",
            "2024-05-01T12:00:00+25:00",
            "1960-01-01T00:00:00Z",
        ] {
            assert!(parse_time(bad, now).is_err(), "{bad}");
        }
    }

    #[test]
    fn capture_queues_by_name_or_route() {
        assert_eq!(queue_name("api").unwrap(), "proxy:capture:api");
        assert_eq!(
            queue_name("proxy:capture:api").unwrap(),
            "proxy:capture:api"
        );
        for bad in ["", "proxy:capture:", "a/b", "with space"] {
            assert!(queue_name(bad).is_err(), "{bad}");
        }
    }
}
