//! The one error every config section answers when a value cannot be used: which key,
//! named as it is written in the file with its section (`bus.retry_ms_max`,
//! `queues."jobs*".durability`), and what is wrong with it. One type for the
//! `[server]`, `[defaults]`, `[queues]`, `[backend]`, `[bus]` and `[proxy]` sections,
//! so the root reports every mistake the same way and a test can ask which key was
//! refused instead of matching text.

use std::fmt;

/// A config value refused, with the key it was given under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    key: String,
    problem: String,
}

impl ConfigError {
    /// `key` as the file names it; `problem` reads after it ("must be at least 1").
    pub fn new(key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
        ConfigError {
            key: key.into(),
            problem: problem.into(),
        }
    }

    /// The key must be at least `least`.
    pub fn at_least(key: impl Into<String>, least: impl fmt::Display) -> ConfigError {
        ConfigError::new(key, format!("must be at least {least}"))
    }

    /// The key must be in `least..=most`.
    pub fn range(
        key: impl Into<String>,
        least: impl fmt::Display,
        most: impl fmt::Display,
    ) -> ConfigError {
        ConfigError::new(key, format!("must be {least} to {most}"))
    }

    /// The key must be one of `allowed`; it was `got`.
    pub fn one_of(key: impl Into<String>, allowed: &[&str], got: &str) -> ConfigError {
        let allowed: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
        ConfigError::new(
            key,
            format!("must be {}, not {got:?}", allowed.join(" or ")),
        )
    }

    /// The same problem under a key with `section` in front (`bus` makes
    /// `threads` into `bus.threads`).
    pub fn in_section(self, section: &str) -> ConfigError {
        ConfigError {
            key: format!("{section}.{}", self.key),
            problem: self.problem,
        }
    }

    /// The key, as the file names it.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// What is wrong with its value.
    pub fn problem(&self) -> &str {
        &self.problem
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.key, self.problem)
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_key_then_the_problem() {
        let e = ConfigError::at_least("threads", 1).in_section("bus");
        assert_eq!(e.key(), "bus.threads");
        assert_eq!(e.to_string(), "bus.threads must be at least 1");
        let e = ConfigError::one_of("flush_all_reply", &["ok", "kestrel"], "yes");
        assert_eq!(
            e.to_string(),
            "flush_all_reply must be \"ok\" or \"kestrel\", not \"yes\""
        );
        assert_eq!(
            ConfigError::range("replicas", 1, 5).problem(),
            "must be 1 to 5"
        );
    }
}
