//! `[defaults]` and `[queues."PATTERN"]`: the engine's queue settings. `[defaults]`
//! applies to every queue; a `[queues."PATTERN"]` section to the queues whose names
//! match its glob-like pattern (`*` any run of characters, `?` one character). A
//! queue takes the most specific matching section (an exact name first, then the
//! pattern with the most literal characters, then the first in alphabetical order),
//! with every key it leaves out taken from `[defaults]`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use weir::{Durability, QueueConfig, StoreOptions};
use weir_backend::ConfigError;

/// The smallest segment file: one page.
pub const SEGMENT_SIZE_BYTES_MIN: u64 = 4096;

/// One queue section as written; every key optional. Old names are aliases
/// ([`super::renamed::RENAMED`]).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSection {
    pub durability: Option<String>,
    pub sync_interval_ms: Option<u64>,
    #[serde(alias = "max_items")]
    pub items_max: Option<u64>,
    #[serde(alias = "max_bytes")]
    pub bytes_max: Option<u64>,
    #[serde(alias = "max_item_size_bytes")]
    pub item_size_bytes_max: Option<u64>,
    #[serde(alias = "max_age_ms")]
    pub age_ms_max: Option<u64>,
    pub discard_old_when_full: Option<bool>,
    pub expire_to: Option<String>,
    pub open_timeout_ms: Option<u64>,
    pub deliveries_max: Option<u32>,
    pub dead_letter_to: Option<String>,
    pub priority_default: Option<u32>,
    pub priorities_max: Option<u32>,
    pub segment_size_bytes: Option<u64>,
}

/// The engine's options: `defaults` over the engine's defaults, a function that
/// picks the most specific of `queues` for each queue, and `queues_max` as the
/// store's. `files_open_max` is left at the engine's default: the server derives it
/// at start (see `root::run`).
pub fn store_options(
    defaults: &QueueSection,
    queues: &BTreeMap<String, QueueSection>,
    queues_max: usize,
) -> Result<StoreOptions, ConfigError> {
    let defaults = defaults
        .apply(&QueueConfig::default())
        .map_err(|e| e.in_section("defaults"))?;
    let mut sections = Vec::with_capacity(queues.len());
    for (pattern, section) in queues {
        check_pattern(pattern)?;
        let config = section
            .apply(&defaults)
            .map_err(|e| e.in_section(&format!("queues.{pattern:?}")))?;
        sections.push((pattern.clone(), config));
    }
    // Most specific first: exact names, then more literal characters, then by name.
    sections.sort_by(|(a, _), (b, _)| {
        let exact = |p: &str| !p.contains(['*', '?']);
        let literal = |p: &str| p.chars().filter(|c| *c != '*' && *c != '?').count();
        exact(b)
            .cmp(&exact(a))
            .then(literal(b).cmp(&literal(a)))
            .then(a.cmp(b))
    });
    let reserved_differ = defaults.open_timeout.is_some() || defaults.max_deliveries.is_some();
    let config_for = if sections.is_empty() && !reserved_differ {
        None
    } else {
        let defaults = defaults.clone();
        let f: weir::ConfigFn = Arc::new(move |name: &str| {
            let mut config = sections
                .iter()
                .find(|(pattern, _)| glob_match(pattern.as_bytes(), name.as_bytes()))
                .map(|(_, config)| config.clone())
                .unwrap_or_else(|| defaults.clone());
            // The bus's and the proxy's workers hold a lease while a receiver or a
            // shadow is down, for as long as it takes: a lease timeout would deliver
            // the item twice. Their queues never get one.
            // Nor a delivery limit: their retries are theirs (with dead letters of
            // their own), and a failing receiver must not send their items elsewhere.
            if name.starts_with("bus:") || name.starts_with("proxy:capture:") {
                config.open_timeout = None;
                config.max_deliveries = None;
                config.dead_letter_to = None;
            }
            config
        });
        Some(f)
    };
    Ok(StoreOptions {
        defaults,
        config_for,
        queues_max,
        ..StoreOptions::default()
    })
}

/// The most priority lanes a tube may be given: each is a queue with files of its own.
const PRIORITIES_MAX_MAX: u32 = 1024;

/// A key naming a queue (`expire_to`, `dead_letter_to`): `""` for none.
fn queue_name_or_none(key: &str, v: &str) -> Result<Option<String>, ConfigError> {
    if v.is_empty() {
        return Ok(None);
    }
    weir::validate_queue_name(v).map_err(|e| ConfigError::new(key, e.to_string()))?;
    Ok(Some(v.to_string()))
}

fn check_pattern(pattern: &str) -> Result<(), ConfigError> {
    let key = || format!("queues.{pattern:?}");
    if pattern.is_empty() || pattern.len() > weir::NAME_LENGTH_MAX {
        return Err(ConfigError::new(
            key(),
            format!("the pattern must be 1 to {} bytes", weir::NAME_LENGTH_MAX),
        ));
    }
    if !pattern
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_:-*?".contains(&b))
    {
        return Err(ConfigError::new(
            key(),
            "the pattern may hold only A-Z a-z 0-9 _ : - * ?",
        ));
    }
    Ok(())
}

/// Glob match: `*` any run (empty included), `?` exactly one byte.
pub fn glob_match(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == name[n]) {
            p += 1;
            n += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, n));
            p += 1;
        } else if let Some((sp, sn)) = star {
            p = sp + 1;
            n = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

impl QueueSection {
    /// `base` with the keys this section sets; a refused key is named without its
    /// section (the caller adds it).
    pub fn apply(&self, base: &QueueConfig) -> Result<QueueConfig, ConfigError> {
        let mut c = base.clone();
        c.durability = self.durability(c.durability)?;
        if let Some(v) = self.items_max {
            c.max_items = v;
        }
        if let Some(v) = self.bytes_max {
            c.max_bytes = v;
        }
        if let Some(v) = self.item_size_bytes_max {
            c.max_item_size_bytes = v;
        }
        if let Some(v) = self.age_ms_max {
            c.max_age = (v > 0).then(|| Duration::from_millis(v));
        }
        if let Some(v) = self.discard_old_when_full {
            c.discard_old_when_full = v;
        }
        if let Some(v) = &self.expire_to {
            c.expire_to = queue_name_or_none("expire_to", v)?;
        }
        if let Some(v) = self.open_timeout_ms {
            c.open_timeout = (v > 0).then(|| Duration::from_millis(v));
        }
        if let Some(v) = self.deliveries_max {
            c.max_deliveries = (v > 0).then_some(v);
        }
        if let Some(v) = &self.dead_letter_to {
            c.dead_letter_to = queue_name_or_none("dead_letter_to", v)?;
        }
        if let Some(v) = self.priority_default {
            c.priority_default = v;
        }
        if let Some(v) = self.priorities_max {
            if !(1..=PRIORITIES_MAX_MAX).contains(&v) {
                return Err(ConfigError::new(
                    "priorities_max",
                    format!("must be 1 to {PRIORITIES_MAX_MAX}, not {v}"),
                ));
            }
            c.priorities_max = v;
        }
        if let Some(v) = self.segment_size_bytes {
            if v < SEGMENT_SIZE_BYTES_MIN {
                return Err(ConfigError::at_least(
                    "segment_size_bytes",
                    SEGMENT_SIZE_BYTES_MIN,
                ));
            }
            c.segment_size_bytes = v;
        }
        Ok(c)
    }

    /// `durability` and `sync_interval_ms` over `base`'s durability.
    fn durability(&self, base: Durability) -> Result<Durability, ConfigError> {
        let interval = match self.sync_interval_ms {
            Some(0) => return Err(ConfigError::at_least("sync_interval_ms", 1)),
            Some(ms) => Some(Duration::from_millis(ms)),
            None => None,
        };
        Ok(match self.durability.as_deref() {
            None => match (interval, base) {
                (Some(interval), Durability::Periodic(_)) => Durability::Periodic(interval),
                _ => base,
            },
            Some("buffered") => Durability::Buffered,
            Some("periodic") => {
                let previous = match base {
                    Durability::Periodic(i) => i,
                    _ => Durability::PERIODIC_INTERVAL_DEFAULT,
                };
                Durability::Periodic(interval.unwrap_or(previous))
            }
            Some("synced") => Durability::Synced,
            Some(other) => {
                return Err(ConfigError::one_of(
                    "durability",
                    &["buffered", "periodic", "synced"],
                    other,
                ))
            }
        })
    }
}
