//! `weir-bench cluster`: weir front doors on a 3-node NATS JetStream cluster against
//! NATS itself, on one machine in one run, reported as ratios (issue 12's goals).
//!
//! The bench starts its own cluster (`scripts/nats-cluster start DIR BASE`, installing
//! the tools with `scripts/nats-install` when missing) and spawns every weir front door
//! itself (`weir serve --backend jetstream --nats-servers ... --nats-stream NAME`, a
//! fresh stream per step, deleted after it). Everything it started is stopped at the
//! end, on error and on Ctrl-C.
//!
//! 1. **Flood, weir vs `nats bench`**, at each `--cluster-connections` count, in
//!    `--cluster-rounds` rounds whose order rotates (weir, two doors, nats; then two
//!    doors, nats, weir; ...), medians reported. weir runs the flood workload (64 B
//!    items over 10 queues, each connection alternating an acknowledged `set` and a
//!    plain `get`, which on the JetStream backend is a fetch of one message plus a
//!    double ack, the analogue of `nats bench js fetch --batch=1 --doubleack`). NATS
//!    runs `nats bench js pub sync` (M messages, one publish in flight per client,
//!    each awaiting its PubAck) then `nats bench js fetch --batch=1 --doubleack
//!    --acks=explicit` on a durable pull consumer, same clients, same payload.
//!
//!    The comparable figure is items/s for M items each written with an ack and read
//!    with an ack. nats gives its two phases' rates separately, so its combined rate
//!    is the harmonic one: `nats = M / (M/pub + M/fetch) = 1 / (1/pub + 1/fetch)`.
//!    weir's is `items/s = hits / seconds`: the gets that returned an item over the
//!    flood's wall time (M sets and M gets). A `get` that finds its queue empty (a
//!    miss) costs time but moves no item, so this figure is conservative; flood's own
//!    ops/s (misses counted) is reported beside it. Goal: weir ≥ 0.7 × nats.
//! 2. **Two front doors** on the same stream, the flood's connections dealt over both,
//!    against one door in the same round. Goal: ≥ 1.6 × one door.
//! 3. **Failover under load** (see `failover.rs`): 8 writers through a weir door, the
//!    stream leader's nats-server SIGKILLed, the gap to the first ack after it; the
//!    same with raw async-nats publishers on a stream of their own (NATS's own election
//!    time). The node is restarted and the streams brought back to 3 current replicas
//!    between measurements. Goal: weir's median gap ≤ 2 × NATS's.
//! 4. **RSS** of the weir front doors: peak VmRSS sampled every 100 ms during each step.
//!
//! Why one invocation: this machine is shared and its speed drifts; only figures taken
//! side by side, in rotating order, compare.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;

use crate::chart::ChartSpec;
use crate::failover::{self, Outcome, Recorder, Writers};
use crate::flood::{self, median, Requests};
use crate::nats::{self, node_of, parse_aggregate_rate, Admin, NatsCluster, Tools};
use crate::proto::{get_request, payload, set_request, Conn};
use crate::report::{f, mib, Report, Row};
use crate::sys;
use crate::target::{Binaries, Kind, Target};

/// What the weir front doors keep their queues in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DoorBackend {
    /// The NATS JetStream cluster the bench starts (the point of the benchmark).
    Jetstream,
    /// weir's embedded engine (checks the bench's weir side without the backend).
    Embedded,
}

/// What a failover round does to the stream leader's node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    /// SIGKILL; restarted after the round.
    Kill,
    /// SIGSTOP (hung, its sockets open); SIGCONT after the round.
    Stop,
    /// Cut from the other nodes, still reachable by clients; healed after the round
    /// (needs network namespaces: the cluster is then started with NATS_NETNS=1).
    CutPeers,
    /// Cut from everyone; healed after the round (network namespaces too).
    CutAll,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Stop => "stop",
            Fault::CutPeers => "cut-peers",
            Fault::CutAll => "cut-all",
        }
    }

    fn needs_netns(self) -> bool {
        matches!(self, Fault::CutPeers | Fault::CutAll)
    }

    /// Does it to node `n`; the instant it was done.
    async fn apply(self, cluster: &NatsCluster, n: usize) -> Result<Instant> {
        match self {
            Fault::Kill => cluster.kill_node(n).await,
            Fault::Stop => cluster.signal_node(n, libc::SIGSTOP),
            Fault::CutPeers => cluster.cut(n, "peers").await,
            Fault::CutAll => cluster.cut(n, "all").await,
        }
    }

    /// Undoes it, and waits until the cluster is ready again.
    async fn undo(self, cluster: &NatsCluster, n: usize) -> Result<()> {
        match self {
            Fault::Kill => cluster.restart_node(n).await,
            Fault::Stop => cluster.signal_node(n, libc::SIGCONT).map(|_| ()),
            Fault::CutPeers | Fault::CutAll => cluster.heal(n).await,
        }
    }
}

pub struct ClusterParams {
    pub connections: Vec<usize>,
    pub rounds: usize,
    /// M: items per flood step (weir sets and gets M; nats publishes and fetches M),
    /// at least `msgs_per_conn` times the connections.
    pub msgs: u64,
    pub msgs_per_conn: u64,
    pub queues: usize,
    pub item_bytes: usize,
    pub failover_rounds: usize,
    /// The faults measured, each in `failover_rounds` rounds.
    pub failover_faults: Vec<Fault>,
    pub failover_writers: usize,
    /// Load before the kill.
    pub failover_load: Duration,
    /// How long after the kill an ack may take before the round counts as no recovery.
    pub failover_timeout: Duration,
    /// The raw NATS publishers' ack timeout.
    pub nats_ack_timeout: Duration,
    pub nats_base: u16,
    pub nats_dir: Option<PathBuf>,
    pub repo: Option<PathBuf>,
    pub backend: DoorBackend,
    pub skip_flood: bool,
    pub skip_failover: bool,
}

impl ClusterParams {
    /// M at `conns` connections.
    fn msgs_for(&self, conns: usize) -> u64 {
        self.msgs.max(self.msgs_per_conn * conns as u64)
    }
}

/// What a run leaves: reports (tables, JSON, CSV), charts drawn from derived reports,
/// the Markdown summary and the steps that failed.
pub struct ClusterOutput {
    pub reports: Vec<Report>,
    pub charts: Vec<(Report, ChartSpec<'static>)>,
    pub markdown: String,
    pub failures: Vec<String>,
}

/// Everything a step needs.
struct Bench<'a> {
    p: &'a ClusterParams,
    bins: &'a Binaries,
    tools: Tools,
    cluster: NatsCluster,
    admin: Admin,
    seq: AtomicU32,
}

pub async fn run(p: &ClusterParams, bins: &Binaries, bar: &ProgressBar) -> Result<ClusterOutput> {
    if p.connections.is_empty() || p.queues == 0 || p.msgs == 0 {
        bail!("cluster needs connection counts, queues and messages");
    }
    let flood_steps = if p.skip_flood {
        0
    } else {
        p.connections.len() * p.rounds * 3
    };
    let failover_steps = if p.skip_failover {
        0
    } else {
        p.failover_rounds * 2 * p.failover_faults.len()
    };
    bar.set_length((flood_steps + failover_steps) as u64);
    bar.set_message("starting the NATS cluster");
    let tools = nats::locate_tools(p.repo.as_deref()).await?;
    let bins = &door_binaries(bins, &tools);
    let cluster = NatsCluster::start(
        &tools,
        p.nats_dir.as_deref(),
        bins.work_dir.as_deref(),
        p.nats_base,
        !p.skip_failover && p.failover_faults.iter().any(|f| f.needs_netns()),
    )
    .await?;
    let admin = Admin::connect(&cluster.urls).await?;
    let b = Bench {
        p,
        bins,
        tools,
        cluster,
        admin,
        seq: AtomicU32::new(0),
    };
    let mut out = ClusterOutput {
        reports: Vec::new(),
        charts: Vec::new(),
        markdown: String::new(),
        failures: Vec::new(),
    };
    if !p.skip_flood {
        let steps = flood_compare(&b, bar, &mut out.failures).await;
        let (summary, chart) = flood_summary(p, &steps);
        out.reports.push(flood_report(p, &steps));
        out.reports.push(summary);
        out.charts.push((chart, flood_chart()));
    }
    if !p.skip_failover {
        match failover_compare(&b, bar).await {
            Ok(report) => {
                out.charts.push((report.clone(), failover_chart()));
                out.reports.push(report);
            }
            Err(e) => out.failures.push(format!("failover: {e:#}")),
        }
    }
    out.markdown = markdown(p, &b.cluster, &out.reports);
    Ok(out)
}

/// `--weir-bin`, else weir beside weir-bench or on PATH, else the repository's
/// `target/release/weir`.
fn door_binaries(bins: &Binaries, tools: &Tools) -> Binaries {
    let mut bins = bins.clone();
    if bins.weir.is_none() && crate::target::find_weir(None).is_err() {
        let built = tools.root.join("target").join("release").join("weir");
        if built.is_file() {
            bins.weir = Some(built);
        }
    }
    bins
}

impl Bench<'_> {
    /// A fresh stream name: PREFIX + a number unique in this run.
    fn stream_name(&self, prefix: &str) -> String {
        format!("{prefix}{}", self.seq.fetch_add(1, Ordering::Relaxed) + 1)
    }

    fn jetstream(&self) -> bool {
        self.p.backend == DoorBackend::Jetstream
    }

    /// A weir front door on `stream` (or on the embedded engine).
    fn spawn_door(&self, stream: &str) -> Result<Target> {
        let mut bins = self.bins.clone();
        if self.jetstream() {
            bins.weir_args.extend([
                "--backend".to_string(),
                "jetstream".to_string(),
                "--nats-servers".to_string(),
                self.cluster.url_list(),
                "--nats-stream".to_string(),
                stream.to_string(),
            ]);
        }
        Target::spawn(Kind::Weir, &bins).context("starting a weir front door")
    }

    /// Runs the `nats` CLI against the cluster.
    async fn nats(&self, args: &[String]) -> Result<String> {
        let mut cmd = tokio::process::Command::new(&self.tools.nats);
        cmd.arg("-s")
            .arg(self.cluster.url_list())
            .arg("--timeout=20s")
            .args(args);
        nats::run_command(&mut cmd, &format!("nats {}", args.join(" "))).await
    }

    /// Deletes a stream of a finished step; a failure is only reported (the stream
    /// costs the cluster idle work, not correctness).
    async fn drop_stream(&self, stream: &str) {
        if let Err(e) = self.admin.delete_stream(stream).await {
            eprintln!("weir-bench: {e:#}");
        }
        // The doors' registrations and lease records (weir's streams only; absent
        // for nats bench's).
        let _ = self.admin.delete_stream(&format!("{stream}_DOORS")).await;
    }
}

/// The three things compared in a flood round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Contender {
    Weir,
    WeirTwoDoors,
    Nats,
}

const CONTENDERS: [Contender; 3] = [Contender::Weir, Contender::WeirTwoDoors, Contender::Nats];

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Weir => "weir",
            Contender::WeirTwoDoors => "weir-2doors",
            Contender::Nats => "nats",
        }
    }
}

/// A weir flood step's figures.
#[derive(Clone, Debug)]
struct WeirStep {
    hits: u64,
    misses: u64,
    ops: u64,
    seconds: f64,
    client_cpu_s: f64,
    /// Peak VmRSS of each door.
    rss_peak: Vec<Option<u64>>,
}

/// A `nats bench` pair's figures.
#[derive(Clone, Debug)]
struct NatsStep {
    pub_rate: f64,
    fetch_rate: f64,
}

/// nats's combined rate: M items published (acked) then fetched (double-acked), over
/// the sum of the two phases' times: `1 / (1/pub + 1/fetch)`.
fn combined_rate(pub_rate: f64, fetch_rate: f64) -> f64 {
    1.0 / (1.0 / pub_rate + 1.0 / fetch_rate)
}

#[derive(Clone, Debug)]
enum Figures {
    Weir(WeirStep),
    Nats(NatsStep),
}

impl Figures {
    /// Items per second through the system, as compared.
    fn items_per_s(&self) -> f64 {
        match self {
            Figures::Weir(w) => w.hits as f64 / w.seconds,
            Figures::Nats(n) => combined_rate(n.pub_rate, n.fetch_rate),
        }
    }
}

struct FloodSample {
    conns: usize,
    round: usize,
    who: Contender,
    figures: Result<Figures, String>,
}

/// Every (connections, round, contender) step, in rotating order; a failed step is
/// kept as its error and the run goes on.
async fn flood_compare(
    b: &Bench<'_>,
    bar: &ProgressBar,
    failures: &mut Vec<String>,
) -> Vec<FloodSample> {
    let mut samples = Vec::new();
    for &conns in &b.p.connections {
        for round in 0..b.p.rounds {
            for k in 0..CONTENDERS.len() {
                let who = CONTENDERS[(round + k) % CONTENDERS.len()];
                bar.set_message(format!(
                    "flood {} x{conns}, round {}",
                    who.name(),
                    round + 1
                ));
                let figures = match who {
                    Contender::Weir => weir_flood(b, conns, 1).await.map(Figures::Weir),
                    Contender::WeirTwoDoors => weir_flood(b, conns, 2).await.map(Figures::Weir),
                    Contender::Nats => nats_flood(b, conns).await.map(Figures::Nats),
                };
                let figures = figures.map_err(|e| {
                    let msg = format!("flood {} x{conns} round {}: {e:#}", who.name(), round + 1);
                    eprintln!("weir-bench: {msg}");
                    failures.push(msg.clone());
                    msg
                });
                samples.push(FloodSample {
                    conns,
                    round: round + 1,
                    who,
                    figures,
                });
                bar.inc(1);
            }
        }
    }
    samples
}

/// One flood step through `doors` weir front doors sharing a fresh stream.
async fn weir_flood(b: &Bench<'_>, conns: usize, doors: usize) -> Result<WeirStep> {
    let stream = b.stream_name("BENCHW");
    let result = async {
        let mut targets = Vec::new();
        for _ in 0..doors {
            targets.push(b.spawn_door(&stream)?);
        }
        for t in &targets {
            warm_flood(t, b.p).await?;
        }
        let addrs: Vec<_> = targets.iter().map(|t| t.addr).collect();
        let pids: Vec<u32> = targets.iter().filter_map(|t| t.pid).collect();
        let requests = Requests::new(b.p.queues, b.p.item_bytes);
        let rss = RssPeak::start(&pids);
        let r = flood::step_over(&addrs, &pids, conns, b.p.msgs_for(conns), &requests).await;
        let rss_peak = rss.finish();
        let r = r?;
        let gets = r.ops / 2;
        Ok(WeirStep {
            hits: gets.saturating_sub(r.misses),
            misses: r.misses,
            ops: r.ops,
            seconds: r.elapsed.as_secs_f64(),
            client_cpu_s: r.cpu_s,
            rss_peak,
        })
    }
    .await;
    // The doors are stopped (dropped) by now; the stream goes with the step.
    if b.jetstream() {
        b.drop_stream(&stream).await;
    }
    result
}

/// How long a fresh door may take to answer its first requests (it connects to the
/// cluster and creates its stream).
const WARM_TIMEOUT: Duration = Duration::from_secs(30);

/// Retries `once` until it succeeds or [`WARM_TIMEOUT`] passes.
async fn retry_warm<F, Fut>(what: &str, mut once: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let until = Instant::now() + WARM_TIMEOUT;
    loop {
        match once().await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() > until => {
                return Err(e)
                    .with_context(|| format!("{what}: no success within {WARM_TIMEOUT:?}"))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// Makes a door ready for a flood, untimed: on each queue a `get` (the JetStream
/// backend creates the queue's reader), a `set` and a `get`.
async fn warm_flood(door: &Target, p: &ClusterParams) -> Result<()> {
    let data = payload(p.item_bytes);
    retry_warm("warming up a weir door", || async {
        let mut conn = Conn::connect(door.addr, 4096).await?;
        for i in 0..p.queues {
            let q = format!("db_bench{i}");
            conn.get(&get_request(&q)).await?;
            conn.set(&set_request(&q, &data)).await?;
            conn.get(&get_request(&q)).await?;
        }
        Ok(())
    })
    .await
}

/// One `nats bench` pair on a fresh stream: acked publishes, then fetch-1 +
/// double ack on a durable created in between.
async fn nats_flood(b: &Bench<'_>, conns: usize) -> Result<NatsStep> {
    let stream = b.stream_name("BENCHN");
    let subject = format!("{}.x", stream.to_lowercase());
    let s = |x: &str| x.to_string();
    let (clients, msgs) = (
        format!("--clients={conns}"),
        format!("--msgs={}", b.p.msgs_for(conns)),
    );
    let result = async {
        let publish = [
            s("bench"),
            s("js"),
            s("pub"),
            s("sync"),
            subject.clone(),
            format!("--stream={stream}"),
            s("--create"),
            s("--replicas=3"),
            s("--storage=file"),
            format!("--size={}B", b.p.item_bytes),
            clients.clone(),
            msgs.clone(),
            s("--purge"),
            s("--no-progress"),
        ];
        let out = b.nats(&publish).await?;
        let pub_rate = parse_aggregate_rate(&out).context("nats bench js pub")?;
        // Every client's fetch is a pull request waiting on the consumer: allow them all.
        let max_waiting = format!("--max-waiting={}", (2 * conns).max(512));
        let add = [
            s("consumer"),
            s("add"),
            stream.clone(),
            s("bench"),
            s("--pull"),
            s("--ack=explicit"),
            s("--deliver=all"),
            max_waiting,
            s("--defaults"),
        ];
        b.nats(&add).await?;
        let fetch = [
            s("bench"),
            s("js"),
            s("fetch"),
            format!("--stream={stream}"),
            clients.clone(),
            msgs.clone(),
            s("--acks=explicit"),
            s("--batch=1"),
            s("--doubleack"),
            s("--consumer=bench"),
            s("--no-progress"),
        ];
        let out = b.nats(&fetch).await?;
        let fetch_rate = parse_aggregate_rate(&out).context("nats bench js fetch")?;
        Ok(NatsStep {
            pub_rate,
            fetch_rate,
        })
    }
    .await;
    b.drop_stream(&stream).await;
    result
}

/// Peak resident memory of some processes, sampled every 100 ms until finished.
struct RssPeak {
    peaks: Arc<Vec<AtomicU64>>,
    task: tokio::task::JoinHandle<()>,
}

impl RssPeak {
    fn start(pids: &[u32]) -> RssPeak {
        let peaks: Arc<Vec<AtomicU64>> = Arc::new(pids.iter().map(|_| AtomicU64::new(0)).collect());
        let (mine, pids) = (Arc::clone(&peaks), pids.to_vec());
        let task = tokio::spawn(async move {
            loop {
                for (peak, &pid) in mine.iter().zip(&pids) {
                    if let Ok(rss) = sys::vm_rss_bytes(pid) {
                        peak.fetch_max(rss, Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        RssPeak { peaks, task }
    }

    /// Each process's peak (one last sample taken now); `None` when never readable.
    fn finish(self) -> Vec<Option<u64>> {
        self.task.abort();
        self.peaks
            .iter()
            .map(|p| Some(p.load(Ordering::Relaxed)).filter(|&v| v > 0))
            .collect()
    }
}

fn max_rss(peaks: &[Option<u64>]) -> Option<u64> {
    peaks.iter().flatten().copied().max()
}

/// The per-step table.
fn flood_report(p: &ClusterParams, samples: &[FloodSample]) -> Report {
    let mut r = Report::new(
        "cluster-flood",
        format!(
            "cluster flood: M = {} items of {} B per step{} (weir: set+get over {} queues; nats: bench js pub sync + fetch --batch=1 --doubleack)",
            p.msgs,
            p.item_bytes,
            if p.msgs_per_conn > 0 {
                format!(", at least {} per connection", p.msgs_per_conn)
            } else {
                String::new()
            },
            p.queues
        ),
    );
    for s in samples {
        let row = Row::new()
            .with("connections", s.conns as u64)
            .with("round", s.round as u64)
            .with("target", s.who.name());
        r.rows.push(match &s.figures {
            Err(e) => row.with("error", one_line(e)),
            Ok(fig) => {
                let row = row.with("items/s", f(fig.items_per_s(), 0));
                match fig {
                    Figures::Weir(w) => row
                        .with("flood_ops/s", f(w.ops as f64 / w.seconds, 0))
                        .with("hits", w.hits)
                        .with("misses", w.misses)
                        .with("seconds", f(w.seconds, 2))
                        .with("client_cpu_s", f(w.client_cpu_s, 2))
                        .with("door_rss_peak_MiB", mib(max_rss(&w.rss_peak))),
                    Figures::Nats(n) => row
                        .with("pub_msg/s", f(n.pub_rate, 0))
                        .with("fetch_msg/s", f(n.fetch_rate, 0)),
                }
            }
        });
    }
    r.notes.push(FORMULA.to_string());
    r
}

const FORMULA: &str = "items/s: nats = 1 / (1/pub + 1/fetch) (M items published with acks, then fetched one at a time with double acks: M / (M/pub + M/fetch)); weir = hits / seconds (gets that returned an item, over the wall time of M sets + M gets; a miss moves no item)";

/// Medians by connection count, the ratios and the goals; and the chart's rows.
fn flood_summary(p: &ClusterParams, samples: &[FloodSample]) -> (Report, Report) {
    let mut r = Report::new(
        "cluster",
        format!("cluster: medians over {} round(s), items/s", p.rounds),
    );
    let mut chart = Report::new("cluster-flood", "cluster flood medians");
    for &conns in &p.connections {
        let rate = |who: Contender, round: usize| {
            samples
                .iter()
                .find(|s| s.conns == conns && s.who == who && s.round == round)
                .and_then(|s| s.figures.as_ref().ok())
                .map(Figures::items_per_s)
        };
        let rounds: Vec<usize> = (1..=p.rounds).collect();
        let med = |who| median(rounds.iter().filter_map(|&k| rate(who, k)).collect());
        let ratios = |a, b| -> Vec<f64> {
            rounds
                .iter()
                .filter_map(|&k| Some(rate(a, k)? / rate(b, k)?))
                .collect()
        };
        let vs_nats = ratios(Contender::Weir, Contender::Nats);
        let two = ratios(Contender::WeirTwoDoors, Contender::Weir);
        let rss = samples
            .iter()
            .filter(|s| s.conns == conns)
            .filter_map(|s| match &s.figures {
                Ok(Figures::Weir(w)) => max_rss(&w.rss_peak),
                _ => None,
            })
            .max();
        for who in CONTENDERS {
            if let Some(m) = med(who) {
                chart.rows.push(
                    Row::new()
                        .with("connections", conns as u64)
                        .with("target", who.name())
                        .with("items/s", f(m, 0)),
                );
            }
        }
        r.rows.push(
            Row::new()
                .with("connections", conns as u64)
                .with("weir", opt(med(Contender::Weir), 0))
                .with("weir-2doors", opt(med(Contender::WeirTwoDoors), 0))
                .with("nats", opt(med(Contender::Nats), 0))
                .with("weir/nats", opt(median(vs_nats.clone()), 2))
                .with("weir/nats rounds", list(&vs_nats))
                .with("2doors/1door", opt(median(two.clone()), 2))
                .with("2doors/1door rounds", list(&two))
                .with("door_rss_peak_MiB", mib(rss)),
        );
    }
    goal_notes(&mut r);
    (r, chart)
}

/// An error message for a table cell: its last line (the root cause), at most 100
/// characters; the whole message is in the run's failures.
fn one_line(e: &str) -> String {
    let line = e
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or(e)
        .trim();
    match line.char_indices().nth(100) {
        Some((i, _)) => format!("{}...", &line[..i]),
        None => line.to_string(),
    }
}

/// A number with `d` decimals, or an empty cell.
fn opt(v: Option<f64>, d: usize) -> crate::report::Cell {
    v.map_or(crate::report::Cell::Empty, |v| f(v, d))
}

fn list(v: &[f64]) -> String {
    let parts: Vec<String> = v.iter().map(|x| format!("{x:.2}")).collect();
    parts.join(" ")
}

/// The goals against the summary's ratios.
fn goal_notes(r: &mut Report) {
    let col = |name: &str| -> Vec<(u64, f64)> {
        r.rows
            .iter()
            .filter_map(|row| {
                Some((
                    row.get("connections")?.as_f64()? as u64,
                    row.get(name)?.as_f64()?,
                ))
            })
            .collect()
    };
    let verdict = |v: &[(u64, f64)], ok: &dyn Fn(f64) -> bool| -> String {
        let parts: Vec<String> = v
            .iter()
            .map(|(c, x)| format!("{c}: {x:.2} {}", if ok(*x) { "met" } else { "NOT met" }))
            .collect();
        if parts.is_empty() {
            "no figures".to_string()
        } else {
            parts.join(", ")
        }
    };
    let nats = col("weir/nats");
    let two = col("2doors/1door");
    r.notes.push(format!(
        "goal weir >= 0.7 x nats (median of rounds): {}",
        verdict(&nats, &|x| x >= 0.7)
    ));
    r.notes.push(format!(
        "goal two doors >= 1.6 x one door (median of rounds): {}",
        verdict(&two, &|x| x >= 1.6)
    ));
    r.notes.push(FORMULA.to_string());
}

fn flood_chart() -> ChartSpec<'static> {
    ChartSpec {
        file: "cluster-flood",
        title: "cluster: items/s, acked write + acked read (medians)",
        x_label: "connections",
        y_label: "items per second",
        x_key: "connections",
        y_key: "items/s",
        y_div: 1.0,
        series_key: "target",
        log_y: false,
    }
}

fn failover_chart() -> ChartSpec<'static> {
    ChartSpec {
        file: "cluster-failover",
        title: "cluster: a fault at the leader to the first ack after it",
        x_label: "round",
        y_label: "seconds",
        x_key: "round",
        y_key: "gap_s",
        y_div: 1.0,
        series_key: "writer",
        log_y: false,
    }
}

/// Which writers a failover measurement uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Writer {
    Weir,
    Nats,
}

impl Writer {
    fn name(self) -> &'static str {
        match self {
            Writer::Weir => "weir",
            Writer::Nats => "nats",
        }
    }
}

/// One failover measurement.
struct FailoverRound {
    killed: String,
    new_leader: Option<String>,
    outcome: Outcome,
    rss_peak: Option<u64>,
}

/// The streams of the failover measurements and the weir door writing to its own.
struct FailoverSetup {
    weir_stream: String,
    nats_stream: String,
    nats_subject: String,
    door: Target,
}

/// `--failover-rounds` rounds, weir and raw NATS alternating first.
async fn failover_compare(b: &Bench<'_>, bar: &ProgressBar) -> Result<Report> {
    let nats_stream = b.stream_name("BENCHE");
    let nats_subject = format!("{}.x", nats_stream.to_lowercase());
    b.admin.create_stream(&nats_stream, &nats_subject).await?;
    let weir_stream = b.stream_name("BENCHF");
    let door = b.spawn_door(&weir_stream)?;
    let s = FailoverSetup {
        weir_stream,
        nats_stream,
        nats_subject,
        door,
    };
    let mut r = Report::new(
        "cluster-failover",
        format!(
            "cluster failover: {} writers, one ack in flight each; the stream leader's node faulted ({}) after {:.1} s of load",
            b.p.failover_writers,
            b.p.failover_faults.iter().map(|f| f.name()).collect::<Vec<_>>().join(", "),
            b.p.failover_load.as_secs_f64()
        ),
    );
    let result = failover_rounds(b, &s, bar, &mut r).await;
    if result.is_ok() {
        failover_notes(&mut r, &s, &b.p.failover_faults);
    }
    let FailoverSetup {
        weir_stream,
        nats_stream,
        door,
        ..
    } = s;
    drop(door);
    b.drop_stream(&nats_stream).await;
    if b.jetstream() {
        b.drop_stream(&weir_stream).await;
    }
    result.map(|()| r)
}

async fn failover_rounds(
    b: &Bench<'_>,
    s: &FailoverSetup,
    bar: &ProgressBar,
    r: &mut Report,
) -> Result<()> {
    retry_warm("warming up the failover door", || async {
        let mut conn = Conn::connect(s.door.addr, 4096).await?;
        conn.get(&get_request("failover")).await?;
        conn.set(&set_request("failover", &payload(b.p.item_bytes)))
            .await
    })
    .await?;
    for (fault, round) in
        b.p.failover_faults
            .iter()
            .flat_map(|&f| (0..b.p.failover_rounds).map(move |r| (f, r)))
    {
        let order = if round % 2 == 0 {
            [Writer::Weir, Writer::Nats]
        } else {
            [Writer::Nats, Writer::Weir]
        };
        for w in order {
            let step = format!("failover {} {} round {}", fault.name(), w.name(), round + 1);
            bar.set_message(step.clone());
            let fr = failover_round(b, s, w, fault)
                .await
                .with_context(|| step.clone())?;
            let o = &fr.outcome;
            r.rows.push(
                Row::new()
                    .with("round", round as u64 + 1)
                    .with("fault", fault.name())
                    .with("writer", w.name())
                    .with("killed", fr.killed.clone())
                    .with(
                        "new_leader",
                        fr.new_leader.clone().unwrap_or_else(|| "-".into()),
                    )
                    .with("gap_s", opt(o.gap.map(|g| g.as_secs_f64()), 2))
                    .with("acked_before", o.acked_before)
                    .with("acked_after", o.acked_after)
                    .with("refused_after", o.refused_after)
                    .with(
                        "last_refused_s",
                        opt(o.last_refused.map(|d| d.as_secs_f64()), 2),
                    )
                    .with("refused_before", o.refused_before)
                    .with("door_rss_peak_MiB", mib(fr.rss_peak)),
            );
            bar.inc(1);
        }
    }
    Ok(())
}

/// The writers of one failover measurement, started.
async fn start_writers(
    b: &Bench<'_>,
    s: &FailoverSetup,
    w: Writer,
    rec: &Arc<Recorder>,
) -> Result<Writers> {
    Ok(match w {
        Writer::Weir => {
            failover::weir_writers(
                s.door.addr,
                b.p.failover_writers,
                "failover",
                b.p.item_bytes,
                rec,
            )
            .await?
        }
        Writer::Nats => {
            failover::nats_writers(
                &b.cluster.urls,
                b.p.failover_writers,
                &s.nats_subject,
                b.p.item_bytes,
                b.p.nats_ack_timeout,
                rec,
            )
            .await?
        }
    })
}

/// Load, fault the stream leader's node, wait for the first ack after it, stop; then
/// undo the fault and wait until the streams have 3 current replicas again.
async fn failover_round(
    b: &Bench<'_>,
    s: &FailoverSetup,
    w: Writer,
    fault: Fault,
) -> Result<FailoverRound> {
    let rec = Arc::new(Recorder::default());
    let writers = start_writers(b, s, w, &rec).await?;
    let pids: Vec<u32> = if w == Writer::Weir {
        s.door.pid.into_iter().collect()
    } else {
        Vec::new()
    };
    let rss = RssPeak::start(&pids);
    tokio::time::sleep(b.p.failover_load).await;
    // The embedded backend has no stream: it kills the NATS stream's leader (a check
    // of the bench only; weir does not notice).
    let stream = if w == Writer::Weir && b.jetstream() {
        &s.weir_stream
    } else {
        &s.nats_stream
    };
    let killed = match b.admin.wait_leader(stream, Duration::from_secs(10)).await {
        Ok(l) => l,
        Err(e) => {
            failover::finish(&rec, writers).await?;
            return Err(e);
        }
    };
    let node = node_of(&killed)?;
    let kill_at = match fault.apply(&b.cluster, node).await {
        Ok(at) => at,
        Err(e) => {
            failover::finish(&rec, writers).await?;
            return Err(e);
        }
    };
    rec.set_kill(kill_at);
    let (events, new_leader) = after_kill(b, &rec, writers, stream, kill_at).await;
    let rss_peak = max_rss(&rss.finish());
    fault.undo(&b.cluster, node).await?;
    for st in [&s.nats_stream, &s.weir_stream] {
        if st == &s.nats_stream || b.jetstream() {
            b.admin.wait_current(st, 3, Duration::from_secs(60)).await?;
        }
    }
    let outcome = failover::summarize(kill_at, &events?);
    Ok(FailoverRound {
        killed,
        new_leader,
        outcome,
        rss_peak,
    })
}

/// Waits for recovery (or the timeout), lets the writers run a little longer, stops
/// them; and asks who leads now.
async fn after_kill(
    b: &Bench<'_>,
    rec: &Recorder,
    writers: Writers,
    stream: &str,
    kill_at: Instant,
) -> (Result<Vec<failover::Event>>, Option<String>) {
    let until = kill_at + b.p.failover_timeout;
    while !rec.recovered() && Instant::now() < until && !writers.is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let events = failover::finish(rec, writers).await;
    let leader = b
        .admin
        .wait_leader(stream, Duration::from_secs(30))
        .await
        .ok();
    (events, leader)
}

/// Medians, the ratio and the goal, per fault.
fn failover_notes(r: &mut Report, s: &FailoverSetup, faults: &[Fault]) {
    for &fault in faults {
        let gaps = |w: Writer| -> (Vec<f64>, usize) {
            let rows: Vec<_> = r
                .rows
                .iter()
                .filter(|x| x.get("writer").is_some_and(|c| c.text() == w.name()))
                .filter(|x| x.get("fault").is_some_and(|c| c.text() == fault.name()))
                .collect();
            let gaps: Vec<f64> = rows
                .iter()
                .filter_map(|x| x.get("gap_s")?.as_f64())
                .collect();
            let lost = rows.len() - gaps.len();
            (gaps, lost)
        };
        let ((wg, wl), (ng, nl)) = (gaps(Writer::Weir), gaps(Writer::Nats));
        let (wm, nm) = (median(wg.clone()), median(ng.clone()));
        let lost = |n: usize| {
            if n > 0 {
                format!("; {n} without recovery")
            } else {
                String::new()
            }
        };
        r.notes.push(format!(
            "{}: median gap weir {} s (rounds {}{}), nats {} s (rounds {}{})",
            fault.name(),
            wm.map_or("-".into(), |v| format!("{v:.2}")),
            list(&wg),
            lost(wl),
            nm.map_or("-".into(), |v| format!("{v:.2}")),
            list(&ng),
            lost(nl),
        ));
        if let (Some(w), Some(n)) = (wm, nm) {
            let ratio = w / n;
            r.notes.push(format!(
                "{}: goal weir gap <= 2 x nats gap: {ratio:.2} {}",
                fault.name(),
                if ratio <= 2.0 { "met" } else { "NOT met" }
            ));
        }
    }
    r.notes.push(format!(
        "gap = the fault at the stream leader's nats-server to the first ack completing more than {} ms after it; weir writes to stream {}, nats to {} (raw publishers ping their server every 2 s, as weir does)",
        failover::IN_FLIGHT.as_millis(),
        s.weir_stream,
        s.nats_stream
    ));
}

/// The Markdown summary: how it ran, then every report.
fn markdown(p: &ClusterParams, cluster: &NatsCluster, reports: &[Report]) -> String {
    let args: Vec<String> = std::env::args().collect();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut out = String::from("## weir-bench cluster\n\n");
    out.push_str(&format!(
        "- command: `{}`\n- cluster: 3 nats-server nodes at {} (scripts/nats-cluster), R3 file streams; weir backend: {:?}\n- load average at the end: {}\n- nice: the bench sets none; every process inherits the caller's niceness\n\n",
        args.join(" "),
        cluster.url_list(),
        p.backend,
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    ));
    for r in reports {
        out.push_str(&r.markdown());
        out.push('\n');
    }
    out
}
