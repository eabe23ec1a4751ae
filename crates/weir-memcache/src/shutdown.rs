//! Graceful shutdown, passed down explicitly (as in mini-redis).
//!
//! The root's stop (on SIGTERM or SIGINT) or an enabled `shutdown` command call
//! [`Shutdown::trigger`]. The accept loop watches a `watch` channel, and so does the
//! root (`MemcacheDoor::shutdown_requested`: a `shutdown` command stops the whole
//! process). Connections do not: a
//! connection would re-arm a shutdown future on every read, which costs a shared
//! structure (a channel's lock, or a cold cache line of a per-connection one-shot)
//! on every request. Instead each connection registers its socket, and the trigger
//! shuts down the read side of every registered socket (`shutdown(fd, SHUT_RD)`): a
//! read then returns what the client had already sent, then end-of-file. So a
//! connection finishes the requests it has received, sees end-of-file and ends, and
//! a command waiting for an item (which watches its socket for a close) wakes; both
//! tell a shutdown from a client leaving by [`Shutdown::is_triggered`]. The registry's
//! lock is taken only at connect, at disconnect and by the trigger.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::watch;

pub struct Shutdown {
    triggered: AtomicBool,
    watch: watch::Sender<bool>,
    /// The socket of every open connection, by connection id.
    connections: Mutex<HashMap<u64, RawFd>>,
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

/// Stops reads on `fd` after what has been received.
fn stop_reading(fd: RawFd) {
    // SAFETY: shutdown(2) takes a descriptor number and touches no memory of ours.
    // `fd` is open: a connection deregisters before it closes its socket, and both
    // the deregistration and this call run under the registry's lock, so the number
    // cannot have been closed and reused by another file meanwhile.
    unsafe {
        libc::shutdown(fd, libc::SHUT_RD);
    }
}

impl Shutdown {
    /// Starts the shutdown; later calls do nothing.
    pub fn trigger(&self) {
        if self.triggered.swap(true, Ordering::AcqRel) {
            return;
        }
        self.watch.send_replace(true);
        let map = match self.connections.lock() {
            Ok(map) => map,
            Err(poisoned) => poisoned.into_inner(),
        };
        for &fd in map.values() {
            stop_reading(fd);
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

    /// Registers a connection's socket. The returned guard deregisters it when
    /// dropped; it must be dropped before the socket is closed (declare it after the
    /// socket's owner, so it drops first, on every path out, unwinding included).
    pub fn register(&self, fd: RawFd) -> Registration<'_> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut map = match self.connections.lock() {
            Ok(map) => map,
            Err(poisoned) => poisoned.into_inner(),
        };
        map.insert(id, fd);
        // Triggered before the insert: the trigger did not see this socket.
        if self.is_triggered() {
            stop_reading(fd);
        }
        Registration { shutdown: self, id }
    }

    fn deregister(&self, id: u64) {
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

/// One registered socket; deregisters on drop.
pub struct Registration<'a> {
    shutdown: &'a Shutdown,
    id: u64,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.shutdown.deregister(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn trigger_lets_reads_drain_then_end() -> std::io::Result<()> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let mut client = std::net::TcpStream::connect(listener.local_addr()?)?;
        let (mut server_side, _) = listener.accept()?;
        let shutdown = Shutdown::default();
        use std::os::fd::AsRawFd;
        let registration = shutdown.register(server_side.as_raw_fd());
        client.write_all(b"sent before")?;
        client.flush()?;
        // Give loopback a moment to deliver, then stop.
        std::thread::sleep(std::time::Duration::from_millis(50));
        shutdown.trigger();
        assert!(shutdown.is_triggered());
        let mut got = Vec::new();
        server_side.read_to_end(&mut got)?;
        assert_eq!(got, b"sent before");
        drop(registration);
        // A connection registered after the trigger is stopped at once.
        let mut late_client = std::net::TcpStream::connect(listener.local_addr()?)?;
        let (mut late, _) = listener.accept()?;
        let late_registration = shutdown.register(late.as_raw_fd());
        late_client.write_all(b"x")?;
        let mut buf = [0u8; 8];
        // Either the byte arrived before the stop (then end-of-file), or only EOF.
        let n = late.read(&mut buf)?;
        if n == 1 {
            assert_eq!(late.read(&mut buf)?, 0);
        }
        drop(late_registration);
        let registered = match shutdown.connections.lock() {
            Ok(map) => map.len(),
            Err(poisoned) => poisoned.into_inner().len(),
        };
        assert_eq!(registered, 0, "dropped registrations leave the registry");
        Ok(())
    }
}
