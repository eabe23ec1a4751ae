//! The proxy's tooling: the HTTP port's capture endpoints ([`captures`]), and the
//! command lines that record now and replay later: `weir capture export/import`
//! ([`capture_cli`]), `weir replay` ([`replay_cli`]) and `weir diff report`
//! ([`diff_cli`]), with the client their `--server` mode reaches a running weir through
//! (`server_client`). They live beside the proxy because they use its capture format,
//! replays and reports; the `weir` binary only parses the flags and calls them.

pub mod capture_cli;
pub mod captures;
pub mod diff_cli;
pub mod replay_cli;
mod server_client;

/// The environment variable that holds the admin key, read by the server's config
/// and by the command lines' `--server` mode.
pub const ADMIN_KEY_ENV: &str = "WEIR_ADMIN_KEY";
