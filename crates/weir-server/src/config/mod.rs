//! Configuration: a TOML file, overridden by the environment and command-line flags.
//!
//! One file per section, each with its struct, its defaults and its checks:
//! `[server]` ([`server`]: addresses, limits of the memcache door and the HTTP
//! port), `[defaults]` and `[queues."PATTERN"]` ([`queues`]: the engine's queue
//! settings), `[backend]` ([`backend`]: the engine or a JetStream cluster), and the
//! doors' own sections (`[bus]`, `[proxy]`, `[beanstalk]`), which their crates check. [`mod@file`] reads
//! the file, [`settings`] resolves it with the flags ([`flags`]) and the environment
//! into what the process runs with; a refused value is a [`ConfigError`] naming its
//! key. Keys follow one naming scheme (the thing, its unit, then `_max` for a cap);
//! older names still work and are warned about ([`renamed`]). Every key and its
//! default is in `docs/configuration.md`.
//!
//! `reload` re-reads the file: queue settings and the `[server]` limits marked
//! reloadable take effect at once, all together; addresses, the data directory,
//! threads and `connections_max` need a restart.

pub mod backend;
pub mod error;
pub mod file;
pub mod flags;
pub mod queues;
pub mod renamed;
pub mod server;
pub mod settings;

pub use backend::{BackendSection, BackendSettings};
pub use error::Error;
pub use file::{read_file, FileConfig};
pub use flags::Overrides;
pub use queues::{glob_match, QueueSection};
pub use server::*;
pub use settings::{cpus, reload_from, resolve, resolve_with_env, Settings};
pub use weir_backend::ConfigError;
pub use weir_memcache::parse::{
    GET_KEYS_MAX_DEFAULT, ITEM_SIZE_BYTES_MAX_DEFAULT, LINE_BYTES_MAX_DEFAULT,
};
pub use weir_memcache::settings::{
    Limits, OPEN_READS_MAX_DEFAULT, QUEUES_MAX_DEFAULT, REQUEST_TIMEOUT_MS_DEFAULT,
    WAIT_MS_MAX_DEFAULT,
};

#[cfg(test)]
mod tests;
