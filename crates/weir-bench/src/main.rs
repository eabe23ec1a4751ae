//! weir-bench: the seeds' benchmarks (defined in docs/benchmarks.md), reproduced on one load
//! generator against weir and reference servers in the same run.
//!
//! Subcommands: `flood`, `packing`, `packing-unpacking`, `mem-rss` (any memcache-protocol
//! server, `--target NAME=HOST:PORT` or `--spawn weir|memcached`), `library` (the engine
//! in-process), `beanstalk` (any beanstalkd-protocol server, or Debian's beanstalkd
//! spawned in its durability modes), `all`, and `cluster` (weir front doors on a NATS JetStream cluster it
//! starts, against `nats bench` on the same cluster). Each prints a table per benchmark on stdout and leaves JSON,
//! CSV and a PNG chart in `--out DIR`. Every knob is a flag whose default is the seeds'
//! value; `--quick` scales everything down for a smoke run.
//!
//! Why a tool of our own: the seeds' numbers are the public bar, and they only mean
//! something when the reference server runs beside weir on the same machine with the
//! same client, a client that is not itself the limit (its CPU time is reported).

// The flags' doc comments are clap's help, where `[1024]` is a default, not a link.
#![allow(rustdoc::broken_intra_doc_links)]

mod beanstalk;
mod beanstalk_backlog;
mod beanstalk_params;
mod beanstalk_proto;
mod beanstalk_server;
mod bus;
mod bus_http;
mod bus_scale;
mod chart;
mod cluster;
mod failover;
mod flood;
mod library;
mod mem_rss;
mod nats;
mod packing;
mod proto;
mod proxy;
mod proxy_http;
mod proxy_upload;
mod queues;
mod report;
mod sys;
mod target;

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use crate::chart::ChartSpec;
use crate::report::Report;
use crate::target::{find_weir, parse_named, Binaries, Kind, Target};

#[derive(Parser)]
#[command(
    name = "weir-bench",
    version,
    about = "The seeds' queue benchmarks against weir and reference servers: tables, JSON/CSV and PNG charts",
    after_help = "Example: weir-bench all --spawn weir --spawn memcached --out results/"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

// One value, parsed once: boxing the big variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Many connections alternating set/get of 64 B items over 10 queues.
    Flood {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        flood: FloodArgs,
    },
    /// One queue growing to 8,388,608 items of 1 KiB; set/get rate at each step.
    Packing {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        packing: PackingArgs,
    },
    /// One queue growing to 265,634,816 items of 64 B and draining back to 0.
    PackingUnpacking {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        pu: PuArgs,
    },
    /// Server RSS after setting and getting N items of 1 KiB.
    MemRss {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        rss: MemRssArgs,
    },
    /// 10,000 queues: setup, idle CPU, stats, flush_all_expired and flush_all.
    Queues {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        queues: QueuesArgs,
    },
    /// popout's suite on the engine in-process, with physical references.
    Library {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        lib: LibraryArgs,
    },
    /// beanstalkd's work queue: put + reserve + delete at 1, 10, 100 connections,
    /// memory with 1,000,000 ready and delayed jobs, restart on the binlog.
    Beanstalk {
        #[command(flatten)]
        common: BsCommon,
        #[command(flatten)]
        bs: BeanstalkArgs,
    },
    /// Every benchmark above, in order (spawned servers are fresh for each).
    All {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        flood: FloodArgs,
        #[command(flatten)]
        packing: PackingArgs,
        #[command(flatten)]
        pu: PuArgs,
        #[command(flatten)]
        rss: MemRssArgs,
        #[command(flatten)]
        lib: LibraryArgs,
        #[command(flatten)]
        queues: QueuesArgs,
        /// Skip the library suite.
        #[arg(long)]
        skip_library: bool,
        /// Skip the many-queues step.
        #[arg(long)]
        skip_queues: bool,
        /// Skip packing-unpacking (hours at the seeds' size).
        #[arg(long)]
        skip_packing_unpacking: bool,
        /// Skip the beanstalk step (it runs on spawned beanstalkd servers, and says
        /// so and is skipped when beanstalkd is not installed).
        #[arg(long)]
        skip_beanstalk: bool,
    },
    /// The event bus by the seed's method: ingestion vs a bare HTTP server, publish
    /// latency, delivery latency, the 240-connection run, memory with a backlog.
    Bus {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        bus: BusArgs,
    },
    /// rocky's suites against weir's proxy, nginx with mirror and the primary
    /// directly: open-loop latency, closed-loop throughput, memory over time.
    Proxy {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        proxy: ProxyArgs,
    },
    /// weir front doors on a 3-node NATS JetStream cluster (started here) against
    /// `nats bench`: flood, two doors, failover under load, RSS.
    Cluster {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Internal: the proxy suite's primary (answers without reading the body).
    #[command(hide = true)]
    HelloHttp { addr: String },
    /// Internal: the proxy suite's shadows (never answer).
    #[command(hide = true)]
    SilentHttp { addr: String },
    /// Internal: the slow-upload step's primary (reads each body to its end).
    #[command(hide = true)]
    DrainHttp { addr: String },
    /// Internal: the bus suite's bare reference server (answers 204 to every POST).
    #[command(hide = true)]
    BareHttp { addr: String },
    /// Internal: open a store, print open time, RSS and item count as JSON.
    #[command(hide = true)]
    ProbeOpen { dir: PathBuf },
}

#[derive(Args, Clone)]
struct Common {
    /// A server to test, NAME=HOST:PORT (repeatable; results side by side).
    #[arg(long = "target", value_name = "NAME=HOST:PORT")]
    targets: Vec<String>,
    /// The pid of a --target's server, NAME=PID, for RSS (VmRSS of /proc/PID/status).
    #[arg(long = "pid", value_name = "NAME=PID")]
    pids: Vec<String>,
    /// The data directory of a --target's server, NAME=DIR, for disk use.
    #[arg(long = "data-dir", value_name = "NAME=DIR")]
    data_dirs: Vec<String>,
    /// Start this server on free loopback ports with a fresh data dir (weir, memcached;
    /// repeatable). Spawned servers come first, in the order given.
    #[arg(long = "spawn", value_name = "KIND")]
    spawn: Vec<Kind>,
    /// The weir binary (default: beside weir-bench, else on PATH).
    #[arg(long, value_name = "PATH")]
    weir_bin: Option<PathBuf>,
    /// The memcached binary (default: on PATH).
    #[arg(long, value_name = "PATH")]
    memcached_bin: Option<PathBuf>,
    /// An extra argument for a spawned `weir serve` (repeatable).
    #[arg(long = "weir-arg", value_name = "ARG", allow_hyphen_values = true)]
    weir_args: Vec<String>,
    /// Where spawned servers' temporary data directories go (default: the system temp dir).
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
    /// Output directory for JSON, CSV and PNG files.
    #[arg(long, value_name = "DIR", default_value = "results")]
    out: PathBuf,
    /// Scale everything down (a smoke run of a minute or two).
    #[arg(long)]
    quick: bool,
    /// TrueType font for the charts (default: DejaVu Sans from fonts-dejavu-core).
    #[arg(long, value_name = "FILE")]
    font: Option<PathBuf>,
}

/// The servers and output of `beanstalk` (its own: the kinds it spawns differ).
#[derive(Args, Clone)]
struct BsCommon {
    /// A server that speaks beanstalkd's protocol, NAME=HOST:PORT (repeatable).
    #[arg(long = "target", value_name = "NAME=HOST:PORT")]
    targets: Vec<String>,
    /// The pid of a --target's server, NAME=PID, for RSS and server CPU time.
    #[arg(long = "pid", value_name = "NAME=PID")]
    pids: Vec<String>,
    /// Spawn a server on a free loopback port with fresh files: beanstalkd-f1000
    /// (-f 1000), beanstalkd-f0 (-f 0), beanstalkd-nobinlog, weir-periodic,
    /// weir-synced (weir's beanstalkd door, every queue at that durability)
    /// (repeatable) [all five when no --target is given].
    #[arg(long = "spawn", value_name = "KIND")]
    spawn: Vec<beanstalk_server::BsKind>,
    /// The beanstalkd binary (default: on PATH, else /usr/bin/beanstalkd).
    #[arg(long, value_name = "PATH")]
    beanstalkd_bin: Option<PathBuf>,
    /// The weir binary (default: beside weir-bench, else on PATH).
    #[arg(long, value_name = "PATH")]
    weir_bin: Option<PathBuf>,
    /// Where spawned servers' temporary directories go (default: the system temp dir).
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
    /// Output directory for JSON, CSV and PNG files.
    #[arg(long, value_name = "DIR", default_value = "results")]
    out: PathBuf,
    /// Scale everything down (a smoke run of seconds).
    #[arg(long)]
    quick: bool,
    /// TrueType font for the charts (default: DejaVu Sans from fonts-dejavu-core).
    #[arg(long, value_name = "FILE")]
    font: Option<PathBuf>,
}

#[derive(Args, Clone)]
struct BeanstalkArgs {
    /// Connection counts [1,10,100; quick: 1,10].
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    connections: Option<Vec<usize>>,
    /// Jobs (put + reserve + delete) per step at most, split over the connections
    /// [200000; quick: 2000].
    #[arg(long, value_name = "N")]
    jobs: Option<u64>,
    /// Seconds per step at most (fsync-bound servers end here) [10; quick: 1].
    #[arg(long, value_name = "S")]
    seconds: Option<f64>,
    /// Job size [100].
    #[arg(long, value_name = "BYTES", default_value_t = 100)]
    size: usize,
    /// Rounds per connection count, the targets' order reversed every other round;
    /// the summary is the median [3; quick: 1].
    #[arg(long, value_name = "N")]
    rounds: Option<usize>,
    /// Jobs queued for the memory and restart steps; 0 skips them [1000000; quick: 10000].
    #[arg(long, value_name = "N")]
    backlog: Option<u64>,
    /// Delay of the delayed jobs, seconds [3600].
    #[arg(long, value_name = "S", default_value_t = 3600)]
    delay: u32,
    /// Skip the restart measurement.
    #[arg(long)]
    skip_restart: bool,
}

impl BeanstalkArgs {
    fn resolve(&self, quick: bool) -> beanstalk::BeanstalkParams {
        beanstalk::BeanstalkParams {
            connections: self.connections.clone().unwrap_or_else(|| {
                if quick {
                    vec![1, 10]
                } else {
                    vec![1, 10, 100]
                }
            }),
            jobs: self.jobs.unwrap_or(if quick { 2_000 } else { 200_000 }),
            seconds: self.seconds.unwrap_or(if quick { 1.0 } else { 10.0 }),
            size: self.size,
            rounds: self.rounds.unwrap_or(if quick { 1 } else { 3 }).max(1),
            backlog: self
                .backlog
                .unwrap_or(if quick { 10_000 } else { 1_000_000 }),
            delay_seconds: self.delay,
            skip_restart: self.skip_restart,
        }
    }
}

#[derive(Args, Clone)]
struct FloodArgs {
    /// Connection counts [seeds: 1,2,5,10,50,100,200,300,400,600,800,1000,2000,4000,6000,8000; quick: 1,10,100,1000].
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    flood_connections: Option<Vec<usize>>,
    /// Sets per step, as many gets again [seeds: 1000000; quick: 20000].
    #[arg(long, value_name = "N")]
    flood_sets: Option<u64>,
    /// Queues, db_bench0.. [10].
    #[arg(long, value_name = "N", default_value_t = 10)]
    flood_queues: usize,
    /// Item size [64].
    #[arg(long, value_name = "BYTES", default_value_t = 64)]
    flood_item_bytes: usize,
    /// Rounds per connection count, the targets' order reversed every other round
    /// (A B, B A, ...) so that a drift of the machine's speed hits both alike; ratios
    /// are reported per round and as their median [1].
    #[arg(long, value_name = "N", default_value_t = 1)]
    flood_repeat: usize,
}

const FLOOD_CONNECTIONS: &[usize] = &[
    1, 2, 5, 10, 50, 100, 200, 300, 400, 600, 800, 1000, 2000, 4000, 6000, 8000,
];

impl FloodArgs {
    fn resolve(&self, quick: bool) -> flood::FloodParams {
        flood::FloodParams {
            connections: self.flood_connections.clone().unwrap_or_else(|| {
                if quick {
                    vec![1, 10, 100, 1000]
                } else {
                    FLOOD_CONNECTIONS.to_vec()
                }
            }),
            sets: self
                .flood_sets
                .unwrap_or(if quick { 20_000 } else { 1_000_000 }),
            queues: self.flood_queues,
            repeat: self.flood_repeat.max(1),
            item_bytes: self.flood_item_bytes,
        }
    }
}

#[derive(Args, Clone)]
struct PackingArgs {
    /// Backlog steps [seeds: 0,1024,16384,65536,262144,1048576,4194304,8388608; quick: 0,1024,16384].
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    packing_steps: Option<Vec<u64>>,
    /// Sets per step, interleaved with as many gets [seeds: 100000; quick: 5000].
    #[arg(long, value_name = "N")]
    packing_ops: Option<u64>,
    /// Item size [1024].
    #[arg(long, value_name = "BYTES", default_value_t = 1024)]
    packing_item_bytes: usize,
    /// Queue name [packing].
    #[arg(long, value_name = "NAME", default_value = "packing")]
    packing_queue: String,
}

impl PackingArgs {
    fn resolve(&self, quick: bool) -> packing::PackingParams {
        packing::PackingParams {
            bench: "packing",
            queue: self.packing_queue.clone(),
            item_bytes: self.packing_item_bytes,
            steps: self.packing_steps.clone().unwrap_or_else(|| {
                if quick {
                    vec![0, 1024, 16384]
                } else {
                    vec![0, 1024, 16384, 65536, 262144, 1048576, 4194304, 8388608]
                }
            }),
            ops: self
                .packing_ops
                .unwrap_or(if quick { 5_000 } else { 100_000 }),
        }
    }
}

const PU_GROW: &[u64] = &[
    0, 1024, 17408, 82944, 345088, 1393664, 5587968, 13976576, 30753792, 64308224, 131417088,
    265634816,
];

#[derive(Args, Clone)]
struct PuArgs {
    /// Growth steps [seeds: 0,1024,17408,82944,345088,1393664,5587968,13976576,30753792,64308224,131417088,265634816; quick: 0,1024,17408,82944].
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    pu_steps: Option<Vec<u64>>,
    /// Drop growth steps above this many items (e.g. 30753792 for a run of an hour).
    #[arg(long, value_name = "N")]
    pu_max_items: Option<u64>,
    /// Items drained per step on the way down [seeds: 22136234; quick: 30000].
    #[arg(long, value_name = "N")]
    pu_drain_step: Option<u64>,
    /// Sets per step, interleaved with as many gets [seeds: 200000; quick: 5000].
    #[arg(long, value_name = "N")]
    pu_ops: Option<u64>,
    /// Item size [64].
    #[arg(long, value_name = "BYTES", default_value_t = 64)]
    pu_item_bytes: usize,
    /// Queue name [packing_unpacking].
    #[arg(long, value_name = "NAME", default_value = "packing_unpacking")]
    pu_queue: String,
}

impl PuArgs {
    fn resolve(&self, quick: bool) -> packing::PackingParams {
        let mut grow = self.pu_steps.clone().unwrap_or_else(|| {
            if quick {
                vec![0, 1024, 17408, 82944]
            } else {
                PU_GROW.to_vec()
            }
        });
        if let Some(max) = self.pu_max_items {
            grow.retain(|&n| n <= max);
        }
        let drain = self
            .pu_drain_step
            .unwrap_or(if quick { 30_000 } else { 22_136_234 });
        packing::PackingParams {
            bench: "packing-unpacking",
            queue: self.pu_queue.clone(),
            item_bytes: self.pu_item_bytes,
            steps: packing::grow_then_drain(&grow, drain),
            ops: self.pu_ops.unwrap_or(if quick { 5_000 } else { 200_000 }),
        }
    }
}

#[derive(Args, Clone)]
struct MemRssArgs {
    /// Item counts [seeds: 0,1024,2048,4096,8192,16384,32768,65536,131072,262024,524048; quick: 0,1024,2048,4096,8192].
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    rss_steps: Option<Vec<u64>>,
    /// Item size [1024].
    #[arg(long, value_name = "BYTES", default_value_t = 1024)]
    rss_item_bytes: usize,
    /// Queue name [mem_rss].
    #[arg(long, value_name = "NAME", default_value = "mem_rss")]
    rss_queue: String,
}

impl MemRssArgs {
    fn resolve(&self, quick: bool) -> mem_rss::MemRssParams {
        mem_rss::MemRssParams {
            queue: self.rss_queue.clone(),
            item_bytes: self.rss_item_bytes,
            steps: self.rss_steps.clone().unwrap_or_else(|| {
                if quick {
                    vec![0, 1024, 2048, 4096, 8192]
                } else {
                    vec![
                        0, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262024, 524048,
                    ]
                }
            }),
        }
    }
}

#[derive(Args, Clone)]
struct QueuesArgs {
    /// Queues [10000; quick: 300].
    #[arg(long, value_name = "N")]
    queues_count: Option<usize>,
    /// Items in each queue [3].
    #[arg(long, value_name = "N", default_value_t = 3)]
    queues_items: u64,
    /// Item size [64].
    #[arg(long, value_name = "BYTES", default_value_t = 64)]
    queues_item_bytes: usize,
    /// Connections creating the queues [8].
    #[arg(long, value_name = "N", default_value_t = 8)]
    queues_connections: usize,
    /// Seconds of the idle CPU measurement [10; quick: 1].
    #[arg(long, value_name = "S")]
    queues_idle_seconds: Option<f64>,
    /// Runs of each whole-store command, medians reported [3; quick: 1].
    #[arg(long, value_name = "N")]
    queues_repeat: Option<usize>,
}

impl QueuesArgs {
    fn resolve(&self, quick: bool) -> queues::QueuesParams {
        queues::QueuesParams {
            queues: self
                .queues_count
                .unwrap_or(if quick { 300 } else { 10_000 }),
            items_per_queue: self.queues_items,
            item_bytes: self.queues_item_bytes,
            connections: self.queues_connections.max(1),
            idle_seconds: self
                .queues_idle_seconds
                .unwrap_or(if quick { 1.0 } else { 10.0 }),
            repeat: self
                .queues_repeat
                .unwrap_or(if quick { 1 } else { 3 })
                .max(1),
        }
    }
}

#[derive(Args, Clone)]
struct ProxyArgs {
    /// Seconds of each open-loop step [10; quick: 2].
    #[arg(long, value_name = "S")]
    proxy_seconds: Option<f64>,
    /// Seconds of the closed-loop throughput step [10; quick: 2].
    #[arg(long, value_name = "S")]
    proxy_throughput_seconds: Option<f64>,
    /// Connections of the throughput step [64].
    #[arg(long, value_name = "N", default_value_t = 64)]
    proxy_connections: usize,
    /// Seconds of the memory run at 100 req/s [300; quick: 5].
    #[arg(long, value_name = "S")]
    proxy_soak_seconds: Option<f64>,
    /// Rounds of the replay-cost step: forward GET 100/s without and with replay to
    /// the 2 silent shadows, and direct, in rotating order [5; quick: 1].
    #[arg(long, value_name = "N")]
    proxy_rounds: Option<usize>,
    /// The nginx binary for the reference (default: on PATH; none: no reference).
    #[arg(long, value_name = "PATH")]
    nginx_bin: Option<PathBuf>,
    /// Leave nginx out even when it is found.
    #[arg(long)]
    no_nginx: bool,
    /// Concurrent slow uploads of the upload step [2000; quick: 200].
    #[arg(long, value_name = "N")]
    proxy_uploads: Option<usize>,
    /// Bytes of each upload [1048576].
    #[arg(long, value_name = "B", default_value_t = 1024 * 1024)]
    proxy_upload_bytes: usize,
    /// Seconds each upload takes to send its body [10; quick: 3].
    #[arg(long, value_name = "S")]
    proxy_upload_seconds: Option<f64>,
    /// Seconds after the uploads when weir's RSS is read again [30; quick: 5].
    #[arg(long, value_name = "S")]
    proxy_settle_seconds: Option<f64>,
    /// Rounds of the upload step [3; quick: 1].
    #[arg(long, value_name = "N")]
    proxy_upload_rounds: Option<usize>,
    /// `[proxy] body_memory_max` of the upload step's weir (default: weir's).
    #[arg(long, value_name = "BYTES")]
    proxy_body_memory_max: Option<u64>,
    /// Run only the upload step.
    #[arg(long)]
    proxy_uploads_only: bool,
}

impl ProxyArgs {
    fn resolve(&self, quick: bool) -> proxy::ProxyParams {
        let pick =
            |v: Option<f64>, full: f64, small: f64| v.unwrap_or(if quick { small } else { full });
        let nginx = self
            .nginx_bin
            .clone()
            .filter(|_| !self.no_nginx)
            .or_else(|| {
                if self.no_nginx {
                    return None;
                }
                std::env::var_os("PATH")
                    .and_then(|p| {
                        std::env::split_paths(&p)
                            .map(|d| d.join("nginx"))
                            .find(|p| p.is_file())
                    })
                    .or_else(|| Some(PathBuf::from("/usr/sbin/nginx")).filter(|p| p.is_file()))
            });
        proxy::ProxyParams {
            seconds: pick(self.proxy_seconds, 10.0, 2.0),
            throughput_seconds: pick(self.proxy_throughput_seconds, 10.0, 2.0),
            throughput_connections: self.proxy_connections.max(1),
            soak_seconds: pick(self.proxy_soak_seconds, 300.0, 5.0),
            rounds: self
                .proxy_rounds
                .unwrap_or(if quick { 1 } else { 5 })
                .max(1),
            nginx,
            uploads: proxy_upload::UploadParams {
                uploads: self
                    .proxy_uploads
                    .unwrap_or(if quick { 200 } else { 2000 })
                    .max(1),
                bytes: self.proxy_upload_bytes,
                upload_seconds: pick(self.proxy_upload_seconds, 10.0, 3.0),
                settle_seconds: pick(self.proxy_settle_seconds, 30.0, 5.0),
                rounds: self
                    .proxy_upload_rounds
                    .unwrap_or(if quick { 1 } else { 3 })
                    .max(1),
                budget: self.proxy_body_memory_max,
            },
            uploads_only: self.proxy_uploads_only,
        }
    }
}

#[derive(Args, Clone)]
struct ClusterArgs {
    /// Flood connection counts [10,100,1000; quick: 10,100].
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    cluster_connections: Option<Vec<usize>>,
    /// Flood rounds per connection count, the order of weir, two doors and nats
    /// rotating; medians reported [3; quick: 1].
    #[arg(long, value_name = "N")]
    cluster_rounds: Option<usize>,
    /// Items per flood step, M: weir sets and gets M, nats publishes and fetches M
    /// [10000 and at least 20 per connection; quick: 3000 and at least 20 per connection;
    /// given: exactly this].
    #[arg(long, value_name = "N")]
    cluster_msgs: Option<u64>,
    /// Queues of the weir flood [10].
    #[arg(long, value_name = "N", default_value_t = 10)]
    cluster_queues: usize,
    /// Item size, both sides [64].
    #[arg(long, value_name = "BYTES", default_value_t = 64)]
    cluster_item_bytes: usize,
    /// Failover rounds (weir and raw NATS each) [3; quick: 1].
    #[arg(long, value_name = "N")]
    failover_rounds: Option<usize>,
    /// What the failover measurement does to the stream leader's node, each in its
    /// rounds: kill (SIGKILL), stop (SIGSTOP), cut-peers, cut-all (network namespaces:
    /// root and iproute2) [kill].
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "FAULT,...",
        default_value = "kill"
    )]
    failover_faults: Vec<cluster::Fault>,
    /// Writers of the failover measurement (one write in flight each) [8].
    #[arg(long, value_name = "N", default_value_t = 8)]
    failover_writers: usize,
    /// Seconds of load before the kill [2; quick: 1].
    #[arg(long, value_name = "S")]
    failover_load_seconds: Option<f64>,
    /// Seconds after the kill without an ack before a round counts as no recovery [30].
    #[arg(long, value_name = "S", default_value_t = 30.0)]
    failover_timeout_seconds: f64,
    /// PubAck timeout of the raw NATS publishers, ms [250].
    #[arg(long, value_name = "MS", default_value_t = 250)]
    failover_nats_ack_timeout_ms: u64,
    /// First client port of the cluster: clients BASE..+2, routes BASE+10..+12,
    /// monitoring BASE+20..+22 [25222].
    #[arg(long, value_name = "PORT", default_value_t = 25222)]
    nats_base: u16,
    /// Directory of the cluster (kept afterwards, with the servers' logs) [a temporary one].
    #[arg(long, value_name = "DIR")]
    nats_dir: Option<PathBuf>,
    /// The weir repository, for scripts/nats-cluster and .tools/bin [found from the
    /// current directory or the executable].
    #[arg(long, value_name = "DIR")]
    repo: Option<PathBuf>,
    /// Skip the flood comparison.
    #[arg(long)]
    skip_flood: bool,
    /// Skip the failover measurement.
    #[arg(long)]
    skip_failover: bool,
    /// The spawned doors' backend: jetstream, or embedded (checks the bench alone).
    #[arg(long, value_name = "KIND", default_value = "jetstream", hide = true)]
    cluster_weir_backend: cluster::DoorBackend,
}

impl ClusterArgs {
    fn resolve(&self, quick: bool) -> cluster::ClusterParams {
        let pick = |v: Option<usize>, full: usize, small: usize| {
            v.unwrap_or(if quick { small } else { full }).max(1)
        };
        cluster::ClusterParams {
            connections: self.cluster_connections.clone().unwrap_or_else(|| {
                if quick {
                    vec![10, 100]
                } else {
                    vec![10, 100, 1000]
                }
            }),
            rounds: pick(self.cluster_rounds, 3, 1),
            msgs: self
                .cluster_msgs
                .unwrap_or(if quick { 3_000 } else { 10_000 })
                .max(1),
            msgs_per_conn: if self.cluster_msgs.is_some() { 0 } else { 20 },
            queues: self.cluster_queues,
            item_bytes: self.cluster_item_bytes,
            failover_rounds: pick(self.failover_rounds, 3, 1),
            failover_faults: self.failover_faults.clone(),
            failover_writers: self.failover_writers.max(1),
            failover_load: std::time::Duration::from_secs_f64(
                self.failover_load_seconds
                    .unwrap_or(if quick { 1.0 } else { 2.0 })
                    .max(0.1),
            ),
            failover_timeout: std::time::Duration::from_secs_f64(
                self.failover_timeout_seconds.max(1.0),
            ),
            nats_ack_timeout: std::time::Duration::from_millis(
                self.failover_nats_ack_timeout_ms.max(1),
            ),
            nats_base: self.nats_base,
            nats_dir: self.nats_dir.clone(),
            repo: self.repo.clone(),
            backend: self.cluster_weir_backend,
            skip_flood: self.skip_flood,
            skip_failover: self.skip_failover,
        }
    }
}

#[derive(Args, Clone)]
struct BusArgs {
    /// Events per ingestion round [200000; quick: 20000].
    #[arg(long, value_name = "N")]
    bus_ingest_events: Option<u64>,
    /// Publishing connections of the ingestion rounds [64].
    #[arg(long, value_name = "N", default_value_t = 64)]
    bus_ingest_connections: usize,
    /// Ingestion rounds, bare and weir alternating first [3; quick: 1].
    #[arg(long, value_name = "N")]
    bus_repeat: Option<usize>,
    /// Publishes of the serial sender [5000; quick: 1000].
    #[arg(long, value_name = "N")]
    bus_serial_events: Option<u64>,
    /// Events of the `max` 1 latency step [2000; quick: 300], sent at --bus-one-rate.
    #[arg(long, value_name = "N")]
    bus_one_events: Option<u64>,
    /// Publish rate of the `max` 1 step, events/s [200].
    #[arg(long, value_name = "N", default_value_t = 200.0)]
    bus_one_rate: f64,
    /// Seconds of the `max` 100 / 500 ms step [10; quick: 3].
    #[arg(long, value_name = "S")]
    bus_batch_seconds: Option<f64>,
    /// Total publish rate of its 5 senders, events/s [100].
    #[arg(long, value_name = "N", default_value_t = 100.0)]
    bus_batch_rate: f64,
    /// Events of the at-scale run [240000; quick: 24000].
    #[arg(long, value_name = "N")]
    bus_scale_events: Option<u64>,
    /// Connections of the at-scale run [240].
    #[arg(long, value_name = "N", default_value_t = 240)]
    bus_scale_connections: usize,
    /// Backlog steps of the memory measurement [10000,100000,1000000; quick: 10000,50000].
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    bus_rss_steps: Option<Vec<u64>>,
    /// Run only the metadata-at-scale step (subscriptions x topics at the limits).
    #[arg(long)]
    bus_meta_only: bool,
    /// Skip the metadata-at-scale step.
    #[arg(long)]
    bus_skip_meta: bool,
    /// Subscriptions of the metadata-at-scale step, each on every topic [200; quick: 20].
    #[arg(long, value_name = "N")]
    bus_meta_subscribers: Option<u64>,
    /// Topics of the metadata-at-scale step [1000; quick: 100].
    #[arg(long, value_name = "N")]
    bus_meta_topics: Option<u64>,
    /// Rounds of the metadata-at-scale step (figures are their medians) [5; quick: 1].
    #[arg(long, value_name = "N")]
    bus_meta_rounds: Option<u64>,
    /// Changes of each kind per round [50; quick: 10].
    #[arg(long, value_name = "N")]
    bus_meta_changes: Option<u64>,
    /// Serial publishes per round [1000; quick: 200].
    #[arg(long, value_name = "N")]
    bus_meta_publishes: Option<u64>,
}

impl BusArgs {
    fn resolve(&self, quick: bool) -> bus::BusParams {
        let pick =
            |v: Option<u64>, full: u64, small: u64| v.unwrap_or(if quick { small } else { full });
        bus::BusParams {
            ingest_events: pick(self.bus_ingest_events, 200_000, 20_000),
            ingest_connections: self.bus_ingest_connections.max(1),
            repeat: self.bus_repeat.unwrap_or(if quick { 1 } else { 3 }).max(1),
            serial_events: pick(self.bus_serial_events, 5_000, 1_000),
            one_events: pick(self.bus_one_events, 2_000, 300),
            one_rate: self.bus_one_rate.max(1.0),
            batch_seconds: self
                .bus_batch_seconds
                .unwrap_or(if quick { 3.0 } else { 10.0 }),
            batch_rate: self.bus_batch_rate.max(1.0),
            scale_events: pick(self.bus_scale_events, 240_000, 24_000),
            scale_connections: self.bus_scale_connections.max(1),
            rss_steps: self.bus_rss_steps.clone().unwrap_or_else(|| {
                if quick {
                    vec![10_000, 50_000]
                } else {
                    vec![10_000, 100_000, 1_000_000]
                }
            }),
            meta_only: self.bus_meta_only,
            skip_meta: self.bus_skip_meta,
            meta: bus_scale::ScaleParams {
                subscribers: to_usize(pick(self.bus_meta_subscribers, 200, 20)),
                topics: to_usize(pick(self.bus_meta_topics, 1000, 100)),
                rounds: to_usize(pick(self.bus_meta_rounds, 5, 1)),
                changes: to_usize(pick(self.bus_meta_changes, 50, 10)),
                publishes: pick(self.bus_meta_publishes, 1000, 200),
                idle_seconds: if quick { 2.0 } else { 5.0 },
            },
        }
    }
}

#[derive(Args, Clone)]
struct LibraryArgs {
    /// Directory for the temporary stores: the filesystem under test [system temp dir].
    #[arg(long, value_name = "DIR")]
    lib_dir: Option<PathBuf>,
    /// Record size [512].
    #[arg(long, value_name = "BYTES", default_value_t = 512)]
    lib_record_bytes: usize,
    /// Seconds per timed write case [10; quick: 0.3].
    #[arg(long, value_name = "S")]
    lib_seconds: Option<f64>,
    /// Writer thread counts, buffered and synced [1,2,8].
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "N,N,...",
        default_value = "1,2,8"
    )]
    lib_threads: Vec<usize>,
    /// Threads of the group-commit case (synced) [64].
    #[arg(long, value_name = "N", default_value_t = 64)]
    lib_group_threads: usize,
    /// Durability of the 3 writers + 1 reader case [buffered] (buffered|periodic|synced).
    #[arg(long, value_name = "MODE", default_value = "buffered", value_parser = library::parse_durability)]
    lib_rw_durability: weir::Durability,
    /// Most items the reader of the 3 writers + 1 reader case takes per call (take_batch); 1 = plain take
    #[arg(long, default_value_t = 256)]
    lib_rw_read_batch: usize,
    /// Records of the iteration case [1000000; quick: 50000].
    #[arg(long, value_name = "N")]
    lib_iter_records: Option<u64>,
    /// Payload bytes of the reopen backlog [10000000000; quick: 33554432].
    #[arg(long, value_name = "BYTES")]
    lib_backlog_bytes: Option<u64>,
    /// Item size of the deep queue and the reopen backlog [1024].
    #[arg(long, value_name = "BYTES", default_value_t = 1024)]
    lib_backlog_item_bytes: usize,
    /// Items queued for the deep append+take case [8388608; quick: 32768].
    #[arg(long, value_name = "N")]
    lib_deep_items: Option<u64>,
    /// Append+take pairs per rate measurement [1000000; quick: 10000].
    #[arg(long, value_name = "N")]
    lib_apptake_pairs: Option<u64>,
    /// Upper bound of the 1 MiB-write reference [17179869184].
    #[arg(long, value_name = "BYTES", default_value_t = 16 << 30)]
    lib_seq_bytes_max: u64,
}

impl LibraryArgs {
    fn resolve(&self, quick: bool) -> library::LibraryParams {
        library::LibraryParams {
            dir: self.lib_dir.clone(),
            record_bytes: self.lib_record_bytes,
            seconds: self.lib_seconds.unwrap_or(if quick { 0.3 } else { 10.0 }),
            threads: self.lib_threads.clone(),
            group_threads: self.lib_group_threads,
            rw_durability: self.lib_rw_durability,
            rw_read_batch: self.lib_rw_read_batch.max(1),
            iter_records: self
                .lib_iter_records
                .unwrap_or(if quick { 50_000 } else { 1_000_000 }),
            backlog_bytes: self.lib_backlog_bytes.unwrap_or(if quick {
                32 << 20
            } else {
                10_000_000_000
            }),
            backlog_item_bytes: self.lib_backlog_item_bytes,
            deep_items: self
                .lib_deep_items
                .unwrap_or(if quick { 32_768 } else { 8_388_608 }),
            apptake_pairs: self
                .lib_apptake_pairs
                .unwrap_or(if quick { 10_000 } else { 1_000_000 }),
            seq_bytes_max: self.lib_seq_bytes_max,
        }
    }
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = real_main(cli) {
        target::kill_all_children();
        nats::stop_all_clusters();
        eprintln!("weir-bench: error: {e:#}");
        std::process::exit(1);
    }
}

fn real_main(cli: Cli) -> Result<()> {
    if let Some(done) = internal(&cli.command) {
        return done;
    }
    sys::raise_nofile_limit();
    let runtime = start_runtime()?;
    let progress = Progress::new();
    let mut failures: Vec<String> = Vec::new();
    dispatch(cli.command, &runtime, &progress, &mut failures)?;
    progress.clear();
    if !failures.is_empty() {
        bail!("{}", failures.join("; "));
    }
    Ok(())
}

/// `all`: every suite, with the skips asked for.
fn run_all_command(
    command: Cmd,
    runtime: &tokio::runtime::Runtime,
    progress: &Progress,
    failures: &mut Vec<String>,
) -> Result<()> {
    let Cmd::All {
        common,
        flood,
        packing,
        pu,
        rss,
        lib,
        queues,
        skip_library,
        skip_queues,
        skip_packing_unpacking,
        skip_beanstalk,
    } = command
    else {
        return Ok(());
    };
    let q = common.quick;
    let all = AllParams {
        flood: flood.resolve(q),
        packing: packing.resolve(q),
        pu: (!skip_packing_unpacking).then(|| pu.resolve(q)),
        rss: rss.resolve(q),
        lib: (!skip_library).then(|| lib.resolve(q)),
        queues: (!skip_queues).then(|| queues.resolve(q)),
        beanstalk: (!skip_beanstalk).then(|| BeanstalkArgs::seeds().resolve(q)),
    };
    run_all(runtime, &common, &all, progress, failures)
}

/// Runs the suite a command names.
fn dispatch(
    command: Cmd,
    runtime: &tokio::runtime::Runtime,
    progress: &Progress,
    failures: &mut Vec<String>,
) -> Result<()> {
    match command {
        Cmd::Flood { common, flood } => {
            let p = flood.resolve(common.quick);
            run_flood(runtime, &common, &p, progress, failures)?;
        }
        Cmd::Packing { common, packing } => {
            let p = packing.resolve(common.quick);
            run_packing(runtime, &common, &p, progress, failures)?;
        }
        Cmd::PackingUnpacking { common, pu } => {
            let p = pu.resolve(common.quick);
            run_packing(runtime, &common, &p, progress, failures)?;
        }
        Cmd::MemRss { common, rss } => {
            let p = rss.resolve(common.quick);
            run_mem_rss(runtime, &common, &p, progress, failures)?;
        }
        Cmd::Library { common, lib } => {
            let p = lib.resolve(common.quick);
            run_library(&common, &p, progress, failures)?;
        }
        Cmd::Beanstalk { common, bs } => {
            let p = bs.resolve(common.quick);
            let servers = beanstalk_servers(&common)?;
            run_beanstalk(
                runtime,
                &common.as_common(),
                &servers,
                &p,
                progress,
                failures,
            )?;
        }
        Cmd::Queues { common, queues } => {
            let p = queues.resolve(common.quick);
            run_queues(runtime, &common, &p, progress)?;
        }
        all @ Cmd::All { .. } => run_all_command(all, runtime, progress, failures)?,
        Cmd::Bus { common, bus } => run_bus(
            runtime,
            &common,
            &bus.resolve(common.quick),
            progress,
            failures,
        )?,
        Cmd::Cluster { common, cluster } => run_cluster(
            runtime,
            &common,
            &cluster.resolve(common.quick),
            progress,
            failures,
        )?,
        Cmd::Proxy { common, proxy } => run_proxy(
            runtime,
            &common,
            &proxy.resolve(common.quick),
            progress,
            failures,
        )?,
        _ => unreachable!("internal commands are handled above"),
    }
    Ok(())
}

/// The hidden subcommands: helper processes of the suites.
fn internal(command: &Cmd) -> Option<Result<()>> {
    match command {
        Cmd::ProbeOpen { dir } => Some(library::probe_open_main(dir)),
        Cmd::BareHttp { addr } => Some(bus_http::bare_server_main(addr)),
        Cmd::HelloHttp { addr } => Some(proxy_http::hello_main(addr)),
        Cmd::SilentHttp { addr } => Some(proxy_http::silent_main(addr)),
        Cmd::DrainHttp { addr } => Some(proxy_http::drain_main(addr)),
        _ => None,
    }
}

/// The two progress bars on stderr: benchmark steps, and the fill/drain in between.
struct Progress {
    _multi: MultiProgress,
    steps: ProgressBar,
    fill: ProgressBar,
}

impl Progress {
    fn new() -> Progress {
        let multi = MultiProgress::new();
        let style = |t: &str| {
            ProgressStyle::with_template(t).unwrap_or_else(|_| ProgressStyle::default_bar())
        };
        let steps = multi.add(ProgressBar::new(0));
        steps.set_style(style(
            "{elapsed_precise} [{bar:30}] {pos}/{len} steps  {msg}",
        ));
        let fill = multi.add(ProgressBar::new(0));
        fill.set_style(style(
            "{elapsed_precise} [{bar:30}] {human_pos}/{human_len} {msg} ({per_sec}, eta {eta})",
        ));
        Progress {
            _multi: multi,
            steps,
            fill,
        }
    }

    fn clear(&self) {
        self.steps.finish_and_clear();
        self.fill.finish_and_clear();
    }
}

/// Every benchmark's parameters for `all`; `None` for one skipped.
struct AllParams {
    flood: flood::FloodParams,
    packing: packing::PackingParams,
    pu: Option<packing::PackingParams>,
    rss: mem_rss::MemRssParams,
    lib: Option<library::LibraryParams>,
    queues: Option<queues::QueuesParams>,
    beanstalk: Option<beanstalk::BeanstalkParams>,
}

/// `all`: every benchmark in turn.
fn run_all(
    runtime: &tokio::runtime::Runtime,
    common: &Common,
    all: &AllParams,
    progress: &Progress,
    failures: &mut Vec<String>,
) -> Result<()> {
    run_flood(runtime, common, &all.flood, progress, failures)?;
    run_packing(runtime, common, &all.packing, progress, failures)?;
    if let Some(pu) = &all.pu {
        run_packing(runtime, common, pu, progress, failures)?;
    }
    run_mem_rss(runtime, common, &all.rss, progress, failures)?;
    if let Some(lib) = &all.lib {
        run_library(common, lib, progress, failures)?;
    }
    if let Some(queues) = &all.queues {
        run_queues(runtime, common, queues, progress)?;
    }
    if let Some(p) = &all.beanstalk {
        // Its servers are beanstalkd's three modes, spawned when installed, and weir's
        // door in two when weir is spawned too; without beanstalkd the step says so
        // and is skipped.
        match beanstalk_server::find_beanstalkd(None) {
            Ok(bin) => {
                let mut kinds = beanstalk_server::BEANSTALKD_KINDS.to_vec();
                let mut weir_bin = None;
                if common.spawn.contains(&Kind::Weir) {
                    weir_bin = Some(find_weir(common.weir_bin.as_deref())?);
                    kinds = beanstalk_server::ALL_KINDS.to_vec();
                }
                let servers = beanstalk::Servers {
                    bin: Some(bin),
                    weir_bin,
                    kinds,
                    work_dir: common.work_dir.clone(),
                    external: Vec::new(),
                };
                run_beanstalk(runtime, common, &servers, p, progress, failures)?;
            }
            Err(e) => println!("== beanstalk: skipped: {e:#} ==\n"),
        }
    }
    Ok(())
}

/// The multi-threaded runtime the network benchmarks run on; Ctrl-C stops the servers
/// it spawned before exiting.
fn start_runtime() -> Result<tokio::runtime::Runtime> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.spawn(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("weir-bench: interrupted; stopping spawned servers");
            target::kill_all_children();
            nats::stop_all_clusters();
            std::process::exit(130);
        }
    });
    Ok(runtime)
}

impl BeanstalkArgs {
    /// The flags' defaults (for `all`, which does not take them).
    fn seeds() -> BeanstalkArgs {
        BeanstalkArgs {
            connections: None,
            jobs: None,
            seconds: None,
            size: 100,
            rounds: None,
            backlog: None,
            delay: 3600,
            skip_restart: false,
        }
    }
}

impl BsCommon {
    /// The output options in the shape the report writers take.
    fn as_common(&self) -> Common {
        Common {
            targets: Vec::new(),
            pids: Vec::new(),
            data_dirs: Vec::new(),
            spawn: Vec::new(),
            weir_bin: None,
            memcached_bin: None,
            weir_args: Vec::new(),
            work_dir: self.work_dir.clone(),
            out: self.out.clone(),
            quick: self.quick,
            font: self.font.clone(),
        }
    }
}

/// The servers of `beanstalk`: the kinds to spawn (beanstalkd's three modes and
/// weir's two when neither --spawn nor --target is given; beanstalkd's alone, with a
/// note, when there is no weir binary) and the given ones.
fn beanstalk_servers(common: &BsCommon) -> Result<beanstalk::Servers> {
    let mut weir_bin = None;
    let kinds = if common.spawn.is_empty() && common.targets.is_empty() {
        match find_weir(common.weir_bin.as_deref()) {
            Ok(bin) => {
                weir_bin = Some(bin);
                beanstalk_server::ALL_KINDS.to_vec()
            }
            Err(e) => {
                println!("note: beanstalkd only: {e:#}");
                beanstalk_server::BEANSTALKD_KINDS.to_vec()
            }
        }
    } else {
        common.spawn.clone()
    };
    if weir_bin.is_none() && kinds.iter().any(|k| k.is_weir()) {
        weir_bin = Some(find_weir(common.weir_bin.as_deref())?);
    }
    let bin = if kinds.iter().all(|k| k.is_weir()) {
        None
    } else {
        Some(beanstalk_server::find_beanstalkd(
            common.beanstalkd_bin.as_deref(),
        )?)
    };
    let mut external = Vec::new();
    for t in &common.targets {
        let (name, addr) = parse_named(t).map_err(anyhow::Error::msg)?;
        let mut pid = None;
        for item in &common.pids {
            let (n, v) = parse_named(item).map_err(anyhow::Error::msg)?;
            if n == name {
                let p = v
                    .parse::<u32>()
                    .with_context(|| format!("--pid {name}={v}: not a pid"))?;
                if !sys::process_exists(p) {
                    bail!("--pid {name}={p}: no such process");
                }
                pid = Some(p);
            }
        }
        external.push((name, resolve(&addr)?, pid));
    }
    let mut names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
    names.extend(external.iter().map(|(n, _, _)| n.as_str()));
    let count = names.len();
    names.sort_unstable();
    names.dedup();
    if names.len() != count {
        bail!("two beanstalk targets share a name; spawn each kind once and give each --target a distinct NAME");
    }
    Ok(beanstalk::Servers {
        bin,
        weir_bin,
        kinds,
        work_dir: common.work_dir.clone(),
        external,
    })
}

fn run_beanstalk(
    runtime: &tokio::runtime::Runtime,
    common: &Common,
    servers: &beanstalk::Servers,
    p: &beanstalk::BeanstalkParams,
    progress: &Progress,
    failures: &mut Vec<String>,
) -> Result<()> {
    let reports = beanstalk::run(runtime, servers, p, &progress.steps, &progress.fill)?;
    let charts = [
        ChartSpec {
            file: "beanstalk",
            title: "beanstalk: put + reserve + delete, 100 B jobs (median of rounds)",
            x_label: "connections",
            y_label: "jobs per second",
            x_key: "connections",
            y_key: "ops/s",
            y_div: 1.0,
            series_key: "target",
            log_y: true,
        },
        ChartSpec {
            file: "beanstalk-rss",
            title: "beanstalk: server RSS with a backlog of jobs",
            x_label: "jobs queued",
            y_label: "RSS (MiB)",
            x_key: "state",
            y_key: "rss_bytes",
            y_div: 1024.0 * 1024.0,
            series_key: "target",
            log_y: false,
        },
    ];
    // Without a pid (a --target without --pid) there is no RSS to chart.
    let has_rss = |r: &Report| {
        r.rows
            .iter()
            .any(|row| row.get("rss_bytes").and_then(|c| c.as_f64()).is_some())
    };
    let charts: Vec<ChartSpec> = charts
        .into_iter()
        .filter(|c| c.file != "beanstalk-rss" || reports.iter().any(has_rss))
        .collect();
    emit_all(common, &reports, &charts, failures)
}

fn run_flood(
    runtime: &tokio::runtime::Runtime,
    common: &Common,
    p: &flood::FloodParams,
    progress: &Progress,
    failures: &mut Vec<String>,
) -> Result<()> {
    let targets = make_targets(common)?;
    let report = runtime.block_on(flood::run(&targets, p, &progress.steps))?;
    emit(common, &report, &[flood_chart()], failures)
}

fn run_packing(
    runtime: &tokio::runtime::Runtime,
    common: &Common,
    p: &packing::PackingParams,
    progress: &Progress,
    failures: &mut Vec<String>,
) -> Result<()> {
    let targets = make_targets(common)?;
    progress.steps.reset();
    let report = runtime.block_on(packing::run(&targets, p, &progress.steps, &progress.fill))?;
    let spec = ChartSpec {
        file: p.bench,
        title: if p.bench == "packing" {
            "packing: set+get rate vs backlog (1 KiB items, 1 connection)"
        } else {
            "packing/unpacking: set+get rate as the queue grows and drains (64 B items)"
        },
        x_label: "items queued (step)",
        y_label: "operations per second",
        x_key: "backlog",
        y_key: "ops/s",
        y_div: 1.0,
        series_key: "target",
        log_y: false,
    };
    emit(common, &report, &[spec], failures)
}

fn run_mem_rss(
    runtime: &tokio::runtime::Runtime,
    common: &Common,
    p: &mem_rss::MemRssParams,
    progress: &Progress,
    failures: &mut Vec<String>,
) -> Result<()> {
    let targets = make_targets(common)?;
    progress.steps.reset();
    let report = runtime.block_on(mem_rss::run(&targets, p, &progress.steps, &progress.fill))?;
    let spec = ChartSpec {
        file: "mem-rss",
        title: "resident memory after set N + get N (1 KiB items)",
        x_label: "N items",
        y_label: "RSS (MiB)",
        x_key: "step",
        y_key: "rss_bytes",
        y_div: 1024.0 * 1024.0,
        series_key: "target",
        log_y: false,
    };
    emit(common, &report, &[spec], failures)
}

/// The many-queues step; spawned weir servers are allowed the queues it makes.
fn run_queues(
    runtime: &tokio::runtime::Runtime,
    common: &Common,
    p: &queues::QueuesParams,
    progress: &Progress,
) -> Result<()> {
    let config = tempfile::Builder::new()
        .prefix("weir-bench-queues-")
        .suffix(".toml")
        .tempfile()
        .context("writing a config for the spawned weir")?;
    std::fs::write(
        config.path(),
        format!("[server]\nqueues_max = {}\n", p.queues + 100),
    )
    .context("writing a config for the spawned weir")?;
    let mut common = common.clone();
    common.weir_args.push("--config".into());
    common.weir_args.push(config.path().display().to_string());
    let targets = make_targets(&common)?;
    progress.steps.reset();
    let report = runtime.block_on(queues::run(&targets, p, &progress.steps, &progress.fill))?;
    print_and_write(&common, &report)
}

fn run_library(
    common: &Common,
    p: &library::LibraryParams,
    progress: &Progress,
    failures: &mut Vec<String>,
) -> Result<()> {
    progress.steps.reset();
    let report = library::run(p, &progress.steps, &progress.fill)?;
    // The chart reads only the append rows; the files keep everything.
    let chart_report = library::chart_rows(&report);
    let spec = ChartSpec {
        file: "library",
        title: "engine append throughput (512 B records)",
        x_label: "writer threads",
        y_label: "appends per second (log)",
        x_key: "threads",
        y_key: "rate",
        y_div: 1.0,
        series_key: "durability",
        log_y: true,
    };
    print_and_write(common, &report)?;
    draw(common, &chart_report, &[spec], failures);
    Ok(())
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

fn run_bus(
    runtime: &tokio::runtime::Runtime,
    common: &Common,
    p: &bus::BusParams,
    progress: &Progress,
    failures: &mut Vec<String>,
) -> Result<()> {
    progress.steps.reset();
    let reports = runtime.block_on(bus::run(p, &binaries(common), &progress.steps))?;
    let charts = [
        ChartSpec {
            file: "bus-latency",
            title: "bus: delivery latency, publish to receipt",
            x_label: "scenario",
            y_label: "milliseconds (log)",
            x_key: "scenario",
            y_key: "ms",
            y_div: 1.0,
            series_key: "percentile",
            log_y: true,
        },
        ChartSpec {
            file: "bus-rss",
            title: "bus: weir's RSS with events queued for a receiver that is down",
            x_label: "events queued",
            y_label: "RSS (MiB)",
            x_key: "queued",
            y_key: "rss_bytes",
            y_div: 1024.0 * 1024.0,
            series_key: "target",
            log_y: false,
        },
    ];
    emit_all(common, &reports, &charts, failures)
}

fn run_proxy(
    runtime: &tokio::runtime::Runtime,
    common: &Common,
    p: &proxy::ProxyParams,
    progress: &Progress,
    failures: &mut Vec<String>,
) -> Result<()> {
    progress.steps.reset();
    let reports = runtime.block_on(proxy::run(p, &binaries(common), &progress.steps))?;
    let charts = [
        ChartSpec {
            file: "proxy-latency",
            title: "proxy: p99 latency, open loop (rocky's suites)",
            x_label: "suite",
            y_label: "p99 milliseconds (log)",
            x_key: "suite",
            y_key: "p99_ms",
            y_div: 1.0,
            series_key: "target",
            log_y: true,
        },
        ChartSpec {
            file: "proxy-rss",
            title: "proxy: weir's RSS at 100 req/s, shadows never answering",
            x_label: "seconds",
            y_label: "RSS (MiB)",
            x_key: "second",
            y_key: "rss_bytes",
            y_div: 1024.0 * 1024.0,
            series_key: "target",
            log_y: false,
        },
    ];
    emit_all(common, &reports, &charts, failures)
}

fn run_cluster(
    runtime: &tokio::runtime::Runtime,
    common: &Common,
    p: &cluster::ClusterParams,
    progress: &Progress,
    failures: &mut Vec<String>,
) -> Result<()> {
    if !common.targets.is_empty() || !common.spawn.is_empty() {
        bail!("cluster starts its own servers: --target and --spawn do not apply");
    }
    progress.steps.reset();
    let out = runtime.block_on(cluster::run(p, &binaries(common), &progress.steps))?;
    for report in &out.reports {
        print_and_write(common, report)?;
    }
    for (report, spec) in &out.charts {
        draw(common, report, std::slice::from_ref(spec), failures);
    }
    let md = common.out.join("cluster.md");
    std::fs::write(&md, &out.markdown).with_context(|| format!("writing {}", md.display()))?;
    failures.extend(out.failures);
    Ok(())
}

/// Emits each report with the charts named after it (a chart's file is its
/// report's bench).
fn emit_all(
    common: &Common,
    reports: &[Report],
    charts: &[ChartSpec],
    failures: &mut Vec<String>,
) -> Result<()> {
    for report in reports {
        let mine: Vec<ChartSpec> = charts
            .iter()
            .filter(|c| c.file == report.bench)
            .copied()
            .collect();
        emit(common, report, &mine, failures)?;
    }
    Ok(())
}

fn flood_chart() -> ChartSpec<'static> {
    ChartSpec {
        file: "flood",
        title: "flood: set+get, 64 B items over 10 queues",
        x_label: "connections",
        y_label: "operations per second",
        x_key: "connections",
        y_key: "ops/s",
        y_div: 1.0,
        series_key: "target",
        log_y: false,
    }
}

/// Prints the table, writes JSON and CSV, then the charts (whose failure does not
/// lose the numbers: it is reported at the end and makes the exit status non-zero).
fn emit(
    common: &Common,
    report: &Report,
    charts: &[ChartSpec],
    failures: &mut Vec<String>,
) -> Result<()> {
    print_and_write(common, report)?;
    draw(common, report, charts, failures);
    Ok(())
}

fn print_and_write(common: &Common, report: &Report) -> Result<()> {
    println!("{}", report.table());
    report.write_files(&common.out)
}

fn draw(common: &Common, report: &Report, charts: &[ChartSpec], failures: &mut Vec<String>) {
    for spec in charts {
        if let Err(e) = chart::draw(report, spec, &common.out, common.font.as_deref()) {
            eprintln!("weir-bench: chart {}: {e:#}", spec.file);
            failures.push(format!("chart {}: {e:#}", spec.file));
        }
    }
}

fn binaries(common: &Common) -> Binaries {
    Binaries {
        weir: common.weir_bin.clone(),
        memcached: common.memcached_bin.clone(),
        weir_args: common.weir_args.clone(),
        work_dir: common.work_dir.clone(),
    }
}

/// Spawned servers first (fresh each call), then the given ones.
fn make_targets(common: &Common) -> Result<Vec<Target>> {
    let bins = binaries(common);
    let mut targets = Vec::new();
    for kind in &common.spawn {
        targets.push(Target::spawn(*kind, &bins)?);
    }
    let lookup = |list: &[String], name: &str| -> Result<Option<String>> {
        for item in list {
            let (n, v) = parse_named(item).map_err(anyhow::Error::msg)?;
            if n == name {
                return Ok(Some(v));
            }
        }
        Ok(None)
    };
    for t in &common.targets {
        let (name, addr) = parse_named(t).map_err(anyhow::Error::msg)?;
        let addr = resolve(&addr)?;
        let pid = match lookup(&common.pids, &name)? {
            Some(p) => Some(
                p.parse::<u32>()
                    .with_context(|| format!("--pid {name}={p}: not a pid"))?,
            ),
            None => None,
        };
        if let Some(pid) = pid {
            if !sys::process_exists(pid) {
                bail!("--pid {name}={pid}: no such process");
            }
        }
        let dir = lookup(&common.data_dirs, &name)?.map(PathBuf::from);
        targets.push(Target::external(&name, addr, pid, dir));
    }
    let mut names: Vec<&str> = targets.iter().map(|t| t.name.as_str()).collect();
    names.sort();
    names.dedup();
    if names.len() != targets.len() {
        bail!("two targets share a name; give each --target a distinct NAME");
    }
    if targets.is_empty() {
        bail!("no target: give --target NAME=HOST:PORT or --spawn weir|memcached");
    }
    Ok(targets)
}

fn resolve(addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .with_context(|| format!("resolving {addr}"))?
        .next()
        .with_context(|| format!("{addr} resolves to no address"))
}
