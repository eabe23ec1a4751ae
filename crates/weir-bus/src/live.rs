//! Topics and subscribers as they run: what the bus keeps of each beside the
//! metadata (a topic's queue and wake-ups; a subscriber's worker's handles).
//!
//! Kept apart from `bus.rs` so that the workers (`worker.rs`), which the bus starts,
//! read them without reaching the bus.

use std::sync::Arc;

use tokio::sync::{watch, Notify};
use weir_backend::Queue;

use crate::counters::SubscriberCounters;
use crate::meta::SubscriberMeta;
use crate::wake::{TopicWake, WakeFlags};

/// A topic as it runs, as the publish path needs it: its queue, its epoch, and the
/// wake-ups of the workers that read it.
pub struct LiveTopic {
    pub queue: Queue,
    pub epoch: u32,
    pub publisher: Option<String>,
    pub wake: Vec<TopicWake>,
}

/// A subscriber as it runs: the handles of its delivery worker (its wake-ups, the
/// config it reads, its counters, its stop signal and its task).
pub struct LiveSubscriber {
    pub notify: Arc<Notify>,
    pub flags: Arc<WakeFlags>,
    pub config: watch::Sender<Arc<SubscriberMeta>>,
    pub counters: Arc<SubscriberCounters>,
    pub stop: watch::Sender<bool>,
    /// The token's owner name, for metrics labels.
    pub name: String,
    /// The worker's task (it ends once stopped and its batch released).
    pub task: tokio::task::JoinHandle<()>,
}
