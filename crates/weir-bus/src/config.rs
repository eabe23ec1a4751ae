//! The `[bus]` section of weir's config file: where the bus listens, its root key,
//! what callbacks it may call, its limits and its delivery policy. Every field has a
//! default (the constants below, documented in `docs/bus.md`); `validate` refuses
//! values that cannot work, with the field's name in the message.

use std::time::Duration;

use serde::Deserialize;
use weir_backend::ConfigError;

pub const LISTEN_DEFAULT: &str = "127.0.0.1:22135";
pub const PUBLISH_BYTES_MAX_DEFAULT: usize = 64 * 1024;
/// How deep an event's `data` may nest (`[[1]]` is 2): well within what common
/// receivers parse (routemaster-drain's Ruby `JSON.parse` stops past 100, Rust's
/// `serde_json` past 128) once a batch wraps it in two more levels, a dead-letter
/// listing in three.
pub const DATA_DEPTH_MAX_DEFAULT: usize = 64;
/// The deepest `data_depth_max` that may be configured: 98 levels in a batch, 99 in
/// a dead-letter listing, still within Ruby's 100.
pub const DATA_DEPTH_MAX_MAX: usize = 96;
pub const TOPICS_MAX_DEFAULT: usize = 1_000;
pub const SUBSCRIBERS_MAX_DEFAULT: usize = 200;
pub const TOKENS_MAX_DEFAULT: usize = 10_000;
pub const BATCH_EVENTS_MAX_DEFAULT: u64 = 10_000;
/// A batch stops growing once its events hold this many bytes (one event always goes).
pub const BATCH_BYTES_MAX_DEFAULT: usize = 4 * 1024 * 1024;
pub const DELIVERIES_IN_FLIGHT_MAX_DEFAULT: usize = 256;
pub const CONNECTIONS_MAX_DEFAULT: usize = 1_024;
pub const HEADER_TIMEOUT_MS_DEFAULT: u64 = 10_000;
pub const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 2_000;
pub const DELIVERY_TIMEOUT_MS_DEFAULT: u64 = 20_000;
pub const RETRY_INITIAL_MS_DEFAULT: u64 = 1_000;
pub const RETRY_MAX_MS_DEFAULT: u64 = 600_000;
pub const ATTEMPTS_MAX_DEFAULT: u32 = 20;
pub const SECRET_OVERLAP_MS_DEFAULT: u64 = 24 * 3600 * 1000;
pub const RETENTION_MS_DEFAULT: u64 = 0;
/// On JetStream: how long the instance serving the bus may go silent before one standing
/// by takes over (`owner.rs`).
pub const TAKEOVER_MS_DEFAULT: u64 = 10_000;
/// `GET /pulse/scaling` answers a second late once this many events wait for
/// subscribers (routemaster's `ROUTEMASTER_SCALING_THRESHOLD`).
pub const SCALING_THRESHOLD_DEFAULT: u64 = 1_000;
/// The shortest `takeover_ms`: the serving instance writes its hold every fifth of it,
/// and one write may take a JetStream leader election (a few seconds) to go through.
pub const TAKEOVER_MS_MIN: u64 = 1_000;
/// The longest retry pause that may be configured: a day.
pub const RETRY_MAX_MS_MAX: u64 = 86_400_000;
/// A subscriber's batch is at most this many events, whatever `batch_events_max` says:
/// the batch's leases and body are held in memory while it is delivered.
pub const BATCH_EVENTS_MAX_MAX: u64 = 100_000;
/// The readers of a topic queue: one per subscriber, plus the retention reader.
pub const SUBSCRIBERS_MAX_MAX: usize = weir_backend::READERS_PER_QUEUE_MAX - 1;

/// The `[bus]` section, as written in the file (every field optional).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BusConfig {
    /// Address of the bus's HTTP port.
    pub listen: Option<String>,
    /// The key that manages API tokens (`WEIR_BUS_ROOT_KEY` or `ROUTEMASTER_ROOT_KEY`
    /// in the environment when absent here).
    pub root_key: Option<String>,
    /// Callbacks may use plain `http` (otherwise `https` only).
    pub allow_http: Option<bool>,
    /// Callbacks may resolve to loopback, private, link-local or other non-public
    /// addresses (otherwise refused, when subscribing and at each connection).
    pub allow_private_networks: Option<bool>,
    pub publish_bytes_max: Option<usize>,
    /// How deep a published event's `data` may nest; deeper is refused with 400.
    pub data_depth_max: Option<usize>,
    pub topics_max: Option<usize>,
    pub subscribers_max: Option<usize>,
    pub tokens_max: Option<usize>,
    pub batch_events_max: Option<u64>,
    /// A batch is sent once its events hold this many bytes, whatever `max` says: it
    /// bounds a worker's memory (one batch is held while it is delivered).
    pub batch_bytes_max: Option<usize>,
    pub deliveries_in_flight_max: Option<usize>,
    pub connections_max: Option<usize>,
    pub header_timeout_ms: Option<u64>,
    pub connect_timeout_ms: Option<u64>,
    pub delivery_timeout_ms: Option<u64>,
    pub retry_initial_ms: Option<u64>,
    #[serde(alias = "retry_max_ms")]
    pub retry_ms_max: Option<u64>,
    pub attempts_max: Option<u32>,
    pub secret_overlap_ms: Option<u64>,
    /// Events stay on disk at least this long after they were published, delivered
    /// or not, so that a subscriber can be moved back to them (replay).
    pub retention_ms: Option<u64>,
    /// On JetStream, where one instance serves the bus and the others stand by: how
    /// long the serving instance may go silent before another takes over.
    pub takeover_ms: Option<u64>,
    /// Events waiting for subscribers at which `GET /pulse/scaling` answers a second
    /// late, the signal HireFire's response-time scaling reads.
    pub scaling_threshold: Option<u64>,
    /// Threads of the bus's own runtime (default: the CPU count).
    pub threads: Option<usize>,
}

/// The bus's settings with every default applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BusSettings {
    pub listen: String,
    pub root_key: Option<String>,
    pub allow_http: bool,
    pub allow_private_networks: bool,
    pub publish_bytes_max: usize,
    pub data_depth_max: usize,
    pub topics_max: usize,
    pub subscribers_max: usize,
    pub tokens_max: usize,
    pub batch_events_max: u64,
    pub batch_bytes_max: usize,
    pub deliveries_in_flight_max: usize,
    pub connections_max: usize,
    pub header_timeout: Duration,
    pub connect_timeout: Duration,
    pub delivery_timeout: Duration,
    pub retry_initial: Duration,
    pub retry_max: Duration,
    pub attempts_max: u32,
    pub secret_overlap: Duration,
    pub retention: Duration,
    pub takeover: Duration,
    pub scaling_threshold: u64,
    pub threads: usize,
}

impl BusConfig {
    /// Applies the defaults and checks the values; `listen` overrides the file's
    /// address (the `--bus-listen` flag), `env_root_key` is the key from the
    /// environment.
    pub fn resolve(
        &self,
        listen: Option<&str>,
        env_root_key: Option<String>,
    ) -> Result<BusSettings, ConfigError> {
        let ms = Duration::from_millis;
        let s = BusSettings {
            listen: listen
                .map(str::to_string)
                .or_else(|| self.listen.clone())
                .unwrap_or_else(|| LISTEN_DEFAULT.to_string()),
            // The environment wins over the file, as for every secret weir reads
            // (docs/configuration.md, "Secrets").
            root_key: env_root_key.or_else(|| self.root_key.clone()),
            allow_http: self.allow_http.unwrap_or(false),
            allow_private_networks: self.allow_private_networks.unwrap_or(false),
            publish_bytes_max: self.publish_bytes_max.unwrap_or(PUBLISH_BYTES_MAX_DEFAULT),
            data_depth_max: self.data_depth_max.unwrap_or(DATA_DEPTH_MAX_DEFAULT),
            topics_max: self.topics_max.unwrap_or(TOPICS_MAX_DEFAULT),
            subscribers_max: self.subscribers_max.unwrap_or(SUBSCRIBERS_MAX_DEFAULT),
            tokens_max: self.tokens_max.unwrap_or(TOKENS_MAX_DEFAULT),
            batch_events_max: self.batch_events_max.unwrap_or(BATCH_EVENTS_MAX_DEFAULT),
            batch_bytes_max: self.batch_bytes_max.unwrap_or(BATCH_BYTES_MAX_DEFAULT),
            deliveries_in_flight_max: self
                .deliveries_in_flight_max
                .unwrap_or(DELIVERIES_IN_FLIGHT_MAX_DEFAULT),
            connections_max: self.connections_max.unwrap_or(CONNECTIONS_MAX_DEFAULT),
            header_timeout: ms(self.header_timeout_ms.unwrap_or(HEADER_TIMEOUT_MS_DEFAULT)),
            connect_timeout: ms(self
                .connect_timeout_ms
                .unwrap_or(CONNECT_TIMEOUT_MS_DEFAULT)),
            delivery_timeout: ms(self
                .delivery_timeout_ms
                .unwrap_or(DELIVERY_TIMEOUT_MS_DEFAULT)),
            retry_initial: ms(self.retry_initial_ms.unwrap_or(RETRY_INITIAL_MS_DEFAULT)),
            retry_max: ms(self.retry_ms_max.unwrap_or(RETRY_MAX_MS_DEFAULT)),
            attempts_max: self.attempts_max.unwrap_or(ATTEMPTS_MAX_DEFAULT),
            secret_overlap: ms(self.secret_overlap_ms.unwrap_or(SECRET_OVERLAP_MS_DEFAULT)),
            retention: ms(self.retention_ms.unwrap_or(RETENTION_MS_DEFAULT)),
            takeover: ms(self.takeover_ms.unwrap_or(TAKEOVER_MS_DEFAULT)),
            scaling_threshold: self.scaling_threshold.unwrap_or(SCALING_THRESHOLD_DEFAULT),
            threads: self
                .threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())),
        };
        s.validate()?;
        Ok(s)
    }
}

impl BusSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        self.check_values().map_err(|e| e.in_section("bus"))
    }

    fn check_values(&self) -> Result<(), ConfigError> {
        self.check_positive()?;
        self.check_bounds()
    }

    /// The counts and durations that must be at least 1.
    fn check_positive(&self) -> Result<(), ConfigError> {
        let positive = [
            ("publish_bytes_max", self.publish_bytes_max as u64),
            ("data_depth_max", self.data_depth_max as u64),
            ("topics_max", self.topics_max as u64),
            ("subscribers_max", self.subscribers_max as u64),
            ("tokens_max", self.tokens_max as u64),
            ("batch_events_max", self.batch_events_max),
            ("batch_bytes_max", self.batch_bytes_max as u64),
            (
                "deliveries_in_flight_max",
                self.deliveries_in_flight_max as u64,
            ),
            ("connections_max", self.connections_max as u64),
            ("attempts_max", u64::from(self.attempts_max)),
            ("threads", self.threads as u64),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(ConfigError::at_least(name, 1));
            }
        }
        let durations = [
            ("header_timeout_ms", self.header_timeout),
            ("connect_timeout_ms", self.connect_timeout),
            ("delivery_timeout_ms", self.delivery_timeout),
            ("retry_initial_ms", self.retry_initial),
        ];
        for (name, value) in durations {
            if value.is_zero() {
                return Err(ConfigError::at_least(name, 1));
            }
        }
        Ok(())
    }

    /// Upper bounds, relations between keys, and the root key's form.
    fn check_bounds(&self) -> Result<(), ConfigError> {
        if self.subscribers_max > SUBSCRIBERS_MAX_MAX {
            return Err(ConfigError::new(
                "subscribers_max",
                format!("is at most {SUBSCRIBERS_MAX_MAX} (readers per topic queue)"),
            ));
        }
        if self.data_depth_max > DATA_DEPTH_MAX_MAX {
            return Err(ConfigError::new(
                "data_depth_max",
                format!("is at most {DATA_DEPTH_MAX_MAX} (receivers refuse deeper JSON)"),
            ));
        }
        if self.batch_events_max > BATCH_EVENTS_MAX_MAX {
            return Err(ConfigError::new(
                "batch_events_max",
                format!("is at most {BATCH_EVENTS_MAX_MAX}"),
            ));
        }
        if self.retry_max > Duration::from_millis(RETRY_MAX_MS_MAX) {
            return Err(ConfigError::new(
                "retry_ms_max",
                format!("is at most {RETRY_MAX_MS_MAX} (a day)"),
            ));
        }
        if self.takeover < Duration::from_millis(TAKEOVER_MS_MIN) {
            return Err(ConfigError::at_least("takeover_ms", TAKEOVER_MS_MIN));
        }
        if self.retry_initial > self.retry_max {
            return Err(ConfigError::new(
                "retry_initial_ms",
                "must not exceed bus.retry_ms_max",
            ));
        }
        if self.root_key.as_ref().is_some_and(|k| k.len() < 8) {
            return Err(ConfigError::new(
                "root_key",
                "must be at least 8 characters",
            ));
        }
        if self.root_key.as_ref().is_some_and(|k| k.contains(':')) {
            return Err(ConfigError::new(
                "root_key",
                "cannot contain `:` (it is the user of HTTP Basic)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_resolve_and_bad_values_are_refused_by_name() {
        let s = BusConfig::default().resolve(None, None).unwrap();
        assert_eq!(s.listen, LISTEN_DEFAULT);
        assert!(!s.allow_http && !s.allow_private_networks);
        let s = BusConfig::default()
            .resolve(Some("127.0.0.1:0"), Some("k".repeat(8)))
            .unwrap();
        assert_eq!(s.listen, "127.0.0.1:0");
        assert!(s.root_key.is_some());
        let bad = |c: BusConfig, text: &str| {
            let e = c.resolve(None, None).unwrap_err();
            assert!(e.key().starts_with("bus."), "{e}");
            assert!(e.to_string().contains(text), "{e}");
        };
        bad(
            BusConfig {
                attempts_max: Some(0),
                ..BusConfig::default()
            },
            "attempts_max",
        );
        bad(
            BusConfig {
                subscribers_max: Some(1_000),
                ..BusConfig::default()
            },
            "subscribers_max",
        );
        bad(
            BusConfig {
                retry_initial_ms: Some(10),
                retry_ms_max: Some(5),
                ..BusConfig::default()
            },
            "retry_initial_ms",
        );
        bad(
            BusConfig {
                root_key: Some("short".into()),
                ..BusConfig::default()
            },
            "root_key",
        );
        bad(
            BusConfig {
                root_key: Some("long:enough:key".into()),
                ..BusConfig::default()
            },
            "`:`",
        );
        bad(
            BusConfig {
                delivery_timeout_ms: Some(0),
                ..BusConfig::default()
            },
            "delivery_timeout_ms",
        );
        bad(
            BusConfig {
                data_depth_max: Some(97),
                ..BusConfig::default()
            },
            "data_depth_max is at most 96",
        );
        bad(
            BusConfig {
                data_depth_max: Some(0),
                ..BusConfig::default()
            },
            "data_depth_max must be at least 1",
        );
    }

    #[test]
    fn the_root_key_from_the_environment_wins_over_the_files() {
        let file = BusConfig {
            root_key: Some("from-the-file".into()),
            ..BusConfig::default()
        };
        let s = file.resolve(None, Some("from-the-env".into())).unwrap();
        assert_eq!(s.root_key.as_deref(), Some("from-the-env"));
        let s = file.resolve(None, None).unwrap();
        assert_eq!(s.root_key.as_deref(), Some("from-the-file"));
    }
}
