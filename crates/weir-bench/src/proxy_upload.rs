//! `weir-bench proxy`'s slow-upload step (issue 32, item 5): a fresh weir proxy, a
//! primary that reads every body to its end (`weir-bench drain-http`) and a route
//! that records (every request captured, no shadow replaying them: what stays in
//! memory after the burst is the request path's, not replays still going on); N uploads of B bytes each opened within a second (open
//! loop), each sending its body in pieces with pauses so that they are all in
//! flight together for about `upload_seconds`. weir's RSS is read before (idle),
//! every 100 ms during (the peak) and `settle_seconds` after the last upload ended,
//! against the proxy's `body_memory_max`. Repeated `rounds` times on the same
//! process; the medians are in the notes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::report::{f, mib, Report, Row};
use crate::sys::{free_addr, helper, wait_listening, Proc};
use crate::target::{Binaries, Kind, Target};

#[derive(Clone, Debug)]
pub struct UploadParams {
    pub uploads: usize,
    pub bytes: usize,
    pub upload_seconds: f64,
    pub settle_seconds: f64,
    pub rounds: usize,
    /// `[proxy] body_memory_max` for the run (weir's default when `None`).
    pub budget: Option<u64>,
}

/// weir's own default, for the report when the run sets none.
const BUDGET_DEFAULT: u64 = 64 * 1024 * 1024;
/// Pieces each body is sent in.
const PIECES: usize = 16;

struct Setup {
    weir: Target,
    addr: SocketAddr,
    _procs: Vec<Proc>,
    _config: tempfile::NamedTempFile,
}

fn start(bins: &Binaries, p: &UploadParams) -> Result<Setup> {
    let (p1, primary) = helper("drain-http")?;
    let addr = free_addr()?;
    let budget = p.budget.map_or(String::new(), |b| {
        format!("[proxy]\nbody_memory_max = {b}\n")
    });
    let config = tempfile::Builder::new()
        .prefix("weir-bench-upload-")
        .suffix(".toml")
        .tempfile()?;
    std::fs::write(
        config.path(),
        format!(
            "{budget}[[proxy.listen]]\nname = \"uploads\"\naddr = \"{addr}\"\n\
             [[proxy.routes]]\nname = \"uploads\"\ntargets = [\"http://{primary}\"]\nrecord = true\n"
        ),
    )?;
    let mut bins = bins.clone();
    bins.weir_args
        .extend(["--config".to_string(), config.path().display().to_string()]);
    let weir = Target::spawn(Kind::Weir, &bins)?;
    wait_listening(addr, "weir's proxy")?;
    Ok(Setup {
        weir,
        addr,
        _procs: vec![p1],
        _config: config,
    })
}

/// One upload: the head, the body in pieces `pause` apart, then the answer to the
/// end. True when it was a 200.
async fn upload(addr: SocketAddr, body: Arc<Vec<u8>>, pause: Duration) -> bool {
    let run = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        let head = format!(
            "POST /upload HTTP/1.1\r\nHost: bench\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).await?;
        let piece = body.len().div_ceil(PIECES).max(1);
        for chunk in body.chunks(piece) {
            s.write_all(chunk).await?;
            tokio::time::sleep(pause).await;
        }
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).await?;
        std::io::Result::Ok(answer.starts_with(b"HTTP/1.1 200"))
    };
    matches!(run.await, Ok(true))
}

/// What one round measured.
struct Round {
    idle: u64,
    peak: u64,
    after: u64,
    ok: u64,
    seconds: f64,
}

async fn round(s: &Setup, p: &UploadParams) -> Result<Round> {
    let rss = || s.weir.rss_bytes().unwrap_or(0);
    let idle = rss();
    let body = Arc::new(vec![b'u'; p.bytes]);
    let pause = Duration::from_secs_f64(p.upload_seconds / PIECES as f64);
    let ok = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..p.uploads {
        let (body, ok, addr) = (Arc::clone(&body), Arc::clone(&ok), s.addr);
        // Opened within the first second, whatever the others do.
        let at = started + Duration::from_secs_f64(i as f64 / p.uploads as f64);
        tasks.spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            if upload(addr, body, pause).await {
                ok.fetch_add(1, Relaxed);
            }
        });
    }
    let mut peak = idle;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while !tasks.is_empty() {
        tokio::select! {
            _ = tick.tick() => peak = peak.max(rss()),
            _ = tasks.join_next() => {}
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    peak = peak.max(rss());
    let ended = Instant::now();
    while ended.elapsed().as_secs_f64() < p.settle_seconds {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(Round {
        idle,
        peak,
        after: rss(),
        ok: ok.load(Relaxed),
        seconds,
    })
}

pub async fn run(bins: &Binaries, p: &UploadParams) -> Result<Report> {
    let limit = crate::sys::raise_nofile_limit();
    let s = start(bins, p)?;
    let budget = p.budget.unwrap_or(BUDGET_DEFAULT);
    let mut r = Report::new(
        "proxy-uploads",
        format!(
            "proxy: weir's RSS with {} concurrent slow uploads of {} B ({:.0} s each), and {:.0} s after; body_memory_max {} MiB",
            p.uploads, p.bytes, p.upload_seconds, p.settle_seconds, budget / 1048576
        ),
    );
    if (limit as usize) < 3 * p.uploads + 100 {
        r.notes.push(format!(
            "RLIMIT_NOFILE is {limit}: some uploads may fail for want of descriptors"
        ));
    }
    let mut rounds = Vec::new();
    for i in 0..p.rounds {
        let x = round(&s, p).await?;
        r.rows.push(
            Row::new()
                .with("round", i as u64 + 1)
                .with("ok", x.ok)
                .with("uploads", p.uploads as u64)
                .with("seconds", f(x.seconds, 1))
                .with("idle_MiB", mib(Some(x.idle)))
                .with("peak_MiB", mib(Some(x.peak)))
                .with("after_MiB", mib(Some(x.after)))
                .with(
                    "peak_over_idle_MiB",
                    mib(Some(x.peak.saturating_sub(x.idle))),
                )
                .with("budget_MiB", mib(Some(budget))),
        );
        rounds.push(x);
    }
    notes(&mut r, &rounds, budget, p.settle_seconds);
    Ok(r)
}

/// The medians, against the fresh process's idle RSS (each round's own idle is the
/// one before it: what an allocator kept from the rounds before is in it).
fn notes(r: &mut Report, rounds: &[Round], budget: u64, settle: f64) {
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let m = 1048576.0;
    let idle = rounds.first().map_or(0.0, |x| x.idle as f64 / m);
    let mut peak: Vec<f64> = rounds.iter().map(|x| x.peak as f64 / m).collect();
    let mut after: Vec<f64> = rounds.iter().map(|x| x.after as f64 / m).collect();
    let (peak, after) = (median(&mut peak), median(&mut after));
    let budget = budget as f64 / m;
    r.notes.push(format!(
        "median of {} rounds against the fresh process's idle {idle:.1} MiB: peak {peak:.1} MiB (idle + {:.1}; goal <= idle + budget {budget:.0}), {settle:.0} s after {after:.1} MiB (idle + {:.1}; goal within 10 MB of idle)",
        rounds.len(),
        peak - idle,
        after - idle,
    ));
}
