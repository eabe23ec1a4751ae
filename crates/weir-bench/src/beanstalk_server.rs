//! The servers of the `beanstalk` benchmark: Debian's beanstalkd spawned in its three
//! durability modes, weir's beanstalkd door spawned in two of its own, and servers
//! somebody else runs (`--target NAME=HOST:PORT`).
//!
//! A spawned server gets a free loopback port and a fresh temporary directory for its
//! binlog (beanstalkd) or data directory (weir, with a config file that sets every
//! queue's durability), and can be killed and started again on the same files (the
//! restart measurement). It is stopped and its directory removed when its handle
//! drops, and it is registered with the Ctrl-C handler of `target.rs`, so an
//! interrupted or failed run leaves nothing behind.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::sys;
use crate::target::{find_on_path, free_port, register_child, unregister_child};

/// How long a spawned server may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a server may take to exit after a signal before it gets SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// A server the benchmark can spawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BsKind {
    /// beanstalkd with a binlog, fsync at most once a second (`-b DIR -f 1000`).
    BeanstalkdF1000,
    /// beanstalkd with a binlog, fsync after every write (`-b DIR -f 0`).
    BeanstalkdF0,
    /// beanstalkd without a binlog: memory only, the upper bound.
    BeanstalkdNoBinlog,
    /// weir's beanstalkd door, every queue `periodic` (written to the page cache
    /// before `INSERTED`, fsync'ed once a second): beanstalkd `-f 1000`'s peer.
    WeirPeriodic,
    /// weir's beanstalkd door, every queue `synced` (`INSERTED` after fdatasync,
    /// shared by concurrent puts): beanstalkd `-f 0`'s peer.
    WeirSynced,
}

/// beanstalkd's kinds: what `all` and a bare `--spawn` run when there is no weir binary.
pub const BEANSTALKD_KINDS: [BsKind; 3] = [
    BsKind::BeanstalkdF1000,
    BsKind::BeanstalkdF0,
    BsKind::BeanstalkdNoBinlog,
];

/// Every kind, in report order: what runs when no server is named.
pub const ALL_KINDS: [BsKind; 5] = [
    BsKind::BeanstalkdF1000,
    BsKind::WeirPeriodic,
    BsKind::BeanstalkdF0,
    BsKind::WeirSynced,
    BsKind::BeanstalkdNoBinlog,
];

/// The names `--spawn` knows, for its error.
const KIND_NAMES: &str =
    "beanstalkd-f1000, beanstalkd-f0, beanstalkd-nobinlog, weir-periodic, weir-synced";

impl std::str::FromStr for BsKind {
    type Err = String;
    fn from_str(s: &str) -> Result<BsKind, String> {
        ALL_KINDS
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("cannot spawn {s:?}: known are {KIND_NAMES}"))
    }
}

impl BsKind {
    /// The name on the command line and in the reports.
    pub fn name(self) -> &'static str {
        match self {
            BsKind::BeanstalkdF1000 => "beanstalkd-f1000",
            BsKind::BeanstalkdF0 => "beanstalkd-f0",
            BsKind::BeanstalkdNoBinlog => "beanstalkd-nobinlog",
            BsKind::WeirPeriodic => "weir-periodic",
            BsKind::WeirSynced => "weir-synced",
        }
    }

    /// weir's durability for every queue, for weir's kinds.
    fn weir_durability(self) -> Option<&'static str> {
        match self {
            BsKind::WeirPeriodic => Some("periodic"),
            BsKind::WeirSynced => Some("synced"),
            _ => None,
        }
    }

    pub fn is_weir(self) -> bool {
        self.weir_durability().is_some()
    }

    /// The fsync interval of beanstalkd's binlog in ms; `None` without a binlog (and
    /// for weir).
    fn fsync_ms(self) -> Option<u32> {
        match self {
            BsKind::BeanstalkdF1000 => Some(1000),
            BsKind::BeanstalkdF0 => Some(0),
            _ => None,
        }
    }

    /// Whether every put waits for an fsync: filling a backlog of a million jobs on one
    /// connection then costs up to a million fsyncs, so the backlog steps leave it out.
    pub fn syncs_every_write(self) -> bool {
        matches!(self, BsKind::BeanstalkdF0 | BsKind::WeirSynced)
    }
}

/// The beanstalkd binary: the one given, else on PATH, else Debian's place.
pub fn find_beanstalkd(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        if p.is_file() {
            return Ok(p.to_path_buf());
        }
        bail!("--beanstalkd-bin {}: no such file", p.display());
    }
    find_on_path("beanstalkd")
        .or_else(|| Some(PathBuf::from("/usr/bin/beanstalkd")).filter(|p| p.is_file()))
        .context(
            "beanstalkd not found on PATH: install it (Debian: apt-get install beanstalkd) or pass --beanstalkd-bin",
        )
}

/// A spawned server: its process, port and binlog (or data) directory.
pub struct BsServer {
    pub kind: BsKind,
    pub addr: SocketAddr,
    bin: PathBuf,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl BsServer {
    /// Starts a fresh server of `kind` on a free loopback port, its directory under
    /// `work_dir` (or the system temp dir), and waits until it accepts.
    pub fn spawn(kind: BsKind, bin: &Path, work_dir: Option<&Path>) -> Result<BsServer> {
        let mut builder = tempfile::Builder::new();
        builder.prefix("weir-bench-beanstalkd-");
        let dir = match work_dir {
            Some(parent) => builder.tempdir_in(parent),
            None => builder.tempdir(),
        }
        .context("creating a temporary directory for beanstalkd")?;
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let mut server = BsServer {
            kind,
            addr,
            bin: bin.to_path_buf(),
            dir,
            child: None,
        };
        server.start()?;
        server.wait_accepting()?;
        Ok(server)
    }

    /// Where its jobs are kept on disk: beanstalkd's binlog directory (for a kind
    /// with a binlog), weir's data directory.
    pub fn store_dir(&self) -> Option<PathBuf> {
        if self.kind.is_weir() {
            return Some(self.dir.path().join("data"));
        }
        self.kind.fsync_ms().map(|_| self.dir.path().join("binlog"))
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts the process (again, on the same port and binlog after [`Self::kill`]);
    /// does not wait for it.
    pub fn start(&mut self) -> Result<()> {
        if self.child.is_some() {
            bail!("{} is already running", self.kind.name());
        }
        let log_path = self.dir.path().join("server.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let log_err = log.try_clone().context("duplicating the log file")?;
        let mut cmd = self.command()?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {} ({cmd:?})", self.kind.name()))?;
        register_child(child.id(), Some(self.dir.path().to_path_buf()));
        self.child = Some(child);
        Ok(())
    }

    /// The command line of the server's kind.
    fn command(&self) -> Result<Command> {
        let mut cmd = Command::new(&self.bin);
        if let Some(durability) = self.kind.weir_durability() {
            let config = self.dir.path().join("weir.toml");
            std::fs::write(
                &config,
                format!("[defaults]\ndurability = \"{durability}\"\n"),
            )
            .with_context(|| format!("writing {}", config.display()))?;
            cmd.arg("serve")
                .arg("--config")
                .arg(&config)
                .arg("--data-dir")
                .arg(self.dir.path().join("data"))
                .args(["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
                .args(["--log-level", "warn", "--beanstalk-listen"])
                .arg(self.addr.to_string());
            return Ok(cmd);
        }
        cmd.args(["-l", "127.0.0.1", "-p", &self.addr.port().to_string()]);
        if let (Some(ms), Some(binlog)) = (self.kind.fsync_ms(), self.store_dir()) {
            std::fs::create_dir_all(&binlog)
                .with_context(|| format!("creating {}", binlog.display()))?;
            cmd.arg("-b").arg(&binlog).args(["-f", &ms.to_string()]);
        }
        Ok(cmd)
    }

    /// Waits until the server accepts connections (beanstalkd listens before it
    /// replays its binlog, so this is not yet "serving").
    pub fn wait_accepting(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait().context("waiting for the server")? {
                    self.child = None;
                    bail!(
                        "{} exited at start ({status}); its output:\n{}",
                        self.kind.name(),
                        self.log_tail()
                    );
                }
            }
            if std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not accept connections on {} within {READY_TIMEOUT:?}; its output:\n{}",
                    self.kind.name(),
                    self.addr,
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sends `sig` and waits for the process to end (SIGKILL after [`STOP_TIMEOUT`]).
    pub fn kill(&mut self, sig: libc::c_int) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let pid = child.id();
        let _ = sys::signal(pid, sig);
        let deadline = Instant::now() + STOP_TIMEOUT;
        let ended = loop {
            if let Ok(Some(_)) = child.try_wait() {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        if !ended {
            let _ = child.kill();
            let _ = child.wait();
        }
        unregister_child(pid);
        Ok(())
    }

    /// The last lines of the server's output (for an error's context).
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for BsServer {
    fn drop(&mut self) {
        let _ = self.kill(libc::SIGTERM);
    }
}

/// One server under test: spawned, or somebody else's.
pub struct BsTarget {
    pub name: String,
    pub addr: SocketAddr,
    /// Whose VmRSS and CPU time are read.
    pub pid: Option<u32>,
    pub server: Option<BsServer>,
}

impl BsTarget {
    pub fn spawned(server: BsServer) -> BsTarget {
        BsTarget {
            name: server.kind.name().to_string(),
            addr: server.addr,
            pid: server.pid(),
            server: Some(server),
        }
    }

    pub fn external(name: &str, addr: SocketAddr, pid: Option<u32>) -> BsTarget {
        BsTarget {
            name: name.to_string(),
            addr,
            pid,
            server: None,
        }
    }

    /// The pid after a restart.
    pub fn refresh_pid(&mut self) {
        if let Some(s) = &self.server {
            self.pid = s.pid();
        }
    }
}
