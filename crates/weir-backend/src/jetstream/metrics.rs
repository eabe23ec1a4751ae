//! The JetStream backend's own `/metrics` series: is the cluster reachable, how often
//! calls had to retry, how often the client reconnected, and the calls by operation
//! and outcome.
//!
//! All plain atomics, bumped on the request path and read by a scrape: no lock, no
//! allocation, nothing that can reach the cluster (the queue series come from the
//! cached stats snapshot instead).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Kind, Result};
use crate::exposition::{self, Collector, DescriptorEncoder};

/// What a request did, for `weir_backend_requests_total{op}`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    Append,
    Take,
    Lease,
    Peek,
    Confirm,
    Release,
    Admin,
    Stats,
    /// Opening a queue or a reader (making it when new): a command refused because
    /// it could not be opened counts here.
    Open,
}

const OPS: [&str; 9] = [
    "append", "take", "lease", "peek", "confirm", "release", "admin", "stats", "open",
];
const RESULTS: [&str; 3] = ["ok", "error", "unavailable"];

#[derive(Debug, Default)]
pub(crate) struct Metrics {
    requests: [[AtomicU64; RESULTS.len()]; OPS.len()],
    retries: AtomicU64,
    /// Successful connections, the first included.
    connects: AtomicU64,
}

impl Metrics {
    pub fn count<T>(&self, op: Op, result: &Result<T>) {
        let outcome = match result {
            Ok(_) => 0,
            Err(e) if e.kind() == Kind::Unavailable => 2,
            Err(_) => 1,
        };
        self.requests[op as usize][outcome].fetch_add(1, Ordering::Relaxed);
    }

    pub fn retried(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    pub fn connected(&self) {
        self.connects.fetch_add(1, Ordering::Relaxed);
    }

    pub fn reconnects(&self) -> u64 {
        self.connects.load(Ordering::Relaxed).saturating_sub(1)
    }

    /// Encodes the series; `up` is the connection's state now.
    pub fn encode(&self, enc: &mut DescriptorEncoder<'_>, up: bool) -> fmt::Result {
        exposition::gauge(
            enc,
            "weir_backend_up",
            "Whether the JetStream cluster is reachable (1) or not (0).",
            u64::from(up),
        )?;
        exposition::counter(
            enc,
            "weir_backend_retries_total",
            "Calls to the cluster retried after a failure of the moment.",
            self.retries.load(Ordering::Relaxed),
        )?;
        exposition::counter(
            enc,
            "weir_backend_reconnects_total",
            "Times the client reconnected to the cluster.",
            self.reconnects(),
        )?;
        let samples = OPS.iter().zip(&self.requests).flat_map(|(op, row)| {
            RESULTS.iter().zip(row).map(|(result, n)| {
                (
                    [("op", *op), ("result", *result)],
                    n.load(Ordering::Relaxed),
                )
            })
        });
        exposition::counters(
            enc,
            "weir_backend_requests_total",
            "Backend calls by operation and result.",
            samples,
        )
    }
}

/// The series at one scrape, for encoding on their own ([`super::JetStream::render_metrics`]).
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub metrics: Arc<Metrics>,
    pub up: bool,
}

impl Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        self.metrics.encode(&mut enc, self.up)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    #[test]
    fn renders_counts() {
        let m = Metrics::default();
        m.count::<()>(Op::Append, &Ok(()));
        m.count::<()>(Op::Take, &Err(Error::new(Kind::Unavailable, "x")));
        m.connected();
        m.connected();
        let out = exposition::text(Snapshot {
            metrics: Arc::new(m),
            up: true,
        });
        assert!(out.contains("# TYPE weir_backend_requests_total counter\n"));
        assert!(out.contains("\nweir_backend_up 1\n"));
        assert!(out.contains("\nweir_backend_reconnects_total 1\n"));
        assert!(out.contains("weir_backend_requests_total{op=\"append\",result=\"ok\"} 1\n"));
        assert!(out.contains("{op=\"take\",result=\"unavailable\"} 1\n"));
    }
}
