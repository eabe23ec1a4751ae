//! # weir-memcache: the memcache door of weir
//!
//! Serves the memcache text protocol in Kestrel's dialect (`docs/protocol.md`) over a
//! `weir_backend::Backend`. A library of its own so that the `weir` binary
//! (weir-server) is only the composition root: it reads the configuration, opens the
//! backend, starts this door beside the bus and the proxy, and stops them; this crate
//! holds no handle of the other doors and reads no file.
//!
//! The surface the root uses: [`BoundListener::bind`], then [`MemcacheDoor::start`]
//! with a [`MemcacheSettings`] and an optional [`Reload`];
//! [`MemcacheDoor::encode_metrics`], [`MemcacheDoor::begin_shutdown`],
//! [`MemcacheDoor::shutdown_requested`] (an enabled `shutdown` command) and
//! [`MemcacheDoor::stopped`].
//!
//! Layout, after tokio's mini-redis: [`connection`] owns the socket and its buffers,
//! [`inbound`] the framing, [`parse`] turns bytes into requests (pure, fuzzed:
//! `fuzz/`), [`request`] holds the key syntax, [`cmd`] has one file per command and
//! [`reply`] the fixed replies, [`leases`] and [`handles`] are per-connection state,
//! [`shared`] what every connection shares (the backend, limits, counters), [`door`]
//! accepts and enforces limits, [`shutdown`] passes the stop down to connections,
//! [`settings`] is what the door runs with, [`metrics`] its counters.

pub mod cmd;
pub mod connection;
pub mod door;
pub mod handles;
pub mod inbound;
pub mod leases;
pub mod metrics;
pub mod parse;
pub mod reply;
pub mod request;
pub mod settings;
pub mod shared;
pub mod shutdown;

pub use crate::door::{encode_idle_metrics, BoundListener, MemcacheDoor};
pub use crate::settings::{Limits, MemcacheSettings, Reload};
