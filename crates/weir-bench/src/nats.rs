//! The NATS side of `weir-bench cluster`: the tools (`nats-server` and the `nats` CLI,
//! installed by `scripts/nats-install` when missing), a 3-node JetStream cluster started
//! with `scripts/nats-cluster` and stopped when its guard drops (or on Ctrl-C), `nats
//! bench` runs and the reading of their summary lines, and a small JetStream admin
//! client (stream leaders, replica state, stream deletion) on async-nats.
//!
//! Why scripts rather than spawning nats-server here: the scripts are what the backend's
//! tests and the notes of issue 12 use, so the cluster measured is the same one (same
//! config, same ports layout: client BASE..BASE+2, routes BASE+10.., monitoring BASE+20..).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use async_nats::jetstream;

use crate::sys;

/// Clusters still running, for the Ctrl-C handler: (nats-cluster script, cluster dir,
/// whether the dir is a temporary one to remove).
static CLUSTERS: Mutex<Vec<(PathBuf, PathBuf, bool)>> = Mutex::new(Vec::new());

/// Stops every cluster this process started (for Ctrl-C and fatal errors); blocking.
pub fn stop_all_clusters() {
    let clusters = match CLUSTERS.lock() {
        Ok(mut c) => std::mem::take(&mut *c),
        Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
    };
    for (script, dir, temporary) in clusters {
        let _ = std::process::Command::new(&script)
            .arg("stop")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if temporary {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// Where the scripts and the binaries are.
#[derive(Clone, Debug)]
pub struct Tools {
    /// The repository (holds `scripts/nats-cluster` and `scripts/nats-install`).
    pub root: PathBuf,
    /// The `nats` CLI.
    pub nats: PathBuf,
}

impl Tools {
    fn script(&self, name: &str) -> PathBuf {
        self.root.join("scripts").join(name)
    }
}

/// The repository root: `explicit`, else the first ancestor of the current directory
/// or of this executable holding `scripts/nats-cluster`, else the source tree this
/// binary was built from.
fn find_root(explicit: Option<&Path>) -> Result<PathBuf> {
    let has_scripts = |d: &Path| d.join("scripts").join("nats-cluster").is_file();
    if let Some(d) = explicit {
        if has_scripts(d) {
            return Ok(d.to_path_buf());
        }
        bail!("--repo {}: no scripts/nats-cluster there", d.display());
    }
    let mut starts: Vec<PathBuf> = Vec::new();
    starts.extend(std::env::current_dir().ok());
    starts.extend(std::env::current_exe().ok());
    starts.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    for start in starts {
        if let Some(d) = start.ancestors().find(|d| has_scripts(d)) {
            return Ok(d.to_path_buf());
        }
    }
    bail!("scripts/nats-cluster not found above the current directory nor the executable: run from the weir repository or pass --repo")
}

/// Finds the repository and the tools, running `scripts/nats-install` when
/// `nats-server` or `nats` is missing from `$WEIR_TOOLS` (default `<repo>/.tools/bin`).
pub async fn locate_tools(explicit_root: Option<&Path>) -> Result<Tools> {
    let root = find_root(explicit_root)?;
    let bin = match std::env::var_os("WEIR_TOOLS") {
        Some(d) => PathBuf::from(d),
        None => root.join(".tools").join("bin"),
    };
    let (server, nats) = (bin.join("nats-server"), bin.join("nats"));
    if !server.is_file() || !nats.is_file() {
        eprintln!(
            "weir-bench: {} or nats missing; running scripts/nats-install",
            server.display()
        );
        let install = root.join("scripts").join("nats-install");
        let status = tokio::process::Command::new(&install)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .status()
            .await
            .with_context(|| format!("running {}", install.display()))?;
        if !status.success() {
            bail!(
                "{} failed ({status}); see its messages above",
                install.display()
            );
        }
        if !server.is_file() || !nats.is_file() {
            bail!(
                "{} succeeded but {} or nats is still missing",
                install.display(),
                server.display()
            );
        }
    }
    Ok(Tools { root, nats })
}

/// Runs a command to its end, killed if the future is dropped; returns stdout and
/// stderr together, or an error holding the tail of both when it fails.
pub async fn run_command(cmd: &mut tokio::process::Command, what: &str) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("starting {what}"))?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        bail!(
            "{what} failed ({}); its output ends:\n{}",
            out.status,
            tail(&text, 15)
        );
    }
    Ok(text)
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A 3-node JetStream cluster on loopback, stopped (`nats-cluster stop`) on drop.
pub struct NatsCluster {
    script: PathBuf,
    dir: PathBuf,
    /// The client URLs of n1, n2, n3.
    pub urls: Vec<String>,
    _temp: Option<tempfile::TempDir>,
}

impl NatsCluster {
    /// Starts n1..n3 with client ports `base`..`base+2` in `dir` (kept afterwards), or
    /// in a temporary directory under `work_dir` (removed afterwards).
    /// With `netns`, each node runs in a network namespace of its own
    /// (`NATS_NETNS=1`), so that [`NatsCluster::cut`] can part it from the others.
    pub async fn start(
        tools: &Tools,
        dir: Option<&Path>,
        work_dir: Option<&Path>,
        base: u16,
        netns: bool,
    ) -> Result<NatsCluster> {
        let (dir, temp) = match dir {
            Some(d) => (d.to_path_buf(), None),
            None => {
                let mut b = tempfile::Builder::new();
                b.prefix("weir-bench-nats-");
                let t = match work_dir {
                    Some(w) => b.tempdir_in(w),
                    None => b.tempdir(),
                }
                .context("creating the cluster's directory")?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        let script = tools.script("nats-cluster");
        if let Ok(mut c) = CLUSTERS.lock() {
            c.push((script.clone(), dir.clone(), temp.is_some()));
        }
        let mut cluster = NatsCluster {
            script,
            urls: Vec::new(),
            dir,
            _temp: temp,
        };
        let mut cmd = tokio::process::Command::new(&cluster.script);
        cmd.arg("start").arg(&cluster.dir).arg(base.to_string());
        if netns {
            cmd.env("NATS_NETNS", "1");
        }
        let what = format!("scripts/nats-cluster start {}", cluster.dir.display());
        run_command(&mut cmd, &what).await?;
        let urls = cluster.script_run(&["urls".into()], "urls").await?;
        cluster.urls = urls
            .trim()
            .split(',')
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect();
        if cluster.urls.len() != 3 {
            bail!("scripts/nats-cluster urls: expected 3 URLs, got {urls:?}");
        }
        Ok(cluster)
    }

    /// The URLs comma-separated, as `nats -s` and `weir --nats-servers` take them.
    pub fn url_list(&self) -> String {
        self.urls.join(",")
    }

    async fn script_run(&self, args: &[String], what: &str) -> Result<String> {
        let mut cmd = tokio::process::Command::new(&self.script);
        cmd.arg(&args[0]).arg(&self.dir).args(&args[1..]);
        run_command(
            &mut cmd,
            &format!("scripts/nats-cluster {what} {}", self.dir.display()),
        )
        .await
    }

    /// SIGKILLs node `n` (1..3) and waits until it is gone; returns the instant the
    /// signal was sent (taken just before sending it).
    pub async fn kill_node(&self, n: usize) -> Result<Instant> {
        let pid = self.pid(n)?;
        let at = Instant::now();
        sys::signal(pid, libc::SIGKILL).with_context(|| format!("killing node n{n}"))?;
        while sys::process_exists(pid) {
            if at.elapsed() > Duration::from_secs(10) {
                bail!("node n{n} (pid {pid}) still exists 10 s after SIGKILL");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(at)
    }

    /// Sends `sig` to node `n` (1..3); the instant it was sent.
    pub fn signal_node(&self, n: usize, sig: libc::c_int) -> Result<Instant> {
        let pid = self.pid(n)?;
        let at = Instant::now();
        sys::signal(pid, sig).with_context(|| format!("signalling node n{n}"))?;
        Ok(at)
    }

    fn pid(&self, n: usize) -> Result<u32> {
        let pid_file = self.dir.join(format!("n{n}")).join("pid");
        let text = std::fs::read_to_string(&pid_file)
            .with_context(|| format!("reading {}", pid_file.display()))?;
        text.trim()
            .parse()
            .with_context(|| format!("{}: not a pid: {text:?}", pid_file.display()))
    }

    /// Cuts node `n` off (`all`, `peers` or `clients`: scripts/nats-cluster `cut`; a
    /// cluster started with `netns`); the instant the cut was made.
    pub async fn cut(&self, n: usize, shape: &str) -> Result<Instant> {
        let at = Instant::now();
        self.script_run(
            &["cut".into(), n.to_string(), shape.into()],
            &format!("cut {n} {shape}"),
        )
        .await?;
        Ok(at)
    }

    /// Undoes the cuts of node `n` and waits until the cluster is ready again.
    pub async fn heal(&self, n: usize) -> Result<()> {
        self.script_run(&["heal".into(), n.to_string()], &format!("heal {n}"))
            .await
            .map(|_| ())
    }

    /// Starts node `n` again and waits until the cluster is ready (the script's own
    /// check: every node healthy, one meta leader).
    pub async fn restart_node(&self, n: usize) -> Result<()> {
        self.script_run(&["restart".into(), n.to_string()], &format!("restart {n}"))
            .await
            .map(|_| ())
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        if let Ok(mut c) = CLUSTERS.lock() {
            c.retain(|(_, d, _)| *d != self.dir);
        }
        let status = std::process::Command::new(&self.script)
            .arg("stop")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!(
                "weir-bench: stopping the NATS cluster in {} failed: {status:?}",
                self.dir.display()
            );
        }
    }
}

/// The rate of a `nats bench` run: the number on its line `... aggregated stats: 8,201
/// msgs/sec ~ 513 KiB/sec`. A missing line or an unreadable number is an error naming
/// what was there.
pub fn parse_aggregate_rate(output: &str) -> Result<f64> {
    const MARK: &str = "aggregated stats:";
    let Some(line) = output.lines().find(|l| l.contains(MARK)) else {
        bail!(
            "no '{MARK}' line in the nats bench output; it ends:\n{}",
            tail(output, 10)
        );
    };
    let after = line.split_once(MARK).map(|(_, a)| a).unwrap_or_default();
    let number = after
        .split_once("msgs/sec")
        .map(|(n, _)| n.trim().replace(',', ""))
        .unwrap_or_default();
    match number.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => bail!(
            "cannot read a msgs/sec rate in the nats bench line {:?}",
            line.trim()
        ),
    }
}

/// A JetStream client for the bench's own bookkeeping.
pub struct Admin {
    js: jetstream::Context,
}

/// A stream's raft state as the leader reports it.
#[derive(Clone, Debug, Default)]
pub struct StreamState {
    pub leader: Option<String>,
    /// Peers other than the leader, and whether each is current.
    pub replicas: Vec<(String, bool)>,
}

impl StreamState {
    /// A leader and `replicas - 1` current followers.
    pub fn all_current(&self, replicas: usize) -> bool {
        self.leader.is_some()
            && self.replicas.len() + 1 >= replicas
            && self.replicas.iter().all(|(_, c)| *c)
    }
}

impl Admin {
    pub async fn connect(urls: &[String]) -> Result<Admin> {
        // The bench's own view must not stay on a server it stopped or cut off.
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(5))
            .ping_interval(Duration::from_secs(1))
            .max_reconnects(None)
            .connect(urls.to_vec())
            .await
            .with_context(|| format!("connecting to NATS at {}", urls.join(",")))?;
        let js = jetstream::ContextBuilder::new()
            .timeout(Duration::from_secs(5))
            .build(client);
        Ok(Admin { js })
    }

    /// The stream's leader and replicas.
    pub async fn state(&self, stream: &str) -> Result<StreamState> {
        let mut s = self
            .js
            .get_stream(stream)
            .await
            .with_context(|| format!("looking up stream {stream}"))?;
        let info = s
            .info()
            .await
            .with_context(|| format!("stream info {stream}"))?;
        let Some(cluster) = &info.cluster else {
            return Ok(StreamState::default());
        };
        Ok(StreamState {
            leader: cluster.leader.clone(),
            replicas: cluster
                .replicas
                .iter()
                .map(|p| (p.name.clone(), p.current && !p.offline))
                .collect(),
        })
    }

    /// Waits until `stream` has a leader, retrying errors (an election, a client
    /// reconnecting), up to `timeout`.
    pub async fn wait_leader(&self, stream: &str, timeout: Duration) -> Result<String> {
        self.wait(stream, timeout, |s| s.leader.clone()).await
    }

    /// Waits until `stream` has a leader and `replicas - 1` current followers.
    pub async fn wait_current(
        &self,
        stream: &str,
        replicas: usize,
        timeout: Duration,
    ) -> Result<()> {
        self.wait(stream, timeout, |s| s.all_current(replicas).then_some(()))
            .await
    }

    async fn wait<T>(
        &self,
        stream: &str,
        timeout: Duration,
        done: impl Fn(&StreamState) -> Option<T>,
    ) -> Result<T> {
        let until = Instant::now() + timeout;
        loop {
            let last = match self.state(stream).await {
                Ok(s) => match done(&s) {
                    Some(v) => return Ok(v),
                    None => format!("{s:?}"),
                },
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() > until {
                bail!("stream {stream} not ready after {timeout:?}: {last}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Creates an R3 file stream `name` on `subject` (limits retention: what `nats
    /// bench js pub --create` makes).
    pub async fn create_stream(&self, name: &str, subject: &str) -> Result<()> {
        let config = jetstream::stream::Config {
            name: name.to_string(),
            subjects: vec![subject.to_string()],
            num_replicas: 3,
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        };
        self.js
            .create_stream(config)
            .await
            .with_context(|| format!("creating stream {name}"))?;
        Ok(())
    }

    /// Deletes a stream; one that does not exist is not an error.
    pub async fn delete_stream(&self, name: &str) -> Result<()> {
        match self.js.delete_stream(name).await {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("not found") => Ok(()),
            Err(e) => Err(e).with_context(|| format!("deleting stream {name}")),
        }
    }
}

/// The node number of a server name `n1`..`n3` (as scripts/nats-cluster names them).
pub fn node_of(server: &str) -> Result<usize> {
    match server
        .strip_prefix('n')
        .and_then(|d| d.parse::<usize>().ok())
    {
        Some(n @ 1..=3) => Ok(n),
        _ => bail!("server name {server:?} is not n1, n2 or n3"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nats_bench_summaries() {
        let out = "17:03:06 Starting ...\n  [1] 1,084 msgs/sec ~ 68 KiB/sec\n\n NATS JetStream synchronous publisher aggregated stats: 8,201 msgs/sec ~ 513 KiB/sec\n message rates min 821";
        assert_eq!(parse_aggregate_rate(out).unwrap(), 8201.0);
        let fetch = " NATS JetStream durable consumer (fetch) aggregated stats: 3,054.5 msgs/sec ~ 382 KiB/sec";
        assert_eq!(parse_aggregate_rate(fetch).unwrap(), 3054.5);
        let missing = parse_aggregate_rate("nats: error: context deadline exceeded").unwrap_err();
        assert!(format!("{missing:#}").contains("context deadline exceeded"));
        let bad = parse_aggregate_rate(" x aggregated stats: lots msgs/sec").unwrap_err();
        assert!(format!("{bad:#}").contains("aggregated stats: lots"));
        assert!(parse_aggregate_rate(" aggregated stats: 0 msgs/sec").is_err());
    }

    #[test]
    fn node_names() {
        assert_eq!(node_of("n2").unwrap(), 2);
        assert!(node_of("n4").is_err());
        assert!(node_of("server").is_err());
    }

    #[test]
    fn replica_state() {
        let mut s = StreamState {
            leader: Some("n1".into()),
            replicas: vec![("n2".into(), true), ("n3".into(), true)],
        };
        assert!(s.all_current(3));
        s.replicas[1].1 = false;
        assert!(!s.all_current(3));
        s.replicas.pop();
        s.replicas[0].1 = true;
        assert!(!s.all_current(3));
    }
}
