//! Graceful shutdown, passed down explicitly (as in mini-redis).
//!
//! SIGTERM, SIGINT or an enabled `shutdown` command call [`Shutdown::trigger`]. The
//! accept loop and the HTTP server watch a `watch` channel. Each connection gets its
//! own one-shot listener instead of a shared channel: a connection re-arms its
//! shutdown future on every read, and a shared channel would put one mutex on every
//! connection's hot path. The registry's lock is taken only at connect and disconnect.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::{oneshot, watch};

pub struct Shutdown {
    triggered: AtomicBool,
    watch: watch::Sender<bool>,
    connections: Mutex<HashMap<u64, oneshot::Sender<()>>>,
    next_id: AtomicU64,
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown {
            triggered: AtomicBool::new(false),
            watch: watch::Sender::new(false),
            connections: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
        }
    }
}

impl Shutdown {
    /// Starts the shutdown; later calls do nothing.
    pub fn trigger(&self) {
        if self.triggered.swap(true, Ordering::AcqRel) {
            return;
        }
        self.watch.send_replace(true);
        let senders: Vec<oneshot::Sender<()>> = match self.connections.lock() {
            Ok(mut map) => map.drain().map(|(_, s)| s).collect(),
            Err(poisoned) => poisoned.into_inner().drain().map(|(_, s)| s).collect(),
        };
        for sender in senders {
            let _ = sender.send(());
        }
    }

    pub fn is_triggered(&self) -> bool {
        self.triggered.load(Ordering::Acquire)
    }

    /// Resolves once shutdown has been triggered.
    pub async fn wait(&self) {
        let mut rx = self.watch.subscribe();
        let _ = rx.wait_for(|v| *v).await;
    }

    /// A listener for one connection; pass its id to [`Shutdown::deregister`] when the
    /// connection ends.
    pub fn register(&self) -> (u64, Listener) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let mut listener = Listener { rx, fired: false };
        match self.connections.lock() {
            Ok(mut map) => {
                map.insert(id, tx);
            }
            Err(poisoned) => {
                poisoned.into_inner().insert(id, tx);
            }
        }
        // Triggered between the check in trigger() and the insert: fire at once.
        if self.is_triggered() {
            listener.fired = true;
        }
        (id, listener)
    }

    pub fn deregister(&self, id: u64) {
        match self.connections.lock() {
            Ok(mut map) => {
                map.remove(&id);
            }
            Err(poisoned) => {
                poisoned.into_inner().remove(&id);
            }
        }
    }
}

/// One connection's view of the shutdown.
pub struct Listener {
    rx: oneshot::Receiver<()>,
    fired: bool,
}

impl Listener {
    pub fn is_fired(&self) -> bool {
        self.fired
    }

    /// Resolves once shutdown has been triggered (at once if it already has).
    pub async fn recv(&mut self) {
        if self.fired {
            return;
        }
        let _ = (&mut self.rx).await;
        self.fired = true;
    }
}
