//! The beanstalkd door: bind, accept, one task per connection, stop.
//!
//! Limits: `connections_max` (one more is closed at once: beanstalkd has no reply
//! for it), `reserved_max` and `watched_max` per connection, `request_timeout` from
//! a request's first byte to its last and for a reply to be taken (a client that
//! trickles or stops reading is closed), and the parser's line and job sizes. A
//! connection waiting in `reserve` is not mid-request: it may wait without end.
//!
//! Stop: the accept loop ends; each connection finishes the requests it has
//! received, a waiting reserve ends, and every job a connection holds is released
//! before it closes, so nothing acknowledged is lost; the root then closes the
//! store. Connections still open after `shutdown_grace` are left to the runtime's
//! end: their jobs come back when their ttr passes or at the next start.

use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use weir_backend::listen::listen;

use crate::cmd::{execute, Ctx, Flow};
use crate::connection::{Connection, Discard};
use crate::parse::{parse, Parsed};
use crate::reserve::reserve;
use crate::session::Session;
use crate::settings::BeanstalkSettings;
use crate::shared::Shared;

/// Pause after a failed accept (typically EMFILE), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// A listener bound before the door starts (the root binds every port first).
pub struct BoundListener {
    listener: TcpListener,
    addr: std::net::SocketAddr,
}

impl BoundListener {
    pub async fn bind(addr: &str) -> anyhow::Result<BoundListener> {
        let listener = listen(addr)
            .await
            .with_context(|| format!("listening on {addr} (beanstalk)"))?;
        let bound = listener.local_addr()?;
        Ok(BoundListener {
            listener,
            addr: bound,
        })
    }

    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.addr
    }
}

/// A running beanstalkd door.
pub struct BeanstalkDoor {
    shared: Arc<Shared>,
    addr: std::net::SocketAddr,
    running: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl BeanstalkDoor {
    /// Starts the accept loop on a task of the current runtime.
    pub fn start(
        listener: BoundListener,
        backend: Arc<weir_backend::Backend>,
        settings: BeanstalkSettings,
    ) -> BeanstalkDoor {
        let addr = listener.addr;
        let shared = Arc::new(Shared::new(backend, settings));
        let serving = Arc::clone(&shared);
        let running = tokio::spawn(async move { accept_loop(serving, listener.listener).await });
        BeanstalkDoor {
            shared,
            addr,
            running: Mutex::new(Some(running)),
        }
    }

    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// Stops accepting; connections finish what they received and end.
    pub fn begin_shutdown(&self) {
        self.shared.stopping.send_replace(true);
    }

    /// Resolves once the accept loop has ended and its connections have (or the
    /// grace period has passed).
    pub async fn stopped(&self) {
        let running = match self.running.lock() {
            Ok(mut slot) => slot.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(running) = running {
            if let Err(e) = running.await {
                tracing::warn!(error = %e, "the beanstalk accept loop");
            }
        }
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shared.stopped() => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "beanstalk accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let counters = &shared.counters;
        if counters.connections_current.load(Relaxed) >= shared.settings.connections_max as u64 {
            drop(stream);
            continue;
        }
        counters.connections_current.fetch_add(1, Relaxed);
        counters.connections_total.fetch_add(1, Relaxed);
        let _ = stream.set_nodelay(true);
        let (shared, done) = (Arc::clone(&shared), done_tx.clone());
        tokio::spawn(async move {
            let _done = done;
            serve(&shared, stream).await;
            shared.counters.connections_current.fetch_sub(1, Relaxed);
        });
    }
    drop(listener);
    drop(done_tx);
    let grace = shared.settings.shutdown_grace;
    if tokio::time::timeout(grace, done_rx.recv()).await.is_err() {
        tracing::warn!(
            open = shared.counters.connections_current.load(Relaxed),
            "beanstalk connections still open after the grace period"
        );
    }
}

async fn serve(shared: &Shared, stream: TcpStream) {
    let mut conn = Connection::new(stream);
    let mut session = Session::new(shared);
    if let Err(e) = handle(shared, &mut conn, &mut session).await {
        tracing::debug!(error = %e, "beanstalk connection ended with an error");
    }
    session.end(shared).await;
}

async fn handle(shared: &Shared, conn: &mut Connection, session: &mut Session) -> io::Result<()> {
    let timeout = shared.settings.request_timeout;
    let mut request_started: Option<Instant> = None;
    loop {
        let (flow, progressed) = process(shared, conn, session).await?;
        tokio::time::timeout(timeout, conn.flush())
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "reply not taken"))??;
        if flow == Flow::Close || shared.is_stopping() {
            return Ok(());
        }
        request_started = match (conn.is_mid_request(), progressed) {
            (false, _) => None,
            (true, true) => Some(Instant::now()),
            (true, false) => Some(request_started.unwrap_or_else(Instant::now)),
        };
        let read = async {
            match request_started {
                Some(started) => tokio::time::timeout_at((started + timeout).into(), conn.read())
                    .await
                    .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into())),
                None => conn.read().await,
            }
        };
        let read = tokio::select! {
            read = read => read?,
            () = shared.stopped() => return Ok(()),
        };
        if read == 0 {
            return Ok(());
        }
    }
}

/// Runs every complete request in the buffer; says whether to close, and whether
/// any bytes were consumed.
async fn process(
    shared: &Shared,
    conn: &mut Connection,
    session: &mut Session,
) -> io::Result<(Flow, bool)> {
    let mut progressed = false;
    loop {
        if conn.discard.is_some() {
            let before = conn.buf.len();
            let done = conn.drain_discard();
            progressed |= conn.buf.len() != before;
            match done {
                Some(discard) => {
                    conn.out.extend_from_slice(discard.reply);
                    if discard.close {
                        return Ok((Flow::Close, progressed));
                    }
                }
                None => return Ok((Flow::Continue, progressed)),
            }
        }
        let (flow, consumed) = match parse(&conn.buf, &shared.settings.parse) {
            Parsed::Incomplete => return Ok((Flow::Continue, progressed)),
            Parsed::Refused(refusal) => {
                conn.discard = Some(Discard::of(&refusal));
                (Flow::Continue, refusal.consumed)
            }
            Parsed::Complete { request, consumed } => {
                let mut ctx = Ctx {
                    shared,
                    session,
                    out: &mut conn.out,
                };
                (execute(&mut ctx, request).await, consumed)
            }
        };
        conn.consume(consumed);
        progressed = true;
        let flow = match flow {
            Flow::Reserve(timeout) => reserve(shared, conn, session, timeout).await?,
            flow => flow,
        };
        if flow == Flow::Close {
            return Ok((Flow::Close, progressed));
        }
    }
}
