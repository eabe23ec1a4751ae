//! The JetStream backend's own `/metrics` series: is the cluster reachable, how often
//! calls had to retry, how often the client reconnected, and the calls by operation
//! and outcome.
//!
//! All plain atomics, bumped on the request path and read by a scrape: no lock, no
//! allocation, nothing that can reach the cluster (the queue series come from the
//! cached stats snapshot instead).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Kind, Result};

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

#[derive(Default)]
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

    /// Prometheus text; `up` is the connection's state now.
    pub fn render(&self, out: &mut String, up: bool) {
        let _ = writeln!(
            out,
            "# HELP weir_backend_up Whether the JetStream cluster is reachable (1) or not (0).\n\
             # TYPE weir_backend_up gauge\nweir_backend_up {}",
            u8::from(up)
        );
        let _ = writeln!(
            out,
            "# HELP weir_backend_retries_total Calls to the cluster retried after a failure of the moment.\n\
             # TYPE weir_backend_retries_total counter\nweir_backend_retries_total {}",
            self.retries.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP weir_backend_reconnects_total Times the client reconnected to the cluster.\n\
             # TYPE weir_backend_reconnects_total counter\nweir_backend_reconnects_total {}",
            self.reconnects()
        );
        let _ = writeln!(
            out,
            "# HELP weir_backend_requests_total Backend calls by operation and result.\n\
             # TYPE weir_backend_requests_total counter"
        );
        for (op, row) in OPS.iter().zip(&self.requests) {
            for (result, n) in RESULTS.iter().zip(row) {
                let _ = writeln!(
                    out,
                    "weir_backend_requests_total{{op=\"{op}\",result=\"{result}\"}} {}",
                    n.load(Ordering::Relaxed)
                );
            }
        }
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
        let mut out = String::new();
        m.render(&mut out, true);
        assert!(out.contains("weir_backend_up 1\n"));
        assert!(out.contains("weir_backend_reconnects_total 1\n"));
        assert!(out.contains("weir_backend_requests_total{op=\"append\",result=\"ok\"} 1\n"));
        assert!(out.contains("{op=\"take\",result=\"unavailable\"} 1\n"));
    }
}
