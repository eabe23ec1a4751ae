//! `QueueCore`: one queue's shared parts, the state behind its lock and what is
//! read without it, and [`StoreLink`], the store as a queue sees it.
//!
//! The operations on a queue are `impl QueueCore` blocks in the files named after
//! them (see `mod.rs`); this file holds only the struct, so that they all import it
//! and it imports none of them. A queue reaches its store through [`StoreLink`]
//! (implemented in `store.rs`), not the store's own type: the store holds its
//! queues, and the back-reference as a trait object keeps `store.rs` and the queue's
//! files from importing each other.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Weak};

use parking_lot::{Condvar, Mutex};

use crate::clock::Clock;
use crate::error::Result;
use crate::file_cell::FilesBudget;

use super::state::State;
use super::sync_state::SyncState;

/// What a queue asks of the store that holds it.
pub(crate) trait StoreLink: Send + Sync {
    /// The queue `name`, opened or created (within the store's limits): where
    /// expired items move to (`expire_to`).
    fn queue_for_use(self: Arc<Self>, name: &str) -> Result<Arc<QueueCore>>;
    /// Puts `queue` on the list the store's background thread visits.
    fn activate(&self, queue: Arc<QueueCore>);
    /// Closes idle files when the store's descriptor budget is exceeded.
    fn enforce_files_budget(&self, from_background: bool);
    /// Whether the store has begun shutting down (see `Store::begin_shutdown`).
    fn shutting_down(&self) -> bool;
}

pub(crate) struct QueueCore {
    pub(crate) name: String,
    /// The store's clock (a copy of `State::clock`, read without the lock).
    pub(super) clock: Clock,
    pub(super) dir: PathBuf,
    pub(super) store: Weak<dyn StoreLink>,
    /// This queue, for handing itself to the store's list of active queues.
    pub(super) me: Weak<QueueCore>,
    /// On the store's list of queues its background thread visits (see `tick`).
    pub(super) active: AtomicBool,
    /// The store's descriptor budget (`None` once the store is gone).
    pub(super) budget: Option<Arc<FilesBudget>>,
    pub(super) state: Mutex<State>,
    pub(super) sync: Mutex<SyncState>,
    /// Bumped whenever an item may have become available; blocking (thread) waiters
    /// sleep on `wake_cv` until it moves.
    pub(super) wake_gen: AtomicU64,
    pub(super) wake_lock: Mutex<()>,
    pub(super) wake_cv: Condvar,
    pub(super) blocking_waiters: AtomicU64,
}
