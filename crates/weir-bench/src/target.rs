//! The servers under test: given ones (`--target NAME=HOST:PORT`, `--pid NAME=PID`) and
//! spawned ones (`--spawn weir`, `--spawn memcached`).
//!
//! A spawned server gets free loopback ports and a fresh temporary data directory, and
//! is stopped when its handle drops. A Ctrl-C handler kills every spawned child too, so
//! an interrupted run leaves no server behind holding ports or disk.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::sys;

/// How long a spawned server may take to accept connections.
const SPAWN_READY_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a spawned server may take to exit after SIGTERM before it gets SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Spawned children still running, for the Ctrl-C handler: (pid, data dir).
static CHILDREN: Mutex<Vec<(u32, Option<PathBuf>)>> = Mutex::new(Vec::new());

/// Kills every spawned child and removes its data dir; for Ctrl-C.
pub fn kill_all_children() {
    let children = match CHILDREN.lock() {
        Ok(mut c) => std::mem::take(&mut *c),
        Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
    };
    for (pid, dir) in children {
        let _ = sys::signal(pid, libc::SIGKILL);
        if let Some(dir) = dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Records a child spawned elsewhere (the beanstalk suite's servers) so that Ctrl-C
/// and a failed run kill it and remove `dir`.
pub fn register_child(pid: u32, dir: Option<PathBuf>) {
    if let Ok(mut c) = CHILDREN.lock() {
        c.push((pid, dir));
    }
}

/// Forgets a child recorded by [`register_child`] (it was stopped).
pub fn unregister_child(pid: u32) {
    if let Ok(mut c) = CHILDREN.lock() {
        c.retain(|(p, _)| *p != pid);
    }
}

/// A server that can be spawned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Weir,
    Memcached,
}

impl std::str::FromStr for Kind {
    type Err = String;
    fn from_str(s: &str) -> Result<Kind, String> {
        match s {
            "weir" => Ok(Kind::Weir),
            "memcached" => Ok(Kind::Memcached),
            other => Err(format!("cannot spawn {other:?}: known are weir, memcached")),
        }
    }
}

/// Where the server binaries are.
#[derive(Clone, Debug, Default)]
pub struct Binaries {
    pub weir: Option<PathBuf>,
    pub memcached: Option<PathBuf>,
    /// Extra arguments for `weir serve`.
    pub weir_args: Vec<String>,
    /// Parent of the temporary data directories.
    pub work_dir: Option<PathBuf>,
}

/// One server under test.
pub struct Target {
    pub name: String,
    pub addr: SocketAddr,
    /// Whose VmRSS the memory benchmark reads.
    pub pid: Option<u32>,
    /// Whose disk use the packing benchmarks report.
    pub data_dir: Option<PathBuf>,
    _spawned: Option<Spawned>,
}

impl Target {
    /// A server somebody else runs.
    pub fn external(
        name: &str,
        addr: SocketAddr,
        pid: Option<u32>,
        data_dir: Option<PathBuf>,
    ) -> Target {
        Target {
            name: name.to_string(),
            addr,
            pid,
            data_dir,
            _spawned: None,
        }
    }

    /// Starts a fresh server of `kind` on free loopback ports and waits until it
    /// accepts connections.
    pub fn spawn(kind: Kind, bins: &Binaries) -> Result<Target> {
        let port = free_port()?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let prefix = match kind {
            Kind::Weir => "weir-bench-weir-",
            Kind::Memcached => "weir-bench-memcached-",
        };
        let mut builder = tempfile::Builder::new();
        builder.prefix(prefix);
        let dir = match &bins.work_dir {
            Some(parent) => builder.tempdir_in(parent),
            None => builder.tempdir(),
        }
        .context("creating a temporary data directory")?;
        let log_path = dir.path().join("server.log");
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let log_err = log.try_clone().context("duplicating the log file")?;
        let (name, mut cmd, data_dir) = server_command(kind, bins, addr, dir.path())?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name} ({cmd:?})"))?;
        let pid = child.id();
        if let Ok(mut c) = CHILDREN.lock() {
            c.push((pid, Some(dir.path().to_path_buf())));
        }
        let mut spawned = Spawned {
            child,
            _dir: dir,
            log_path,
        };
        spawned.wait_ready(name, addr)?;
        Ok(Target {
            name: name.to_string(),
            addr,
            pid: Some(pid),
            data_dir,
            _spawned: Some(spawned),
        })
    }

    /// Disk use of the data directory, when known.
    pub fn disk_bytes(&self) -> Option<u64> {
        self.data_dir
            .as_deref()
            .and_then(|d| sys::disk_usage_bytes(d).ok())
    }

    /// Resident memory of the server, when its pid is known.
    pub fn rss_bytes(&self) -> Option<u64> {
        self.pid.and_then(|p| sys::vm_rss_bytes(p).ok())
    }
}

/// A child server process, stopped on drop.
struct Spawned {
    child: Child,
    _dir: tempfile::TempDir,
    log_path: PathBuf,
}

impl Spawned {
    fn wait_ready(&mut self, name: &str, addr: SocketAddr) -> Result<()> {
        let deadline = Instant::now() + SPAWN_READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().context("waiting for the server")? {
                bail!(
                    "{name} exited at start ({status}); its output:\n{}",
                    self.log_tail()
                );
            }
            if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{name} did not accept connections on {addr} within {SPAWN_READY_TIMEOUT:?}; its output:\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let pid = self.child.id();
        if let Ok(mut c) = CHILDREN.lock() {
            c.retain(|(p, _)| *p != pid);
        }
        if let Ok(None) = self.child.try_wait() {
            // A graceful stop first: weir flushes and exits on SIGTERM.
            let _ = sys::signal(pid, libc::SIGTERM);
            let deadline = Instant::now() + STOP_TIMEOUT;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr().context("finding a free port")?.port())
}

pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// The `weir` binary: `--weir-bin`, else beside this executable (cargo puts both in
/// one target directory), else on PATH.
pub fn find_weir(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        if p.is_file() {
            return Ok(p.to_path_buf());
        }
        bail!("--weir-bin {}: no such file", p.display());
    }
    if let Some(p) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("weir")))
        .filter(|p| p.is_file())
    {
        return Ok(p);
    }
    find_on_path("weir").context(
        "the weir binary was not found beside weir-bench nor on PATH: build it (cargo build --release -p weir-server) or pass --weir-bin",
    )
}

/// Parses `NAME=VALUE`.
pub fn parse_named(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((n, v)) if !n.is_empty() && !v.is_empty() => Ok((n.to_string(), v.to_string())),
        _ => Err(format!("expected NAME=VALUE, got {s:?}")),
    }
}

/// The command that starts a server of `kind` on `addr`, its name, and (weir) its data
/// directory under `dir`.
fn server_command(
    kind: Kind,
    bins: &Binaries,
    addr: SocketAddr,
    dir: &std::path::Path,
) -> Result<(&'static str, Command, Option<PathBuf>)> {
    let port = addr.port();
    match kind {
        Kind::Weir => {
            let bin = find_weir(bins.weir.as_deref())?;
            let data = dir.join("data");
            let http_port = free_port()?;
            let mut cmd = Command::new(&bin);
            cmd.arg("serve")
                .arg("--listen")
                .arg(addr.to_string())
                .arg("--http-listen")
                .arg(format!("127.0.0.1:{http_port}"))
                .arg("--data-dir")
                .arg(&data)
                .args(&bins.weir_args);
            Ok(("weir", cmd, Some(data)))
        }
        Kind::Memcached => {
            let bin = match &bins.memcached {
                Some(p) => p.clone(),
                None => find_on_path("memcached").context(
                    "memcached not found on PATH: install it (Debian: apt-get install memcached) or pass --memcached-bin",
                )?,
            };
            let mut cmd = Command::new(&bin);
            cmd.args(["-p", &port.to_string(), "-l", "127.0.0.1", "-U", "0"])
                .args(["-m", "1024", "-c", "10000", "-t", "2"]);
            if sys::is_root() {
                cmd.args(["-u", "root"]);
            }
            Ok(("memcached", cmd, None))
        }
    }
}
