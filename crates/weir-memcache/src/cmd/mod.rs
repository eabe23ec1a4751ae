//! The commands: one file each, each applying one parsed request to the store and
//! appending its reply to the connection's output.
//!
//! A command is given the connection's outbound half ([`Outbound`]): it appends its
//! reply there. It writes to the socket itself only where the protocol streams
//! (`monitor`) or is about to wait (`get` with `t=MS`), and then through the same
//! half, so replies stay in order.

pub mod confirm;
pub mod delete;
pub mod dump_stats;
pub mod flush;
pub mod flush_all;
pub mod flush_expired;
pub mod get;
pub mod monitor;
pub mod quit;
pub mod reload;
pub mod set;
pub mod shutdown;
pub mod stats;
pub mod version;

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use weir_backend::{Item, Kind, Reader, TakeMode, Taken};

use crate::connection::Outbound;
use crate::handles::Handles;
use crate::leases::Leases;
use crate::metrics::LoopMetrics;
use crate::parse::Request;
use crate::reply;
use crate::settings::Limits;
use crate::shared::Shared;

/// What the connection does after a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Write what is pending, then close.
    Close,
}

/// Per-connection state that commands use.
#[derive(Default)]
pub struct Session {
    pub handles: Handles,
    pub leases: Leases,
}

/// Everything a command may touch.
pub struct Ctx<'a> {
    pub shared: &'a Shared,
    /// The reloadable limits in force for this read's requests.
    pub limits: &'a Limits,
    pub session: &'a mut Session,
    /// The counters of the event loop this connection runs on.
    pub metrics: &'a LoopMetrics,
    /// The socket's outbound half: replies go here.
    pub out: &'a mut Outbound,
}

pub async fn execute(request: Request<'_>, ctx: &mut Ctx<'_>) -> Flow {
    match request {
        Request::Set {
            key,
            flags,
            exptime,
            data,
            noreply,
        } => set::execute(ctx, key, flags, exptime, data, noreply).await,
        Request::Get { keys, cas } => get::execute(ctx, keys, cas).await,
        Request::Delete { key, noreply } => delete::execute(ctx, key, noreply).await,
        Request::Flush { key, noreply } => flush::execute(ctx, key, noreply).await,
        Request::FlushAll { noreply } => flush_all::execute(ctx, noreply).await,
        Request::FlushExpired { queue } => flush_expired::execute(ctx, Some(queue)).await,
        Request::FlushAllExpired => flush_expired::execute(ctx, None).await,
        Request::Stats => stats::execute(ctx).await,
        Request::StatsSettings => stats::settings(ctx),
        Request::StatsReset => stats::reset(ctx),
        Request::DumpStats { names } => dump_stats::execute(ctx, names).await,
        Request::Monitor {
            key,
            seconds,
            items_max,
        } => monitor::execute(ctx, key, seconds, items_max).await,
        Request::Confirm { key, count } => confirm::execute(ctx, key, count).await,
        Request::Version => version::execute(ctx),
        Request::Reload => reload::execute(ctx).await,
        Request::Shutdown => shutdown::execute(ctx),
        Request::Quit => quit::execute(ctx),
    }
}

/// A failure that becomes a reply.
#[derive(Debug)]
pub enum Failure {
    Engine(weir_backend::Error),
    /// A blocking task died; should not happen.
    Internal(String),
}

impl From<weir_backend::Error> for Failure {
    fn from(e: weir_backend::Error) -> Failure {
        Failure::Engine(e)
    }
}

/// Runs work that is long for an event loop (the text of thousands of queues'
/// stats) on the blocking pool, so no runtime thread is held by it.
pub async fn blocking<T, F>(f: F) -> Result<T, Failure>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Failure::Internal(e.to_string()))
}

/// The reply for a failure.
pub fn put_failure(out: &mut BytesMut, failure: &Failure) {
    match failure {
        Failure::Engine(e) => put_engine_error(out, e),
        Failure::Internal(message) => put_server_error(out, message),
    }
}

pub fn put_engine_error(out: &mut BytesMut, e: &weir_backend::Error) {
    match e.kind() {
        Kind::TooLarge => out.put_slice(reply::TOO_LARGE),
        Kind::Full => out.put_slice(reply::NOT_STORED),
        Kind::InvalidName => out.put_slice(reply::BAD_QUEUE_NAME),
        Kind::InvalidArgument => out.put_slice(reply::INVALID_ARGUMENT),
        Kind::DiskFull => out.put_slice(reply::DISK_FULL),
        Kind::Closed => out.put_slice(reply::SHUTTING_DOWN),
        Kind::TooManyQueues => out.put_slice(reply::TOO_MANY_QUEUES),
        // The server's failure, not the client's: SERVER_ERROR, and the connection
        // stays open for the retry.
        Kind::Unavailable => {
            let text = e.to_string();
            if text.starts_with(reply::UNAVAILABLE_PREFIX) {
                put_server_error(out, &text);
            } else {
                put_server_error(out, &format!("{}: {text}", reply::UNAVAILABLE_PREFIX));
            }
        }
        _ => put_server_error(out, &e.to_string()),
    }
}

/// Longest error text put in a reply line.
const ERROR_TEXT_BYTES_MAX: usize = 200;

/// `SERVER_ERROR text`, with the text made safe for one line.
pub fn put_server_error(out: &mut BytesMut, text: &str) {
    out.put_slice(b"SERVER_ERROR ");
    put_one_line(out, text);
    out.put_slice(b"\r\n");
}

/// `text` on one line: control characters become spaces, at most
/// `ERROR_TEXT_BYTES_MAX` bytes.
pub fn put_one_line(out: &mut BytesMut, text: &str) {
    for b in text.bytes().take(ERROR_TEXT_BYTES_MAX) {
        out.put_u8(if b.is_ascii_control() { b' ' } else { b });
    }
}

/// Appends the decimal form of `n`.
pub fn put_u64(out: &mut BytesMut, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.put_slice(&digits[i..]);
}

/// `VALUE KEY FLAGS LEN [CAS]\r\nDATA\r\n`. The key is echoed as the client sent it
/// (options included): memcache clients match replies to requests by key.
pub fn put_value(out: &mut BytesMut, key: &str, item: &Item, cas: bool) {
    out.reserve(key.len() + item.data.len() + 64);
    out.put_slice(b"VALUE ");
    out.put_slice(key.as_bytes());
    out.put_u8(b' ');
    put_u64(out, u64::from(item.flags));
    out.put_u8(b' ');
    put_u64(out, item.data.len() as u64);
    if cas {
        out.put_u8(b' ');
        put_u64(out, item.seq);
    }
    out.put_slice(b"\r\n");
    out.put_slice(&item.data);
    out.put_slice(b"\r\n");
}

/// How a read that may wait ended.
pub enum Waited {
    Done(weir_backend::Result<Option<Taken>>),
    /// The client went away during the wait; nothing was taken.
    Gone,
}

/// Takes from `reader` by `mode`, waiting up to `wait`. A wait first sends the replies
/// already pending, then races the engine against the client closing and against
/// shutdown (which ends the wait empty-handed).
pub async fn take(ctx: &mut Ctx<'_>, reader: &Reader, mode: TakeMode, wait: Duration) -> Waited {
    if wait.is_zero() {
        return Waited::Done(reader.take(mode, Duration::ZERO).await);
    }
    match ctx.out.write().await {
        Ok(n) => ctx.metrics.bytes_written.add(n as u64),
        Err(_) => return Waited::Gone,
    }
    let shutdown = &ctx.shared.shutdown;
    if shutdown.is_triggered() {
        return Waited::Done(reader.take(mode, Duration::ZERO).await);
    }
    tokio::select! {
        biased;
        taken = reader.take(mode, wait) => Waited::Done(taken),
        // A shutdown stops the socket's reads too (see `shutdown.rs`): that ends the
        // wait empty-handed, and the connection then closes.
        _ = ctx.out.until_closed() => if shutdown.is_triggered() {
            Waited::Done(Ok(None))
        } else {
            Waited::Gone
        },
    }
}

/// A reader handle from the connection's cache, cloned so that it can be held while
/// `ctx` is used (a wait); a plain look borrows from `ctx.session.handles` instead.
pub async fn reader_handle(
    ctx: &mut Ctx<'_>,
    queue: &str,
    reader: &str,
) -> weir_backend::Result<Reader> {
    ctx.session
        .handles
        .reader(&ctx.shared.backend, queue, reader)
        .await
        .cloned()
}

/// Whether an error means the handle went stale (its queue was deleted).
pub fn is_stale(result: &weir_backend::Result<Option<Taken>>) -> bool {
    matches!(result, Err(e) if e.kind() == Kind::NotFound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_lines() {
        let mut out = BytesMut::new();
        for n in [0, 7, 10, 12345, u64::MAX] {
            out.clear();
            put_u64(&mut out, n);
            assert_eq!(&out[..], n.to_string().as_bytes());
        }
        out.clear();
        put_server_error(&mut out, "bad\r\nthing");
        assert_eq!(&out[..], b"SERVER_ERROR bad  thing\r\n");
    }
}
