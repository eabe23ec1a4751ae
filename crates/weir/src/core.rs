//! TEMPORARY STUB: the API contract compiles; the implementation lands next.
#![allow(dead_code, unused_variables)]
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Instant;

use crate::config::QueueConfig;
use crate::error::Result;
use crate::item::{AppendOptions, Item, LeaseId, TakeMode, Taken};
use crate::iter::Iter;
use crate::stats::QueueStats;
use crate::store::StoreInner;

pub(crate) struct Ticket;
pub(crate) struct WaiterGuard;

pub(crate) struct QueueCore {
    pub(crate) name: String,
}

impl QueueCore {
    pub(crate) fn open(name: &str, dir: &Path, config: QueueConfig, store: Weak<StoreInner>) -> Result<Arc<QueueCore>> { todo!() }
    pub(crate) fn config(&self) -> QueueConfig { todo!() }
    pub(crate) fn set_config(&self, config: QueueConfig) { todo!() }
    pub(crate) fn append_batch(&self, items: &[&[u8]], options: AppendOptions) -> Result<(u64, Ticket)> { todo!() }
    pub(crate) fn wait_durable(&self, ticket: Ticket) -> Result<()> { todo!() }
    pub(crate) async fn wait_durable_async(&self, ticket: Ticket) -> Result<()> { todo!() }
    pub(crate) fn ensure_reader(&self, name: &str) -> Result<()> { todo!() }
    pub(crate) fn reader_names(&self) -> Vec<String> { todo!() }
    pub(crate) fn delete_reader(&self, name: &str) -> Result<bool> { todo!() }
    pub(crate) fn flush(&self, reader: Option<&str>) -> Result<u64> { todo!() }
    pub(crate) fn expire(&self) -> Result<u64> { todo!() }
    pub(crate) fn stats(&self) -> QueueStats { todo!() }
    pub(crate) fn iter(&self) -> Result<Iter> { todo!() }
    pub(crate) fn sync_now(&self) -> Result<()> { todo!() }
    pub(crate) fn take(&self, reader: &str, mode: TakeMode) -> Result<(Option<Taken>, Ticket)> { todo!() }
    pub(crate) fn take_batch(&self, reader: &str, count_max: usize) -> Result<(Vec<Item>, Ticket)> { todo!() }
    pub(crate) fn wait_blocking(&self, reader: &str, deadline: Instant) -> bool { todo!() }
    pub(crate) fn reader_notify(&self, reader: &str) -> Result<Arc<tokio::sync::Notify>> { todo!() }
    pub(crate) fn waiter_guard(&self, reader: &str) -> WaiterGuard { todo!() }
    pub(crate) fn confirm(&self, reader: &str, lease: LeaseId) -> Result<(bool, Ticket)> { todo!() }
    pub(crate) fn release(&self, reader: &str, lease: LeaseId) -> Result<bool> { todo!() }
    pub(crate) fn delete_files(&self) -> Result<()> { todo!() }
    pub(crate) fn close(&self) -> Result<()> { todo!() }
    pub(crate) fn tick(&self, now: Instant) { todo!() }
}
