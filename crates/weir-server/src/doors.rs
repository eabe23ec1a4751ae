//! The doors the root starts (the memcache door, the event bus, the proxy) in one
//! shape: their figures on `/metrics`, the start of their stop, and the end of it.
//! The root holds each running door; no door holds another's handle.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use weir_backend::exposition::DescriptorEncoder;
use weir_backend::QueueStats;
use weir_memcache::MemcacheDoor;

/// Resolves once a door has stopped.
pub type Stopped = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What the root asks of every door.
pub trait Door: Send + Sync + 'static {
    /// Encodes the door's series onto a `/metrics` page; `stats` are the backend's
    /// queue figures, gathered once per scrape.
    fn encode_metrics(&self, stats: &[QueueStats], enc: &mut DescriptorEncoder<'_>) -> fmt::Result;
    /// Starts the stop: the door takes no new work in.
    fn begin_shutdown(&self);
    /// Finishes the stop: resolves once the door's work in flight has ended and its
    /// threads are joined. Called after [`Door::begin_shutdown`].
    fn stopped(self: Arc<Self>) -> Stopped;
}

impl Door for MemcacheDoor {
    fn encode_metrics(
        &self,
        _stats: &[QueueStats],
        enc: &mut DescriptorEncoder<'_>,
    ) -> fmt::Result {
        MemcacheDoor::encode_metrics(self, enc, |_| Ok(()))
    }

    fn begin_shutdown(&self) {
        MemcacheDoor::begin_shutdown(self);
    }

    fn stopped(self: Arc<Self>) -> Stopped {
        Box::pin(async move { MemcacheDoor::stopped(&self).await })
    }
}

/// The bus stops whole in [`Door::stopped`]: deliveries in flight end, leased items
/// go back to their queues, its threads are joined (off the runtime's thread).
impl Door for weir_bus::BusHandle {
    fn encode_metrics(&self, stats: &[QueueStats], enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
        weir_bus::BusHandle::encode_metrics(self, stats, enc)
    }

    fn begin_shutdown(&self) {}

    fn stopped(self: Arc<Self>) -> Stopped {
        Box::pin(async move {
            let _ = tokio::task::spawn_blocking(move || self.stop()).await;
        })
    }
}

/// The proxy stops whole in [`Door::stopped`]: requests in flight finish, replays in
/// flight come again later, its threads are joined (off the runtime's thread).
impl Door for weir_proxy::ProxyHandle {
    fn encode_metrics(&self, stats: &[QueueStats], enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
        self.metrics(stats).encode(enc)
    }

    fn begin_shutdown(&self) {}

    fn stopped(self: Arc<Self>) -> Stopped {
        Box::pin(async move {
            let _ = tokio::task::spawn_blocking(move || self.stop()).await;
        })
    }
}
