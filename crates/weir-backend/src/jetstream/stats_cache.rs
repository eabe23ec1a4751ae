//! The `stats` snapshot an instance keeps (`stats.rs` makes it), and whether a
//! change of this instance made it stale. A leaf of its own: every handle that
//! changes something marks it, and the backend's shared state holds it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::time::Instant;
use weir_types::QueueStats;

/// The last snapshot, and whether a change made it stale.
#[derive(Default)]
pub(crate) struct Cache {
    pub(super) snapshot: tokio::sync::Mutex<Option<(Instant, Arc<Vec<QueueStats>>)>>,
    pub(super) stale: AtomicBool,
}

impl Cache {
    /// This instance changed something (`delete`, `flush`): the next `stats` asks again.
    pub fn invalidate(&self) {
        self.stale.store(true, Ordering::Release);
    }
}
