//! # weir-server: the memcache front door of weir
//!
//! The binary `weir` (see `main.rs`) serves the memcache text protocol in Kestrel's
//! dialect over the `weir` engine, plus `/health` and `/metrics` over HTTP. The
//! protocol is documented in `docs/protocol.md`, the configuration in
//! `docs/configuration.md`.
//!
//! Layout, after tokio's mini-redis: [`connection`] owns the socket and its buffers,
//! [`inbound`] the framing, [`parse`] turns bytes into requests (pure, fuzzed),
//! [`request`] holds the key syntax, [`cmd`] has one file per command and [`reply`] the
//! fixed replies, [`leases`] and [`handles`] are per-connection state, [`shared`] what
//! every connection shares (the backend, limits, counters), [`server`] accepts and
//! enforces limits, [`signals`] and [`shutdown`] turn a signal into the stop passed
//! down, [`config`] reads the TOML file, [`metrics`] and [`http`] expose counters
//! (the HTTP port merges in the proxy's capture endpoints,
//! `weir_proxy::tools::captures`; `weir capture`, `weir replay` and `weir diff` run
//! `weir_proxy::tools`).

pub mod cmd;
pub mod config;
pub mod connection;
pub mod handles;
pub mod http;
pub mod inbound;
pub mod leases;
pub mod metrics;
pub mod parse;
pub mod reply;
pub mod request;
pub mod server;
pub mod shared;
pub mod shutdown;
pub mod signals;
