//! The command-line flags that override the file: a flag wins over the environment,
//! which wins over the file (docs/configuration.md, "Precedence").

use std::path::PathBuf;

/// Flags that override the file.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub listen: Option<String>,
    pub http_listen: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub log_level: Option<String>,
    pub threads: Option<usize>,
    pub connections_max: Option<usize>,
    /// Enables the event bus on this address.
    pub bus_listen: Option<String>,
    /// Enables the beanstalkd door on this address.
    pub beanstalk_listen: Option<String>,
    /// `embedded` or `jetstream`.
    pub backend: Option<String>,
    /// JetStream servers, comma-separated.
    pub nats_servers: Option<String>,
    /// JetStream stream name; its subjects become `NAME.q.<queue>`.
    pub nats_stream: Option<String>,
}
