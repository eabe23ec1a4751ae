//! `[backend.jetstream]`: where the cluster is and how weir lays its queues out on it.
//!
//! Plain settings, outside the `jetstream` module: a build without the cargo feature
//! `jetstream` still reads a config file that names the cluster, to refuse it with a
//! clear error rather than an unknown-field one.

use serde::Deserialize;
use weir_types::ConfigError;

/// The JetStream backend's settings; all restart-only.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct JetStreamConfig {
    /// The cluster's client URLs (`nats://host:port`); at least one. Give them all:
    /// the client reconnects to another when one goes down.
    pub servers: Vec<String>,
    /// A NATS credentials file (JWT + NKey).
    pub credentials_file: Option<String>,
    /// User name; the password is read from the environment variable `password_env`.
    pub user: Option<String>,
    pub password_env: Option<String>,
    /// The environment variable holding a token.
    pub token_env: Option<String>,
    /// Replicas of the stream (and so of its consumers), 1 to 5.
    pub replicas: usize,
    /// The stream's name.
    pub stream: String,
    /// Queue `q` is the subject `<subject_prefix>.q`.
    pub subject_prefix: String,
    /// Consumers (queues × readers) the stream may hold. Set on the stream
    /// explicitly: nats-server caps a stream at 1,000 by default.
    #[serde(alias = "max_consumers")]
    pub consumers_max: u32,
    /// How long a lease stays open when its weir instance stops renewing it (the
    /// consumers' AckWait), for queues without `open_timeout_ms`. While the instance
    /// holds the lease it renews it every third of this. Long (30 s, as NATS's own
    /// default AckWait), so that a lease outlives a consumer leader election (4 to 9 s,
    /// during which renewals cannot reach it); the leases of a killed instance come back
    /// sooner than this, given back by the other instances (`instance_timeout_ms`).
    pub lease_timeout_ms: u64,
    /// How long a weir instance may stay silent (its ping subscription gone from the
    /// cluster) before the other instances take it for dead and give its open leases back
    /// at once, rather than after `lease_timeout_ms`. 0 turns this off. Keep it well
    /// under half of `lease_timeout_ms`, or the leases come back after AckWait anyway.
    /// Read from `door_timeout_ms` too, its old name (a weir process in a cluster was
    /// called a "door", a word the product keeps for its protocol front ends).
    #[serde(alias = "door_timeout_ms")]
    pub instance_timeout_ms: u64,
    /// Open leases per reader, all weir instances together (the consumers'
    /// MaxAckPending).
    #[serde(alias = "max_ack_pending")]
    pub ack_pending_max: i64,
    /// Blocked `get …/t=` per reader, all weir instances together (the consumers'
    /// MaxWaiting).
    #[serde(alias = "max_waiting")]
    pub waiting_max: i64,
    /// One JetStream API call.
    pub request_timeout_ms: u64,
    /// How long a `set` (or an ack) retries through a leader election before
    /// answering that the backend is unavailable.
    pub unavailable_retry_ms: u64,
    /// How long `stats` and `/metrics` reuse one snapshot of the cluster's figures.
    pub stats_cache_ms: u64,
    /// How often an instance removes from the stream what every reader of the queues it
    /// confirmed on has confirmed (see `sweep.rs`); 0 never does (the stream then
    /// grows until something else purges it).
    pub sweep_ms: u64,
    /// The client pings a silent server after this long, and leaves it after three
    /// pings go unanswered (see `connect.rs`).
    pub ping_interval_ms: u64,
    /// The instance reconnects (to another server) when no request has been answered for
    /// this long while some failed; 0 never does.
    pub failover_ms: u64,
    /// The size cap of the instances' stream (`<stream>_DOORS`: registrations and lease
    /// records, about 150 bytes an open lease). nats-server reserves it in memory on
    /// each of the stream's replicas, for as long as the stream exists. The key is
    /// `instances_stream_bytes`, read from `doors_stream_bytes` too, its old name.
    #[serde(alias = "doors_stream_bytes")]
    pub instances_stream_bytes: u64,
}

/// The least `instances_stream_bytes`: a few thousand open leases.
pub const INSTANCES_STREAM_BYTES_MIN: u64 = 1 << 20;
/// Replicas of a JetStream stream: what a NATS cluster allows.
pub const REPLICAS_MAX: usize = 5;

impl JetStreamConfig {
    /// Checks what the backend cannot run with; a refused key is named without its
    /// section (the reader of the file adds `backend.jetstream`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.servers.is_empty() {
            return Err(ConfigError::new(
                "servers",
                "needs at least one nats:// URL",
            ));
        }
        if !(1..=REPLICAS_MAX).contains(&self.replicas) {
            return Err(ConfigError::range("replicas", 1, REPLICAS_MAX));
        }
        if self.instances_stream_bytes < INSTANCES_STREAM_BYTES_MIN {
            return Err(ConfigError::at_least(
                "instances_stream_bytes",
                INSTANCES_STREAM_BYTES_MIN,
            ));
        }
        Ok(())
    }
}

impl Default for JetStreamConfig {
    fn default() -> Self {
        JetStreamConfig {
            servers: vec!["nats://127.0.0.1:4222".to_owned()],
            credentials_file: None,
            user: None,
            password_env: None,
            token_env: None,
            replicas: 3,
            stream: "WEIR".to_owned(),
            subject_prefix: "weir.q".to_owned(),
            consumers_max: 10_000,
            lease_timeout_ms: 30_000,
            instance_timeout_ms: 1_000,
            ack_pending_max: 20_000,
            waiting_max: 4_096,
            request_timeout_ms: 5_000,
            unavailable_retry_ms: 10_000,
            stats_cache_ms: 1_000,
            sweep_ms: 1_000,
            ping_interval_ms: 2_000,
            failover_ms: 5_000,
            // About 55,000 open leases of all instances together. It was 64 MiB: 14
            // stream names used a test cluster's 1 GB of memory up.
            instances_stream_bytes: 8 << 20,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde::de::value::{Error as ValueError, MapDeserializer};
    use serde::Deserialize;

    use super::*;

    fn read(pairs: &[(&'static str, u64)]) -> Result<JetStreamConfig, ValueError> {
        JetStreamConfig::deserialize(MapDeserializer::new(pairs.iter().copied()))
    }

    #[test]
    fn reads_the_instance_keys() -> Result<(), ValueError> {
        let config = read(&[
            ("instance_timeout_ms", 250),
            ("instances_stream_bytes", 2 << 20),
        ])?;
        assert_eq!(config.instance_timeout_ms, 250);
        assert_eq!(config.instances_stream_bytes, 2 << 20);
        Ok(())
    }

    /// A config written for an older weir still starts, and says the same.
    #[test]
    fn reads_the_old_door_keys_as_aliases() -> Result<(), ValueError> {
        let config = read(&[("door_timeout_ms", 250), ("doors_stream_bytes", 2 << 20)])?;
        assert_eq!(config.instance_timeout_ms, 250);
        assert_eq!(config.instances_stream_bytes, 2 << 20);
        Ok(())
    }

    #[test]
    fn refuses_a_key_given_under_both_names() {
        let twice = read(&[("door_timeout_ms", 250), ("instance_timeout_ms", 500)]);
        assert!(twice.is_err_and(|e| e.to_string().contains("duplicate field")));
    }
}
