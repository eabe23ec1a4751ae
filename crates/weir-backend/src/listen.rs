//! The front doors' TCP listeners (the memcache and beanstalkd ports): bound with a
//! deep accept queue. `TcpListener::bind` asks the kernel for 128 pending
//! connections; past that a burst of connects waits for SYN retries, a second and
//! more each (10,000 connections took 14 to 17 s to open on the beanstalkd port,
//! 0.5 s with this backlog; Debian's beanstalkd takes 0.4 s).

use std::io;

use tokio::net::TcpListener;

/// Pending connections the kernel queues for `accept` (capped by
/// `net.core.somaxconn`).
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds `addr` (its first address that binds) with a [`LISTEN_BACKLOG`]-deep
/// accept queue, `SO_REUSEADDR` set.
pub async fn listen(addr: &str) -> io::Result<TcpListener> {
    let mut last = None;
    for sa in tokio::net::lookup_host(addr).await? {
        let socket = if sa.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(sa).and_then(|()| socket.listen(LISTEN_BACKLOG)) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last
        .unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address to listen on")))
}
