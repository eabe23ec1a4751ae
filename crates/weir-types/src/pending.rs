//! What a reader's open leases look like to an operator (Redis's `XPENDING`): which
//! item each lease holds, who holds it, for how long so far, how long it has left
//! and how many times the item has been handed out. The same on every backend that
//! can list them, so a front door shows them alike.

use std::sync::Arc;
use std::time::Duration;

use crate::item::LeaseId;

/// Most leases one listing returns, whatever the caller asks for: a listing is
/// built under the queue's lock, so it must stay short.
pub const PENDING_LIST_MAX: usize = 10_000;

/// One open lease of a reader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingLease {
    /// The lease (what `confirm` and `release` take).
    pub lease: LeaseId,
    /// The leased item's sequence number.
    pub seq: u64,
    /// Who took it, as the taker named itself (a front door names the client
    /// connection, e.g. `memcache 10.0.0.7:51234`); `None` when it gave no name.
    pub holder: Option<Arc<str>>,
    /// How long ago it was taken, by the queue's clock.
    pub age: Duration,
    /// How long before it times out and goes back; `None` when it has no deadline.
    pub time_left: Option<Duration>,
    /// How many times the reader has been handed the item, this time included (as
    /// [`Taken::deliveries`](crate::Taken::deliveries)).
    pub deliveries: u32,
    /// The payload's length in bytes.
    pub len: u32,
}
