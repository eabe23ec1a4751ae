//! The accept loop of every HTTP listener of weir.
//!
//! - **The cap.** Each accepted connection asks [`Slots::admit`] for a place (see
//!   [`crate::http_conns`]: at the cap the connection idle the longest is evicted for
//!   it); when every open connection is in the middle of a request it is closed at
//!   once.
//! - **Accept errors** (typically EMFILE) are logged and followed by a pause of
//!   [`ACCEPT_BACKOFF`], so the loop does not spin.
//! - **No Nagle delay.** `TCP_NODELAY` is set on every connection: a response's head
//!   and body can be written apart, and the second write would otherwise wait for the
//!   client's delayed ACK (up to 40 ms on Linux).
//! - **How a connection is served** is the caller's: [`Listener::serve`] takes a
//!   function that builds hyper's connection (HTTP/1, or HTTP/1 and HTTP/2 with
//!   upgrades on the proxy) and hands it to [`Connection::run`], which runs it until
//!   it ends, its slot tells it to close (evicted, or no first head in time), or the
//!   listener stops. [`Listener::serve_http1`] does that for a tower service (an axum
//!   `Router`) over HTTP/1, which is all the HTTP port and the bus need.
//! - **The stop.** When the stop future given to `serve` resolves, the listening
//!   socket is closed and every connection is shut down gracefully: hyper closes an
//!   idle keep-alive connection at once, finishes the request in flight (then closes)
//!   and sends HTTP/2's GOAWAY. The listener waits for them for the grace,
//!   [`STOP_GRACE`] (2 s) unless the caller sets another ([`Listener::grace`]); what
//!   is still open then (a client sending its body slowly, an answer slower than the
//!   grace) is dropped, and the number dropped is logged.
//!
//! Not hyper-util's `GracefulShutdown`: it shuts a connection down on its one signal
//! only, while a connection here must also be shut down gracefully when it is
//! evicted, and it waits without bound with no way to drop what is left. Its
//! `GracefulConnection` trait is what [`Connection::run`] takes, so that any of
//! hyper's connection kinds can be served.

use std::error::Error as StdError;
use std::fmt::Display;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::{service_fn, Service};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::http_conns::{Closing, MarkedBody, Slot, Slots};

/// How long a stopping listener waits for its connections before it drops them.
pub const STOP_GRACE: Duration = Duration::from_secs(2);
/// Pause after a failed accept (typically EMFILE), so the loop does not spin.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// One listener's settings; [`Listener::serve`] runs it.
#[derive(Clone, Debug)]
pub struct Listener {
    door: &'static str,
    name: Option<Arc<str>>,
    max_connections: usize,
    header_timeout: Duration,
    grace: Duration,
    evictions: Arc<AtomicU64>,
}

impl Listener {
    /// A listener of `door` (`"HTTP"`, `"bus"`, `"proxy"`: its log lines begin with
    /// it) with at most `max_connections` open (at least 1), `header_timeout` for a
    /// new connection's first request head, and `evictions` counting the idle
    /// connections closed at the cap for a new one. It drains for [`STOP_GRACE`].
    pub fn new(
        door: &'static str,
        max_connections: usize,
        header_timeout: Duration,
        evictions: Arc<AtomicU64>,
    ) -> Listener {
        Listener {
            door,
            name: None,
            max_connections,
            header_timeout,
            grace: STOP_GRACE,
            evictions,
        }
    }

    /// The listener's name, logged as `listener` (a door with several listeners).
    pub fn named(mut self, name: Arc<str>) -> Listener {
        self.name = Some(name);
        self
    }

    /// How long to wait at stop for the connections to finish before dropping them.
    pub fn grace(mut self, grace: Duration) -> Listener {
        self.grace = grace;
        self
    }

    /// Accepts on `listener` until `stop` resolves, then drains (see the module's
    /// docs). Each connection admitted is served on a task of its own by what
    /// `serve` returns for it, which should end in [`Connection::run`].
    pub async fn serve<F, Fut>(
        self,
        listener: TcpListener,
        stop: impl Future<Output = ()>,
        mut serve: F,
    ) where
        F: FnMut(TcpStream, SocketAddr, Connection) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let slots = Slots::new(
            self.max_connections,
            self.header_timeout,
            Arc::clone(&self.evictions),
        );
        let stopping = CancellationToken::new();
        let mut connections = JoinSet::new();
        tokio::pin!(stop);
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                // A finished connection's task is freed once joined: not only at the
                // next accept (after a burst, thousands of them waited for one).
                Some(_) = connections.join_next(), if !connections.is_empty() => continue,
                () = &mut stop => break,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(listener = self.name.as_deref(), error = %e, "{} accept failed", self.door);
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let Some(slot) = slots.admit() else {
                tracing::debug!(
                    listener = self.name.as_deref(),
                    max = self.max_connections,
                    "{} connection refused: connections at the cap, none of them idle",
                    self.door
                );
                continue;
            };
            let _ = stream.set_nodelay(true);
            let connection = Connection {
                slot: Arc::new(slot),
                stopping: stopping.clone(),
                door: self.door,
                name: self.name.clone(),
            };
            connections.spawn(serve(stream, peer, connection));
        }
        drop(listener);
        stopping.cancel();
        self.drain(connections).await;
    }

    /// Waits for the connections told to close, for the grace; drops the rest.
    async fn drain(&self, mut connections: JoinSet<()>) {
        let drained = tokio::time::timeout(self.grace, async {
            while connections.join_next().await.is_some() {}
        });
        if drained.await.is_err() {
            tracing::info!(
                listener = self.name.as_deref(),
                left = connections.len(),
                grace_ms = self.grace.as_millis() as u64,
                "{} connections still open at stop: closed",
                self.door
            );
            connections.abort_all();
            while connections.join_next().await.is_some() {}
        }
    }

    /// [`Listener::serve`] with `service` (an axum `Router`, say) over HTTP/1 only,
    /// with `header_timeout` for every request head; a request is in the middle
    /// (never evicted) until its response body is sent.
    pub async fn serve_http1<S, B>(
        self,
        listener: TcpListener,
        stop: impl Future<Output = ()>,
        service: S,
    ) where
        S: tower_service::Service<Request<Incoming>, Response = Response<B>>
            + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<Box<dyn StdError + Send + Sync>>,
        B: Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<Box<dyn StdError + Send + Sync>>,
    {
        let header_timeout = self.header_timeout;
        let serve = move |stream: TcpStream, _peer, connection: Connection| {
            let inner = TowerToHyperService::new(service.clone());
            let marking = Arc::clone(connection.slot());
            let service = service_fn(move |req| {
                let mark = marking.begin_request();
                let answer = inner.call(req);
                async move {
                    answer
                        .await
                        .map(|r| r.map(|body| MarkedBody::new(body, mark)))
                }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(stream), service);
            connection.run(conn)
        };
        self.serve(listener, stop, serve).await;
    }
}

/// One admitted connection's place under the cap and the listener's stop signal.
pub struct Connection {
    slot: Arc<Slot>,
    stopping: CancellationToken,
    door: &'static str,
    name: Option<Arc<str>>,
}

impl Connection {
    /// The connection's place under the cap: mark each request begun on it
    /// ([`Slot::begin_request`]); a tunnel made of it can hold it too.
    pub fn slot(&self) -> &Arc<Slot> {
        &self.slot
    }

    /// Serves `conn` until it ends; when the listener stops, it is shut down
    /// gracefully (the drain's grace bounds the wait); when its slot says it is
    /// evicted or sent no first head in time, it is dropped (shut down gracefully
    /// first, within the head timeout, if it already began a request).
    pub async fn run<C>(self, conn: C)
    where
        C: GracefulConnection,
        C::Error: Display,
    {
        self.run_with(conn, C::graceful_shutdown).await;
    }

    /// [`Connection::run`] with the graceful shutdown given by the caller: for a
    /// connection type whose `GracefulConnection` bounds the compiler cannot prove
    /// `Send` through (hyper-util's `auto::UpgradeableConnection`, which borrows its
    /// builder: rustc's "implementation of `From` is not general enough").
    pub async fn run_with<F, E>(self, conn: F, mut graceful_shutdown: impl FnMut(Pin<&mut F>))
    where
        F: Future<Output = Result<(), E>>,
        E: Display,
    {
        tokio::pin!(conn);
        let result = tokio::select! {
            // The connection first: one admitted just before a stop reads the request
            // already in its socket before it is shut down.
            biased;
            result = conn.as_mut() => result,
            () = self.stopping.cancelled() => {
                graceful_shutdown(conn.as_mut());
                conn.await
            }
            why = self.slot.closing() => {
                tracing::debug!(listener = self.name.as_deref(), ?why, "{} connection closed", self.door);
                if let (Closing::Evicted, Some(within)) = (why, self.slot.drain_after_eviction()) {
                    graceful_shutdown(conn.as_mut());
                    let _ = tokio::time::timeout(within, conn).await;
                }
                return;
            }
        };
        if let Err(e) = result {
            tracing::debug!(
                listener = self.name.as_deref(),
                error = %e,
                "{} connection ended with an error",
                self.door
            );
        }
    }
}
