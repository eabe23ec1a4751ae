//! The `[beanstalk]` section of weir's config file and what the door runs with.
//!
//! The door runs when the section is present or `--beanstalk-listen` is given. Every
//! key has a default (the constants below, listed in `docs/configuration.md`);
//! [`BeanstalkConfig::resolve`] refuses values that cannot work with a
//! [`ConfigError`] naming the key (`beanstalk.connections_max`).

use std::time::Duration;

use serde::Deserialize;
use weir_backend::ConfigError;

use crate::parse::{
    ParseLimits, JOB_BYTES_MAX_DEFAULT, LINE_BYTES_MAX_DEFAULT, TUBE_BYTES_MAX_DEFAULT,
};

/// beanstalkd's port.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:11300";
pub const CONNECTIONS_MAX_DEFAULT: usize = 1_024;
/// Jobs one connection may hold reserved at once.
pub const RESERVED_MAX_DEFAULT: usize = 1_024;
/// Tubes one connection may watch at once.
pub const WATCHED_MAX_DEFAULT: usize = 64;
/// From the first byte of a request to its last.
pub const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// How long a stop waits for connections to end.
pub const SHUTDOWN_GRACE_MS_DEFAULT: u64 = 5_000;
/// The longest line beanstalkd reads is fixed (224 bytes); a larger limit is allowed
/// up to this.
pub const LINE_BYTES_MAX_MAX: usize = 64 * 1024;
/// The largest job body that may be configured (beanstalkd's own cap, `JOB_DATA_SIZE_LIMIT_MAX`).
pub const JOB_BYTES_MAX_MAX: u32 = 1_073_741_824;

/// The `[beanstalk]` section as written (every key optional).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BeanstalkConfig {
    pub listen: Option<String>,
    pub connections_max: Option<usize>,
    pub reserved_max: Option<usize>,
    pub watched_max: Option<usize>,
    pub line_bytes_max: Option<usize>,
    pub job_bytes_max: Option<u32>,
    pub request_timeout_ms: Option<u64>,
    pub shutdown_grace_ms: Option<u64>,
}

/// What the door runs with, every default applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BeanstalkSettings {
    pub listen: String,
    /// Connections open at once; one more is closed at once.
    pub connections_max: usize,
    /// Jobs one connection may hold reserved; a reserve past it is `OUT_OF_MEMORY`.
    pub reserved_max: usize,
    /// Tubes one connection may watch; a watch past it is `OUT_OF_MEMORY`.
    pub watched_max: usize,
    pub parse: ParseLimits,
    pub request_timeout: Duration,
    pub shutdown_grace: Duration,
}

impl Default for BeanstalkSettings {
    fn default() -> Self {
        BeanstalkSettings {
            listen: LISTEN_DEFAULT.to_owned(),
            connections_max: CONNECTIONS_MAX_DEFAULT,
            reserved_max: RESERVED_MAX_DEFAULT,
            watched_max: WATCHED_MAX_DEFAULT,
            parse: ParseLimits::default(),
            request_timeout: Duration::from_millis(REQUEST_TIMEOUT_MS_DEFAULT),
            shutdown_grace: Duration::from_millis(SHUTDOWN_GRACE_MS_DEFAULT),
        }
    }
}

impl BeanstalkConfig {
    /// Applies the defaults and checks the values; `listen` (the
    /// `--beanstalk-listen` flag) wins over the file's address.
    pub fn resolve(&self, listen: Option<&str>) -> Result<BeanstalkSettings, ConfigError> {
        self.check().map_err(|e| e.in_section("beanstalk"))?;
        let ms = Duration::from_millis;
        Ok(BeanstalkSettings {
            listen: listen
                .map(str::to_owned)
                .or_else(|| self.listen.clone())
                .unwrap_or_else(|| LISTEN_DEFAULT.to_owned()),
            connections_max: self.connections_max.unwrap_or(CONNECTIONS_MAX_DEFAULT),
            reserved_max: self.reserved_max.unwrap_or(RESERVED_MAX_DEFAULT),
            watched_max: self.watched_max.unwrap_or(WATCHED_MAX_DEFAULT),
            parse: ParseLimits {
                line_bytes_max: self.line_bytes_max.unwrap_or(LINE_BYTES_MAX_DEFAULT),
                job_bytes_max: self.job_bytes_max.unwrap_or(JOB_BYTES_MAX_DEFAULT),
                tube_bytes_max: TUBE_BYTES_MAX_DEFAULT,
            },
            request_timeout: ms(self
                .request_timeout_ms
                .unwrap_or(REQUEST_TIMEOUT_MS_DEFAULT)),
            shutdown_grace: ms(self.shutdown_grace_ms.unwrap_or(SHUTDOWN_GRACE_MS_DEFAULT)),
        })
    }

    fn check(&self) -> Result<(), ConfigError> {
        let positive = [
            ("connections_max", self.connections_max.map(|v| v as u64)),
            ("reserved_max", self.reserved_max.map(|v| v as u64)),
            ("watched_max", self.watched_max.map(|v| v as u64)),
            ("request_timeout_ms", self.request_timeout_ms),
        ];
        for (key, value) in positive {
            if value == Some(0) {
                return Err(ConfigError::at_least(key, 1));
            }
        }
        if let Some(line) = self.line_bytes_max {
            if !(LINE_BYTES_MAX_DEFAULT..=LINE_BYTES_MAX_MAX).contains(&line) {
                return Err(ConfigError::range(
                    "line_bytes_max",
                    LINE_BYTES_MAX_DEFAULT,
                    LINE_BYTES_MAX_MAX,
                ));
            }
        }
        if let Some(job) = self.job_bytes_max {
            if job > JOB_BYTES_MAX_MAX {
                return Err(ConfigError::range("job_bytes_max", 0, JOB_BYTES_MAX_MAX));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_refusals_name_their_key() {
        let settings = BeanstalkConfig::default().resolve(None);
        assert_eq!(settings, Ok(BeanstalkSettings::default()));
        let flag = BeanstalkConfig::default().resolve(Some("0.0.0.0:1"));
        assert_eq!(flag.map(|s| s.listen), Ok("0.0.0.0:1".to_owned()));
        let zero = BeanstalkConfig {
            reserved_max: Some(0),
            ..BeanstalkConfig::default()
        };
        assert_eq!(
            zero.resolve(None).map_err(|e| e.key().to_owned()),
            Err("beanstalk.reserved_max".to_owned())
        );
        let short = BeanstalkConfig {
            line_bytes_max: Some(10),
            ..BeanstalkConfig::default()
        };
        assert_eq!(
            short.resolve(None).map_err(|e| e.key().to_owned()),
            Err("beanstalk.line_bytes_max".to_owned())
        );
    }
}
