//! A take that may wait (`get q/t=MS`): the replies already pending go first, then
//! the take races the client closing and the shutdown. And the reader handles a wait
//! holds.

use std::time::Duration;

use weir_backend::{Kind, Reader, TakeMode, Taken};

use super::ctx::Ctx;

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
