//! The wall clock as every backend reads it: Unix milliseconds.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in Unix milliseconds (0 before 1970, which a clock set that wrong gives).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
