//! Counters and gauges of a queue and its readers, as `stats` and `/metrics` show
//! them: defined in `weir-types`, which every backend shares.

pub use weir_types::{QueueStats, ReaderStats};
