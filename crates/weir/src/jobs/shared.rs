//! What the work-queue features share across a store's handles: the job id counter
//! (opened at the first put) and, per tube, the priority lanes known to exist. The
//! store holds it (`StoreInner::jobs`), so every [`Jobs`](super::Jobs) handle of one
//! store sees the same; it imports nothing of the store, which imports it.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::wheel::Bucket;

use parking_lot::Mutex;

use super::ids::JobIds;

#[derive(Default)]
pub(crate) struct JobsShared {
    ids: Mutex<Option<Arc<JobIds>>>,
    tubes: Mutex<HashMap<String, Arc<TubeLanes>>>,
}

/// One tube's lanes, as far as this process knows them.
pub(crate) struct TubeLanes {
    /// The priorities with a lane of their own (not the tube's default priority,
    /// whose lane is the tube's queue itself); `None` until read from the store.
    pub priorities: Mutex<Option<BTreeSet<u32>>>,
    /// Jobs put since the store opened (beanstalkd's `total-jobs`).
    pub put: AtomicU64,
    /// Signalled after every append into one of the tube's lanes, for reserves
    /// waiting on lanes made after they began to wait.
    pub appended: Arc<tokio::sync::Notify>,
    /// The delay wheel's buckets that have a lane, by when they ripen; `None` until
    /// read from the store. At most `wheel::LEVELS` x 65 of them.
    pub buckets: Mutex<Option<BTreeSet<(u64, Bucket)>>>,
    /// When the first bucket ripens (Unix ms; `u64::MAX`: none), read without a lock
    /// on every reserve.
    pub next_ripe_ms: AtomicU64,
    /// Held while a delayed job goes into a bucket and while buckets are emptied
    /// and removed, so that no job lands in a bucket's lane as it is deleted; and by
    /// kicks, so that two never move one job.
    pub wheel: Mutex<()>,
    /// Held while a job goes into a priority lane and while empty priority lanes are
    /// removed to make room, so that no job lands in a lane as it is deleted.
    pub lanes: Mutex<()>,
}

impl Default for TubeLanes {
    fn default() -> Self {
        TubeLanes {
            priorities: Mutex::default(),
            put: AtomicU64::default(),
            appended: Arc::default(),
            buckets: Mutex::default(),
            next_ripe_ms: AtomicU64::new(u64::MAX),
            wheel: Mutex::default(),
            lanes: Mutex::default(),
        }
    }
}

impl JobsShared {
    /// The id counter, opened at its first use.
    pub fn ids(&self, dir: &Path) -> std::io::Result<Arc<JobIds>> {
        let mut ids = self.ids.lock();
        if let Some(ids) = ids.as_ref() {
            return Ok(Arc::clone(ids));
        }
        let opened = Arc::new(JobIds::open(dir)?);
        *ids = Some(Arc::clone(&opened));
        Ok(opened)
    }

    /// The counter, when it was opened already (no file read): for a caller on an
    /// event loop.
    pub fn ids_if_open(&self) -> Option<Arc<JobIds>> {
        self.ids.lock().as_ref().map(Arc::clone)
    }

    /// The lanes of `tube`, made on first use. Bounded by the store's queues: a tube
    /// is a queue.
    pub fn tube(&self, tube: &str) -> Arc<TubeLanes> {
        Arc::clone(self.tubes.lock().entry(tube.to_string()).or_default())
    }
}
