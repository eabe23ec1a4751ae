//! The backend's handles: [`JetStream`] (one per instance, its connection to the
//! cluster), [`Queue`] and [`Reader`] (cheap clones of entries of `registry.rs`). What
//! they hold is here; what they do is in `mod.rs` and the files it names, so that
//! those files (`setup.rs` making a [`JetStream`], `reader.rs` taking from a
//! [`Reader`], ...) reach the handles without reaching the module that composes them.

use std::sync::{Arc, Mutex, PoisonError};

use super::connect::OwnedRuntime;
use super::inner::Inner;
use super::registry::{QueueEntry, ReaderEntry};

/// A connection to the cluster, shared by every connection of the instance.
pub struct JetStream {
    pub(super) inner: Arc<Inner>,
    pub(super) runtime: Mutex<OwnedRuntime>,
    pub(super) nak_pump: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// A handle on one queue: cheap to clone.
#[derive(Clone)]
pub struct Queue {
    pub(super) entry: Arc<QueueEntry>,
    pub(super) inner: Arc<Inner>,
}

/// A handle on one reader of a queue: cheap to clone.
#[derive(Clone)]
pub struct Reader {
    pub(super) queue: Arc<QueueEntry>,
    pub(super) entry: Arc<ReaderEntry>,
    pub(super) inner: Arc<Inner>,
}

impl Drop for JetStream {
    fn drop(&mut self) {
        self.runtime
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .shutdown();
    }
}
