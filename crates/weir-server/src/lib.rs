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
//! down, [`config`] reads the TOML file, [`metrics`] and [`http`] expose counters,
//! [`captures`] serves capture queues over HTTP, [`capture_cli`] runs `weir capture
//! export/import`, [`replay_cli`] `weir replay` and [`diff_cli`] `weir diff`.

pub mod capture_cli;
pub mod captures;
pub mod cmd;
pub mod config;
pub mod connection;
pub mod diff_cli;
pub mod handles;
pub mod http;
pub mod inbound;
pub mod leases;
pub mod metrics;
pub mod parse;
pub mod replay_cli;
pub mod reply;
pub mod request;
pub mod server;
pub mod shared;
pub mod shutdown;
pub mod signals;
