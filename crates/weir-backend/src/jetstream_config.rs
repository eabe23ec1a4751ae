//! `[backend.jetstream]`: where the cluster is and how weir lays its queues out on it.
//!
//! Plain settings, outside the `jetstream` module: a build without the cargo feature
//! `jetstream` still reads a config file that names the cluster, to refuse it with a
//! clear error rather than an unknown-field one.

use serde::Deserialize;

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
    pub max_consumers: u32,
    /// How long a lease stays open when its front door stops renewing it (the
    /// consumers' AckWait), for queues without `open_timeout_ms`. While the door
    /// holds the lease it renews it every third of this. Long (30 s, as NATS's own
    /// default AckWait), so that a lease outlives a consumer leader election (4 to 9 s,
    /// during which renewals cannot reach it); the leases of a killed door come back
    /// sooner than this, given back by the other doors (`door_timeout_ms`).
    pub lease_timeout_ms: u64,
    /// How long a front door may stay silent (its ping subscription gone from the
    /// cluster) before the other doors take it for dead and give its open leases back
    /// at once, rather than after `lease_timeout_ms`. 0 turns this off. Keep it well
    /// under half of `lease_timeout_ms`, or the leases come back after AckWait anyway.
    pub door_timeout_ms: u64,
    /// Open leases per reader, all front doors together.
    pub max_ack_pending: i64,
    /// Blocked `get …/t=` per reader, all front doors together.
    pub max_waiting: i64,
    /// One JetStream API call.
    pub request_timeout_ms: u64,
    /// How long a `set` (or an ack) retries through a leader election before
    /// answering that the backend is unavailable.
    pub unavailable_retry_ms: u64,
    /// How long `stats` and `/metrics` reuse one snapshot of the cluster's figures.
    pub stats_cache_ms: u64,
    /// How often a door removes from the stream what every reader of the queues it
    /// confirmed on has confirmed (see `sweep.rs`); 0 never does (the stream then
    /// grows until something else purges it).
    pub sweep_ms: u64,
    /// The client pings a silent server after this long, and leaves it after three
    /// pings go unanswered (see `connect.rs`).
    pub ping_interval_ms: u64,
    /// The door reconnects (to another server) when no request has been answered for
    /// this long while some failed; 0 never does.
    pub failover_ms: u64,
    /// The size cap of the doors' stream (`<stream>_DOORS`: registrations and lease
    /// records, about 150 bytes an open lease). nats-server reserves it in memory on
    /// each of the stream's replicas, for as long as the stream exists.
    pub doors_stream_bytes: u64,
}

/// The least `doors_stream_bytes`: a few thousand open leases.
pub const DOORS_STREAM_BYTES_MIN: u64 = 1 << 20;

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
            max_consumers: 10_000,
            lease_timeout_ms: 30_000,
            door_timeout_ms: 1_000,
            max_ack_pending: 20_000,
            max_waiting: 4_096,
            request_timeout_ms: 5_000,
            unavailable_retry_ms: 10_000,
            stats_cache_ms: 1_000,
            sweep_ms: 1_000,
            ping_interval_ms: 2_000,
            failover_ms: 5_000,
            // About 55,000 open leases of all doors together. It was 64 MiB: 14
            // stream names used a test cluster's 1 GB of memory up.
            doors_stream_bytes: 8 << 20,
        }
    }
}
