//! SIGTERM and SIGINT, caught from before the store opens.
//!
//! A start installs these first, before the store opens and before anything listens,
//! so a signal during start-up is never fatal: the start finishes (it is bounded
//! work, and one cut short half-way would leave a store opening on the blocking pool
//! unclosed), and the server stops at once by the graceful path, exit 0, as a signal
//! in operation does. Handlers installed once
//! the server listened left a window (opening the store, connecting to JetStream,
//! starting the bus and the proxy) where SIGTERM took the default action: exit 143,
//! nothing closed.

use tokio::signal::unix::{signal, Signal, SignalKind};

/// The two signals that stop weir, as streams.
pub struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    /// Installs the handlers (needs a tokio runtime with signals enabled).
    pub fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// The next signal's name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}
