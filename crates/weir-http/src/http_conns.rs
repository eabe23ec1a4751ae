//! The connection limits every HTTP listener of weir shares (the server's HTTP port,
//! the bus's API, the proxy's listeners): a cap on open connections that a flood of
//! idle sockets cannot turn into a lock-out, and a deadline on a new connection's
//! first request head that holds whatever protocol detection runs first.
//!
//! - **Eviction at the cap.** A listener asks [`Slots::admit`] for each accepted
//!   connection. Below the cap it gets a [`Slot`]. At the cap, the connection that
//!   has been idle longest (it has not sent a complete request head yet, or it is
//!   between requests) is told to close, and the newcomer takes its place; only when
//!   every connection is in the middle of a request is the newcomer refused. A
//!   request is "in the middle" from the moment hyper hands its head to the service
//!   ([`Slot::begin_request`]) until its response body has been sent or dropped
//!   ([`MarkedBody`]): such a connection is never evicted. This is what nginx and
//!   HAProxy do with idle keep-alive connections; without it, `connections_max`
//!   silent sockets refuse every real client for as long as they are held.
//! - **The first head's deadline.** hyper's `header_read_timeout` starts once hyper
//!   reads a head; hyper-util's `auto` builder first reads to tell HTTP/1 from
//!   HTTP/2, with no deadline, so a socket that sends nothing was held for ever.
//!   [`Slot::closing`] resolves when the connection has begun no request within
//!   `head_timeout` of being accepted (or when it is evicted); the listener then
//!   drops the connection. Later requests on a keep-alive connection keep hyper's own
//!   header timeout.
//!
//! [`crate::Listener`] applies it to every connection it accepts; the listeners' own
//! code only marks requests ([`Slot::begin_request`], [`MarkedBody`]) and, on the
//! proxy, tunnels ([`Slot::retire`]).
//!
//! Known limit: a connection is idle again once its response body is handed to
//! hyper, which may still be writing its last bytes to a slow reader; such a
//! connection is the most recently idle, so it is the last one evicted.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The open connections of one listener, at most `max` of them.
pub struct Slots {
    inner: Arc<Inner>,
}

struct Inner {
    max: usize,
    head_timeout: Duration,
    evictions: Arc<AtomicU64>,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    open: HashMap<u64, Entry>,
}

struct Entry {
    /// Requests begun whose responses are not finished.
    in_flight: usize,
    /// Requests begun since the connection was accepted.
    begun: u64,
    /// Since when `in_flight` is 0 (when it is).
    idle_since: Instant,
    /// False once the connection is no longer served as HTTP (upgraded to a tunnel,
    /// or ending): it keeps its place but cannot be evicted.
    evictable: bool,
    close: Arc<Notify>,
}

/// Why a listener should drop a connection ([`Slot::closing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closing {
    /// A newcomer needed its place while it was idle.
    Evicted,
    /// It had not sent a complete request head within the head timeout.
    HeadTimeout,
}

impl Slots {
    /// `max` connections at once (at least 1); a connection must send its first
    /// request head within `head_timeout`; each eviction adds 1 to `evictions`.
    pub fn new(max: usize, head_timeout: Duration, evictions: Arc<AtomicU64>) -> Slots {
        Slots {
            inner: Arc::new(Inner {
                max: max.max(1),
                head_timeout,
                evictions,
                table: Mutex::new(Table::default()),
            }),
        }
    }

    /// A place for a connection just accepted: below the cap at once; at the cap by
    /// evicting the connection idle the longest. `None` when every open connection
    /// is in the middle of a request.
    pub fn admit(&self) -> Option<Slot> {
        let mut table = self.inner.lock();
        if table.open.len() >= self.inner.max && !self.evict_one(&mut table) {
            return None;
        }
        let id = table.next_id;
        table.next_id += 1;
        let now = Instant::now();
        let close = Arc::new(Notify::new());
        table.open.insert(
            id,
            Entry {
                in_flight: 0,
                begun: 0,
                idle_since: now,
                evictable: true,
                close: Arc::clone(&close),
            },
        );
        Some(Slot {
            inner: Arc::clone(&self.inner),
            id,
            close,
            head_deadline: now + self.inner.head_timeout,
            begun: AtomicU64::new(0),
        })
    }

    /// Connections open now (evicted ones count until their task drops them).
    pub fn open(&self) -> usize {
        self.inner.lock().open.len()
    }

    /// Tells the longest idle connection to close and frees its place at once (its
    /// task drops the socket as soon as it runs). False when none is idle.
    fn evict_one(&self, table: &mut Table) -> bool {
        let oldest = table
            .open
            .iter()
            .filter(|(_, e)| e.evictable && e.in_flight == 0)
            .min_by_key(|(_, e)| e.idle_since)
            .map(|(id, _)| *id);
        let Some(entry) = oldest.and_then(|id| table.open.remove(&id)) else {
            return false;
        };
        entry.close.notify_one();
        self.inner.evictions.fetch_add(1, Relaxed);
        tracing::debug!(
            idle_ms = entry.idle_since.elapsed().as_millis() as u64,
            requests = entry.begun,
            "connection cap reached: the longest idle connection is closed for a new one"
        );
        true
    }
}

impl Inner {
    /// The table; a panic elsewhere while it was held leaves it consistent (every
    /// change is a single insert, remove or field update), so poisoning is ignored.
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One connection's place under the cap; given back when dropped.
pub struct Slot {
    inner: Arc<Inner>,
    id: u64,
    close: Arc<Notify>,
    head_deadline: Instant,
    /// Requests begun, counted here too: an evicted connection's entry is gone.
    begun: AtomicU64,
}

impl Slot {
    /// Marks a request as begun (its head is complete): the connection cannot be
    /// evicted until the mark, moved into the response body by [`MarkedBody`], is
    /// dropped.
    pub fn begin_request(&self) -> RequestMark {
        self.begun.fetch_add(1, Relaxed);
        if let Some(e) = self.inner.lock().open.get_mut(&self.id) {
            e.in_flight += 1;
            e.begun += 1;
        }
        RequestMark {
            inner: Arc::clone(&self.inner),
            id: self.id,
        }
    }

    /// Resolves when the listener should drop the connection: it was evicted, or it
    /// began no request within the head timeout. Never resolves otherwise.
    pub async fn closing(&self) -> Closing {
        let first_head = async {
            tokio::time::sleep_until(self.head_deadline).await;
            // The slot's own count: an evicted connection's entry is gone, and one
            // that began a request must be told `Evicted` (and drained), not dropped.
            if self.begun.load(Relaxed) > 0 {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = self.close.notified() => Closing::Evicted,
            _ = first_head => Closing::HeadTimeout,
        }
    }

    /// How an evicted connection ends: one that never began a request is dropped;
    /// one that did (it is between requests, or it began one just as it was chosen:
    /// the accept task and the connection's own task do not see each other at
    /// once) is shut down gracefully, so a request begun is answered, within the
    /// head timeout. hyper closes an idle HTTP/1 connection at once on a graceful
    /// shutdown, and sends HTTP/2's GOAWAY.
    pub fn drain_after_eviction(&self) -> Option<Duration> {
        (self.begun.load(Relaxed) > 0).then_some(self.inner.head_timeout)
    }

    /// The connection is no longer served as HTTP (it became a tunnel): it keeps
    /// its place for as long as this slot lives, but is never evicted.
    pub fn retire(&self) {
        if let Some(e) = self.inner.lock().open.get_mut(&self.id) {
            e.evictable = false;
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.inner.lock().open.remove(&self.id);
    }
}

/// A request in the middle of being served; see [`Slot::begin_request`].
pub struct RequestMark {
    inner: Arc<Inner>,
    id: u64,
}

impl Drop for RequestMark {
    fn drop(&mut self) {
        if let Some(e) = self.inner.lock().open.get_mut(&self.id) {
            e.in_flight = e.in_flight.saturating_sub(1);
            if e.in_flight == 0 {
                e.idle_since = Instant::now();
            }
        }
    }
}

/// A response body that holds its request's [`RequestMark`] until it has been sent
/// (or dropped): the connection stays "in the middle of a request" meanwhile.
pub struct MarkedBody<B> {
    inner: B,
    _mark: RequestMark,
}

impl<B> MarkedBody<B> {
    pub fn new(inner: B, mark: RequestMark) -> MarkedBody<B> {
        MarkedBody { inner, _mark: mark }
    }
}

impl<B> Body for MarkedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(max: usize, head_ms: u64) -> (Slots, Arc<AtomicU64>) {
        let evictions = Arc::new(AtomicU64::new(0));
        let slots = Slots::new(max, Duration::from_millis(head_ms), Arc::clone(&evictions));
        (slots, evictions)
    }

    #[tokio::test]
    async fn at_the_cap_the_longest_idle_connection_makes_room() {
        let (slots, evictions) = slots(2, 10_000);
        let first = slots.admit().expect("below the cap");
        tokio::time::sleep(Duration::from_millis(5)).await;
        let second = slots.admit().expect("below the cap");
        let third = slots.admit().expect("an idle connection makes room");
        assert_eq!(evictions.load(Relaxed), 1);
        assert_eq!(slots.open(), 2);
        let closing = tokio::time::timeout(Duration::from_secs(1), first.closing()).await;
        assert_eq!(closing, Ok(Closing::Evicted));
        drop(first);
        assert_eq!(slots.open(), 2, "the evicted place was already given away");
        drop((second, third));
        assert_eq!(slots.open(), 0);
    }

    #[tokio::test]
    async fn an_evicted_connection_that_began_a_request_is_drained_not_dropped() {
        let (slots, _) = slots(1, 7_000);
        let silent = slots.admit().expect("below the cap");
        assert_eq!(silent.drain_after_eviction(), None);
        let kept_alive = slots.admit().expect("the silent one makes room");
        drop(kept_alive.begin_request());
        let _newcomer = slots.admit().expect("the one between requests makes room");
        // Its entry is gone, but what it began is still known.
        assert_eq!(
            kept_alive.drain_after_eviction(),
            Some(Duration::from_millis(7_000))
        );
        drop(silent);
    }

    #[tokio::test]
    async fn a_connection_in_the_middle_of_a_request_is_never_evicted() {
        let (slots, evictions) = slots(2, 10_000);
        let a = slots.admit().expect("below the cap");
        let b = slots.admit().expect("below the cap");
        let (mark_a, mark_b) = (a.begin_request(), b.begin_request());
        assert!(
            slots.admit().is_none(),
            "both are busy: the newcomer is refused"
        );
        let body = MarkedBody::new(http_body_util::Empty::<Bytes>::new(), mark_b);
        assert!(slots.admit().is_none(), "b's response is not sent yet");
        drop(body);
        let c = slots.admit().expect("b is idle again");
        assert_eq!(evictions.load(Relaxed), 1);
        let closing = tokio::time::timeout(Duration::from_secs(1), b.closing()).await;
        assert_eq!(closing, Ok(Closing::Evicted));
        b.retire();
        drop((mark_a, a, c));
    }

    #[tokio::test]
    async fn a_connection_without_a_first_head_times_out_and_one_with_it_does_not() {
        let (slots, _) = slots(4, 50);
        let silent = slots.admit().expect("below the cap");
        let talking = slots.admit().expect("below the cap");
        drop(talking.begin_request());
        let started = std::time::Instant::now();
        assert_eq!(silent.closing().await, Closing::HeadTimeout);
        assert!(started.elapsed() >= Duration::from_millis(40));
        let quiet = tokio::time::timeout(Duration::from_millis(200), talking.closing()).await;
        assert!(
            quiet.is_err(),
            "a connection that sent a head is not closed"
        );
    }

    #[tokio::test]
    async fn a_retired_connection_keeps_its_place_and_is_not_evicted() {
        let (slots, _) = slots(1, 10_000);
        let tunnel = slots.admit().expect("below the cap");
        tunnel.retire();
        assert!(slots.admit().is_none());
        drop(tunnel);
        assert!(slots.admit().is_some());
    }
}
