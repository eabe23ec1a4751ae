//! What a beanstalk benchmark run is given: its parameters, and where its servers
//! come from (spawned beanstalkd modes, or `--target`s). A leaf of the step's files
//! (`beanstalk.rs`, `beanstalk_backlog.rs`), which both use it.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use crate::beanstalk_server::{BsKind, BsServer, BsTarget};

#[derive(Clone, Debug)]
pub struct BeanstalkParams {
    pub connections: Vec<usize>,
    /// Ops per throughput step at most, split over the connections.
    pub jobs: u64,
    /// Seconds per throughput step at most.
    pub seconds: f64,
    /// Job body size.
    pub size: usize,
    pub rounds: usize,
    /// Jobs of the memory and restart steps; 0 skips them.
    pub backlog: u64,
    /// Delay of the delayed jobs, seconds.
    pub delay_seconds: u32,
    pub skip_restart: bool,
}

/// Where the servers come from.
#[derive(Clone, Debug, Default)]
pub struct Servers {
    /// The beanstalkd binary, when a beanstalkd kind is to be spawned.
    pub bin: Option<PathBuf>,
    /// The weir binary, when a weir kind is to be spawned.
    pub weir_bin: Option<PathBuf>,
    pub kinds: Vec<BsKind>,
    pub work_dir: Option<PathBuf>,
    /// `--target`s: name, address, pid.
    pub external: Vec<(String, SocketAddr, Option<u32>)>,
}

impl Servers {
    pub(crate) fn fresh(&self, kind: BsKind) -> Result<BsTarget> {
        let bin = if kind.is_weir() {
            self.weir_bin
                .as_deref()
                .context("no weir binary to spawn")?
        } else {
            self.bin
                .as_deref()
                .context("no beanstalkd binary to spawn")?
        };
        Ok(BsTarget::spawned(BsServer::spawn(
            kind,
            bin,
            self.work_dir.as_deref(),
        )?))
    }

    pub(crate) fn externals(&self) -> Vec<BsTarget> {
        self.external
            .iter()
            .map(|(n, a, p)| BsTarget::external(n, *a, *p))
            .collect()
    }

    /// Spawned servers first (fresh), then the given ones.
    pub(crate) fn all(&self) -> Result<Vec<BsTarget>> {
        let mut out = Vec::new();
        for &k in &self.kinds {
            out.push(self.fresh(k)?);
        }
        out.extend(self.externals());
        if out.is_empty() {
            bail!("no target: give --target NAME=HOST:PORT or --spawn KIND (beanstalkd-f1000, beanstalkd-f0, beanstalkd-nobinlog, weir-periodic, weir-synced)");
        }
        Ok(out)
    }
}

/// A spawned server's last output lines, for an error's context (a refusal such as
/// `OUT_OF_MEMORY` is explained there: beanstalkd says so when its binlog cannot grow).
pub(crate) fn server_output(t: &BsTarget) -> String {
    match &t.server {
        Some(s) => format!("; its output:\n{}", s.log_tail()),
        None => String::new(),
    }
}
