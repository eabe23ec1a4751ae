//! The config file as written: a TOML table per section, every key optional, unknown
//! keys refused. [`read_file`] is the one place weir reads it (at start and on
//! `reload`).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::backend::BackendSection;
use super::error::Error;
use super::queues::QueueSection;
use super::renamed::{old_names_in, OldName};
use super::server::ServerSection;

/// The file as written; every key optional.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub server: ServerSection,
    #[serde(default)]
    pub defaults: QueueSection,
    #[serde(default)]
    pub queues: BTreeMap<String, QueueSection>,
    /// The event bus; it runs when this section is present or `--bus-listen` given.
    pub bus: Option<weir_bus::BusConfig>,
    /// The beanstalkd door; it runs when this section is present or
    /// `--beanstalk-listen` given.
    pub beanstalk: Option<weir_beanstalk::BeanstalkConfig>,
    /// The HTTP proxy; it runs when this section has listeners.
    pub proxy: Option<weir_proxy::ProxyConfig>,
    /// Where the queues live: the embedded engine (default) or a JetStream cluster.
    #[serde(default)]
    pub backend: BackendSection,
    /// Keys the file gives under an old name: still read, warned about at start
    /// ([`FileConfig::warn_old_names`]).
    #[serde(skip)]
    pub old_names: Vec<OldName>,
}

impl FileConfig {
    /// Parses `text`, a config file's contents.
    pub fn parse(text: &str) -> Result<FileConfig, toml::de::Error> {
        let mut file: FileConfig = toml::from_str(text)?;
        file.old_names = old_names_in(text);
        Ok(file)
    }

    /// Logs once per key written under its old name (after logging is set up).
    pub fn warn_old_names(&self) {
        for o in &self.old_names {
            tracing::warn!(
                section = %o.section,
                old = o.old,
                new = o.new,
                "a config key has a new name; the old one still works"
            );
        }
    }

    /// `[defaults]` and every `[queues."PATTERN"]`, each with its name as a message
    /// gives it.
    pub fn queue_sections(&self) -> impl Iterator<Item = (String, &QueueSection)> {
        let defaults = std::iter::once(("defaults".to_string(), &self.defaults));
        let queues = self
            .queues
            .iter()
            .map(|(p, q)| (format!("queues.{p:?}"), q));
        defaults.chain(queues)
    }
}

/// Reads and parses a config file.
pub fn read_file(path: &Path) -> Result<FileConfig, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    FileConfig::parse(&text).map_err(|source| Error::Parse {
        path: path.to_path_buf(),
        source: Box::new(source),
    })
}
