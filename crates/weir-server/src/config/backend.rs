//! `[backend]`: where the queues live, `kind = "embedded"` (the default) or
//! `"jetstream"` with `[backend.jetstream]`. Restart-only. The JetStream backend
//! refuses at start the queue settings it cannot honour, and lists those it ignores
//! (the cluster decides them) so that the start logs them.

use serde::Deserialize;
use weir_backend::ConfigError;

use super::flags::Overrides;
use super::queues::QueueSection;

/// `[backend]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSection {
    pub kind: Option<String>,
    pub jetstream: Option<weir_backend::JetStreamConfig>,
}

/// Where the queues live, resolved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum BackendSettings {
    #[default]
    Embedded,
    JetStream(Box<weir_backend::JetStreamConfig>),
}

impl BackendSection {
    /// The kind asked for: the `--backend` flag (or `WEIR_BACKEND`), else the file's.
    fn kind<'a>(&'a self, flags: &'a Overrides) -> Option<&'a str> {
        flags.backend.as_deref().or(self.kind.as_deref())
    }

    /// This section and its flags, checked against what the JetStream backend cannot
    /// do with `queues` (`[defaults]` and every `[queues."PATTERN"]`, each with its
    /// name as a message gives it).
    pub fn resolve<'a>(
        &self,
        flags: &Overrides,
        queues: impl Iterator<Item = (String, &'a QueueSection)>,
    ) -> Result<BackendSettings, ConfigError> {
        match self.kind(flags).unwrap_or("embedded") {
            "embedded" => return Ok(BackendSettings::Embedded),
            // Refused here, before anything starts, rather than when connecting.
            "jetstream" if !cfg!(feature = "jetstream") => {
                return Err(ConfigError::new(
                    "backend.kind",
                    format!("\"jetstream\": {}", weir_backend::NO_JETSTREAM),
                ))
            }
            "jetstream" => {}
            other => {
                return Err(ConfigError::one_of(
                    "backend.kind",
                    &["embedded", "jetstream"],
                    other,
                ))
            }
        }
        let mut js = self.jetstream.clone().unwrap_or_default();
        if let Some(servers) = &flags.nats_servers {
            js.servers = servers
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
        }
        if let Some(stream) = &flags.nats_stream {
            js.stream = stream.clone();
            js.subject_prefix = format!("{stream}.q");
        }
        js.validate()
            .map_err(|e| e.in_section("backend.jetstream"))?;
        for (section, q) in queues {
            check_queue_on_jetstream(q).map_err(|e| e.in_section(&section))?;
        }
        Ok(BackendSettings::JetStream(Box::new(js)))
    }

    /// Queue settings of the engine's files that a JetStream backend ignores (the
    /// cluster's own settings decide them), for the start to log.
    pub fn ignored<'a>(
        &self,
        flags: &Overrides,
        queues: impl Iterator<Item = (String, &'a QueueSection)>,
    ) -> Vec<&'static str> {
        if self.kind(flags) != Some("jetstream") {
            return Vec::new();
        }
        let mut ignored = Vec::new();
        for (_, q) in queues {
            for (key, set) in [
                ("durability", q.durability.is_some()),
                ("sync_interval_ms", q.sync_interval_ms.is_some()),
                ("segment_size_bytes", q.segment_size_bytes.is_some()),
            ] {
                if set && !ignored.contains(&key) {
                    ignored.push(key);
                }
            }
        }
        ignored
    }
}

/// What the JetStream backend refuses of a queue section: settings it would silently
/// ignore where ignoring them could lose or keep items the user did not expect.
fn check_queue_on_jetstream(q: &QueueSection) -> Result<(), ConfigError> {
    if q.expire_to.is_some() {
        return Err(ConfigError::new(
            "expire_to",
            "is not supported on the jetstream backend (the servers delete expired items themselves)",
        ));
    }
    let limits = [
        ("items_max", q.items_max.is_some()),
        ("bytes_max", q.bytes_max.is_some()),
        ("discard_old_when_full", q.discard_old_when_full.is_some()),
    ];
    if let Some((key, _)) = limits.iter().find(|(_, set)| *set) {
        return Err(ConfigError::new(
            *key,
            "is not supported on the jetstream backend; set limits on the stream (items_max, bytes_max and discard_old_when_full are the engine's)",
        ));
    }
    Ok(())
}
