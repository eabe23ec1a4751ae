//! `weir`: the queue server's command line.
//!
//! Parses flags, reads the config file, sets up logging and the file-descriptor limit,
//! builds the tokio runtime and runs [`weir_server::root::run`] until shutdown.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use weir_proxy::tools::capture_cli::{self, CaptureCommand};
use weir_proxy::tools::diff_cli::{self, DiffCommand};
use weir_proxy::tools::replay_cli::{self, ReplayArgs};
use weir_server::config::{self, FileConfig, Overrides};

#[cfg(all(feature = "jemalloc", not(feature = "mimalloc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read at its start (`MALLOC_CONF`'s syntax; the environment's
/// `_RJEM_MALLOC_CONF` comes after and wins): a background thread gives freed pages
/// back to the system within about a second (dirty, then muzzy, decay), so that the
/// memory of a burst (concurrent uploads through the proxy) does not stay resident.
#[cfg(all(feature = "jemalloc", not(feature = "mimalloc")))]
#[export_name = "_rjem_malloc_conf"]
pub static JEMALLOC_CONF: &[u8; 60] =
    b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "weir",
    version,
    about = "weir: a durable message queue that speaks memcache (Kestrel's dialect)",
    long_about = "weir: a durable message queue. `weir serve` runs the queue server: the \
memcache text protocol in Kestrel's dialect (docs/protocol.md) on its embedded storage, \
and /health and /metrics over HTTP. Settings come from a TOML file (--config, see \
docs/configuration.md); flags override it."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the queue server until SIGTERM, SIGINT or an enabled `shutdown` command.
    Serve(ServeArgs),
    /// Run only the HTTP proxy of the config file's `[proxy]` section (docs/proxy.md):
    /// no memcache port, no bus, no HTTP port unless --http-listen; until SIGTERM or
    /// SIGINT.
    Proxy(ProxyArgs),
    /// Move a proxy route's captures to and from a JSON-lines file (docs/proxy.md).
    Capture {
        #[command(subcommand)]
        command: CaptureCommand,
    },
    /// Send captured requests, from a capture queue or a file, to any URL at a chosen
    /// pace (docs/proxy.md).
    Replay(ReplayArgs),
    /// What the proxy's diffing shadows found, from a running weir (docs/proxy.md).
    Diff {
        #[command(subcommand)]
        command: DiffCommand,
    },
}

#[derive(clap::Args)]
struct ProxyArgs {
    /// TOML config file with a `[proxy]` section (queue settings apply to its capture
    /// queues).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Data directory for the capture queues [default: the file's, else ./data]
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Log level or tracing filter [default: info]
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<String>,
    /// Serve /health, /metrics and the capture endpoints on this address too
    /// [default: no HTTP port]
    #[arg(long, value_name = "ADDR")]
    http_listen: Option<String>,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// TOML config file: store-wide queue defaults, per-queue settings by name
    /// pattern, server limits (docs/configuration.md). `reload` re-reads it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Data directory; created if missing, locked while the server runs
    /// [default: ./data]
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Address of the memcache port [default: 127.0.0.1:22133]
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Address of the HTTP port (/health, /metrics); port 0 picks a free one
    /// [default: 127.0.0.1:22134]
    #[arg(long, value_name = "ADDR")]
    http_listen: Option<String>,
    /// Log level or tracing filter: error, warn, info, debug, trace, or e.g.
    /// "weir_memcache=debug" [default: info]
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<String>,
    /// Event-loop threads serving connections [default: the CPU count, shared with
    /// the bus and the proxy when they are on]
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Most memcache connections open at once [default: 16384]
    #[arg(long, value_name = "N", alias = "max-connections")]
    connections_max: Option<usize>,
    /// Runs the event bus (routemaster's HTTP API, docs/bus.md) on this address;
    /// a `[bus]` section in the config file also enables it [default when enabled:
    /// 127.0.0.1:22135]. Its root key comes from WEIR_BUS_ROOT_KEY, else the file.
    #[arg(long, value_name = "ADDR")]
    bus_listen: Option<String>,
    /// Runs the beanstalkd door (beanstalkd 1.12's protocol, docs/beanstalk.md) on
    /// this address; a `[beanstalk]` section in the config file also enables it
    /// [default when enabled: 127.0.0.1:11300]. Embedded backend only.
    #[arg(long, value_name = "ADDR")]
    beanstalk_listen: Option<String>,
    /// Where the queues live: embedded (this process's data directory) or jetstream
    /// (a NATS JetStream cluster, docs/cluster.md) [default: the file's, else embedded]
    #[arg(long, value_name = "KIND", env = "WEIR_BACKEND")]
    backend: Option<String>,
    /// JetStream servers, comma-separated nats:// URLs [default: the file's]
    #[arg(long, value_name = "URLS", env = "WEIR_NATS_SERVERS")]
    nats_servers: Option<String>,
    /// JetStream stream NAME, with subjects NAME.q.QUEUE [default: the file's, else WEIR]
    #[arg(long, value_name = "NAME", env = "WEIR_NATS_STREAM")]
    nats_stream: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Proxy(args) => proxy_only(args),
        Command::Capture {
            command: CaptureCommand::Export(args),
        } => capture_cli::export(&args),
        Command::Capture {
            command: CaptureCommand::Import(args),
        } => capture_cli::import(&args),
        Command::Replay(args) => replay_cli::run(&args),
        Command::Diff {
            command: DiffCommand::Report(args),
        } => diff_cli::report(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weir: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let file = match &args.config {
        Some(path) => config::read_file(path)?,
        None => FileConfig::default(),
    };
    let overrides = Overrides {
        listen: args.listen,
        http_listen: args.http_listen,
        data_dir: args.data_dir,
        log_level: args.log_level,
        threads: args.threads,
        connections_max: args.connections_max,
        bus_listen: args.bus_listen,
        beanstalk_listen: args.beanstalk_listen,
        backend: args.backend,
        nats_servers: args.nats_servers,
        nats_stream: args.nats_stream,
    };
    let settings = config::resolve(&file, &overrides)?;
    init_logging(&settings.log_level)?;
    file.warn_old_names();
    raise_open_files_limit();
    // The accept loop, HTTP and the first event loop; the memcache door starts the
    // others.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let config_path = args.config.map(|p| std::path::absolute(&p).unwrap_or(p));
    let result = runtime.block_on(weir_server::root::run(
        settings,
        weir_server::root::Plan::Serve,
        config_path,
    ));
    // Tasks still running (a client stuck in a write) must not hold up the exit.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

fn init_logging(level: &str) -> anyhow::Result<()> {
    // The NATS client logs each event at info, every reconnection attempt included;
    // weir logs what matters of them itself (a streak of failures once, with the
    // servers). A level that names async_nats keeps its own say.
    let level = match level.contains("async_nats") {
        true => level.to_owned(),
        false => format!("{level},async_nats=warn"),
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&level)
        .with_context(|| format!("bad log level {level:?}"))?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    Ok(())
}

/// `weir proxy`: the proxy alone, on the data directory (or the JetStream cluster the
/// config's `[backend]` names), until SIGTERM or SIGINT; then it stops (requests in
/// flight finish, replays in flight come again later) and the backend closes. With
/// `--http-listen`, the HTTP port runs too.
fn proxy_only(args: ProxyArgs) -> anyhow::Result<()> {
    let file = config::read_file(&args.config)?;
    let overrides = Overrides {
        data_dir: args.data_dir,
        log_level: args.log_level,
        http_listen: args.http_listen.clone(),
        ..Overrides::default()
    };
    let settings = config::resolve(&file, &overrides)?;
    let mut proxy = settings
        .proxy
        .clone()
        .with_context(|| format!("{} has no [proxy] section", args.config.display()))?;
    if file.proxy.as_ref().and_then(|p| p.threads).is_none() {
        // The proxy alone gets every core (`weir serve` shares them among its doors).
        proxy.threads = config::cpus();
    }
    let mut settings = settings;
    settings.proxy = Some(proxy);
    init_logging(&settings.log_level)?;
    file.warn_old_names();
    raise_open_files_limit();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let plan = weir_server::root::Plan::ProxyOnly {
        http: args.http_listen.is_some(),
    };
    let result = runtime.block_on(weir_server::root::run(settings, plan, None));
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

/// Raises the soft limit on open files to the hard limit: 8000 clients need 8000
/// descriptors, and the usual soft default is 1024.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            tracing::warn!("getrlimit(RLIMIT_NOFILE) failed");
            return;
        }
        if limit.rlim_cur >= limit.rlim_max {
            return;
        }
        let wanted = limit.rlim_max;
        limit.rlim_cur = wanted;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
            tracing::warn!("setrlimit(RLIMIT_NOFILE) failed");
            return;
        }
        tracing::debug!(open_files_max = wanted, "raised the open-files limit");
    }
}
