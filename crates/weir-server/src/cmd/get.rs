//! `get KEY...` / `gets KEY...`: take, lease, confirm, release or peek, per key.
//!
//! Per key, in this order: `abort` releases this connection's leases on the reader;
//! `close` confirms its oldest lease there; then `open` takes under a lease, `peek`
//! looks, and a plain key takes and confirms at once, each waiting up to `t=MS`. The
//! lease rules (`max_open_reads`; no plain take while holding a lease) are checked for
//! every key before anything happens, so a refused request changes nothing. `gets`
//! adds the item's sequence number as memcache's CAS field, for clients that expect
//! one.

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use weir::{ErrorKind, Reader, TakeMode, Taken};

use super::{is_stale, put_engine_error, put_value, reader_handle, take, Ctx, Flow, Waited};
use crate::leases::{Leases, LEASES_PER_CONNECTION_MAX};
use crate::metrics::LoopMetrics;
use crate::request::{parse_read_key, ReadKey};

pub const REPLY_CLOSE_FIRST: &[u8] = b"CLIENT_ERROR close current item first\r\n";

enum KeyFailure {
    Engine(weir::Error),
    Gone,
}

pub async fn execute(ctx: &mut Ctx<'_>, keys: &str, cas: bool) -> Flow {
    let open_reads_max = ctx.shared.limits.max_open_reads();
    for text in keys.split(' ').filter(|k| !k.is_empty()) {
        let Ok(key) = parse_read_key(text) else {
            ctx.out.put_slice(b"CLIENT_ERROR bad queue name\r\n");
            return Flow::Continue;
        };
        let held = ctx.session.leases.count(key.queue, key.reader) as u64;
        let o = key.options;
        let held_after_close = if o.close {
            held.saturating_sub(1)
        } else {
            held
        };
        if (o.is_plain() && held > 0) || (o.open && held_after_close >= open_reads_max) {
            ctx.out.put_slice(REPLY_CLOSE_FIRST);
            return Flow::Continue;
        }
        // Leases over many readers: bounded per connection too.
        if o.open && ctx.session.leases.total() >= LEASES_PER_CONNECTION_MAX {
            ctx.out.put_slice(b"CLIENT_ERROR too many open items\r\n");
            return Flow::Continue;
        }
    }
    for text in keys.split(' ').filter(|k| !k.is_empty()) {
        let Ok(key) = parse_read_key(text) else {
            continue;
        };
        match one_key(ctx, text, key, cas).await {
            Ok(()) => {}
            Err(KeyFailure::Gone) => return Flow::Close,
            Err(KeyFailure::Engine(e)) => {
                // In place of END: the client must not take a partial reply as whole.
                put_engine_error(ctx.out, &e);
                return Flow::Continue;
            }
        }
    }
    ctx.out.put_slice(b"END\r\n");
    Flow::Continue
}

async fn one_key(
    ctx: &mut Ctx<'_>,
    text: &str,
    key: ReadKey<'_>,
    cas: bool,
) -> Result<(), KeyFailure> {
    let o = key.options;
    if o.abort {
        ctx.session.leases.release(key.queue, key.reader);
        return Ok(());
    }
    if o.close {
        if let Some((reader, id)) = ctx.session.leases.pop_oldest(key.queue, key.reader) {
            match reader.confirm_async(id).await {
                // Unknown (timed out) or deleted: nothing left to confirm.
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(KeyFailure::Engine(e)),
            }
        }
    }
    if !o.takes() {
        return Ok(());
    }
    let mode = if o.open {
        TakeMode::Lease
    } else if o.peek {
        TakeMode::Peek
    } else {
        TakeMode::Take
    };
    let wait_ms = o.wait_ms.unwrap_or(0).min(ctx.shared.limits.wait_ms_max());
    let wait = Duration::from_millis(wait_ms);
    if o.peek {
        ctx.metrics.peeks.add(1);
    }
    if !wait.is_zero() {
        // A wait uses the connection (to send what is pending, to notice a close), so
        // it holds its own clone of the handle.
        let reader = reader_handle(ctx, key.queue, key.reader).map_err(KeyFailure::Engine)?;
        let result = match take(ctx, &reader, mode, wait).await {
            Waited::Gone => return Err(KeyFailure::Gone),
            Waited::Done(result) => result,
        };
        if !is_stale(&result) {
            let leases = &mut ctx.session.leases;
            return deliver(ctx.metrics, leases, ctx.out, &reader, result, text, cas);
        }
        // Deleted during the wait: look once more below, on a fresh handle.
        ctx.session.handles.evict(key.queue);
    }
    // A look without a wait borrows the cached handle. A handle on a queue deleted
    // since it was cached answers NotFound: forget it and look once more.
    let store = &ctx.shared.store;
    let mut evicted = false;
    loop {
        let reader = ctx
            .session
            .handles
            .reader(store, key.queue, key.reader)
            .map_err(KeyFailure::Engine)?;
        let result = reader.take_async(mode, Duration::ZERO).await;
        if is_stale(&result) && !evicted {
            evicted = true;
            ctx.session.handles.evict(key.queue);
            continue;
        }
        let leases = &mut ctx.session.leases;
        return deliver(ctx.metrics, leases, ctx.out, reader, result, text, cas);
    }
}

/// Puts what a look found into the reply, and keeps its lease.
fn deliver(
    metrics: &LoopMetrics,
    leases: &mut Leases,
    out: &mut BytesMut,
    reader: &Reader,
    result: weir::Result<Option<Taken>>,
    text: &str,
    cas: bool,
) -> Result<(), KeyFailure> {
    match result.map_err(KeyFailure::Engine)? {
        Some(taken) => {
            metrics.get_hits.add(1);
            if let Some(id) = taken.lease {
                leases.push(reader, id);
            }
            put_value(out, text, &taken.item, cas);
        }
        None => metrics.get_misses.add(1),
    }
    Ok(())
}
