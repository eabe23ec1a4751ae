//! How weir's HTTP listeners serve: the server's HTTP port (`/health`, `/metrics`,
//! the capture endpoints), the bus's API and the proxy's listeners all run one accept
//! loop, [`Listener`], so that they keep the same limits and stop the same way.
//!
//! - [`http_conns`]: the connection cap that evicts the connection idle the longest
//!   for a newcomer, and the deadline on a new connection's first request head.
//! - [`Listener`]: the accept loop that applies them to every connection, and the
//!   graceful stop with a bounded drain ([`STOP_GRACE`] unless the caller sets
//!   another).
//!
//! A crate of its own because the three doors live in three crates (weir-server,
//! weir-bus, weir-proxy); it needs nothing of the storage engine or its backends.

#![forbid(unsafe_code)]

pub mod http_conns;
mod listener;

pub use listener::{Connection, Listener, ACCEPT_BACKOFF, STOP_GRACE};
