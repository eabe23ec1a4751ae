//! # weir-types: the vocabulary weir's front doors and backends share
//!
//! An item and the options of an append, what a take does and returns, a queue's and
//! a reader's stats, a reader's open leases as listed, the rule for queue and reader
//! names, the rule of expiry, the queue names reserved for a front door, the limits
//! both backends enforce alike and the wall clock in Unix milliseconds, and the error
//! a config value is refused with. They live here, not in the engine, because
//! the JetStream backend and every front door use them too: one definition, one
//! encoding (an item's `expires_at_ms` of 0 is never, on every backend), one rule.
//! The engine (`weir`) and the backend interface (`weir_backend`) re-export them, so
//! a library user names them from either.
//!
//! No I/O, no async, one dependency (`bytes`, for payloads).

#![forbid(unsafe_code)]

mod clock;
mod config_error;
mod expiry;
mod item;
mod limits;
mod names;
mod pending;
mod reserved;
mod stats;

pub use clock::now_ms;
pub use config_error::ConfigError;
pub use expiry::{expiry_ms, NEVER};
pub use item::{AppendOptions, Item, JobMeta, Lease, LeaseId, TakeMode, Taken};
pub use limits::{CREATIONS_AT_ONCE, READERS_PER_QUEUE_MAX, REDRIVE_PER_CALL_MAX};
pub use names::{validate_queue_name, validate_reader_name, InvalidName, NAME_LENGTH_MAX};
pub use pending::{PendingLease, PENDING_LIST_MAX};
pub use reserved::{
    is_reserved, BUS_DEAD_PREFIX, BUS_PREFIX, BUS_TOPIC_PREFIX, LANE_PREFIX, PROXY_CAPTURE_PREFIX,
};
pub use stats::{QueueStats, ReaderStats};
