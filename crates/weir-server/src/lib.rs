//! # weir-server: the composition root of weir
//!
//! The binary `weir` (see `main.rs`) parses flags, reads the configuration
//! ([`config`], the one reader of the TOML file), opens the backend and starts the
//! doors the configuration asks for: the memcache door (the crate `weir_memcache`),
//! the event bus (`weir_bus`) and the HTTP proxy (`weir_proxy`), plus the HTTP port
//! ([`http`]: `/health`, `/metrics` composed from every running door's figures, and
//! the proxy's capture endpoints merged in). [`root`] composes and stops them in
//! order, [`doors`] gives them one shape, [`signals`] catches SIGTERM and SIGINT from
//! before the store opens, [`metrics`] encodes the root's own series. `weir capture`,
//! `weir replay` and `weir diff` run `weir_proxy::tools`.
//!
//! The protocol is documented in `docs/protocol.md`, the configuration in
//! `docs/configuration.md`.

pub mod config;
pub mod doors;
pub mod http;
pub mod metrics;
pub mod root;
pub mod signals;
