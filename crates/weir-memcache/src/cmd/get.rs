//! `get KEY...` / `gets KEY...`: take, lease, confirm, release or peek, per key.
//!
//! Per key, in this order: `abort` releases this connection's leases on the reader;
//! `close` confirms its oldest lease there; then `open` takes under a lease, `peek`
//! looks, and a plain key takes and confirms at once, each waiting up to `t=MS`. The
//! lease rules (`open_reads_max`; no plain take while holding a lease; at most
//! [`LEASES_PER_CONNECTION_MAX`] in all) are checked for the whole request before
//! anything happens, counting what earlier keys of it open and close, so a refused
//! request changes nothing. Replies past [`crate::shared::OUTPUT_BYTES_FLUSH_AT`] are written between
//! keys, so a request of many keys for large items is not held whole in memory.
//! `gets` adds the item's sequence number as memcache's CAS field, for clients that
//! expect one.

use std::collections::HashMap;
use std::time::Duration;

use bytes::BytesMut;
use weir_backend::{Kind, Reader, TakeMode, Taken};

use super::ctx::{Ctx, Flow};
use super::replies::{put_engine_error, put_value};
use super::wait::{is_stale, reader_handle, take, Waited};
use crate::leases::{Leases, LEASES_PER_CONNECTION_MAX};
use crate::metrics::LoopMetrics;
use crate::reply;
use crate::request::{GetKeys, ReadKey};

enum KeyFailure {
    Engine(weir_backend::Error),
    /// A fixed reply in place of `END`.
    Refused(&'static [u8]),
    Gone,
}

impl From<weir_backend::Error> for KeyFailure {
    fn from(e: weir_backend::Error) -> KeyFailure {
        KeyFailure::Engine(e)
    }
}

pub async fn execute(ctx: &mut Ctx<'_>, keys: GetKeys<'_>, cas: bool) -> Flow {
    // The common request, one plain key on a connection that holds no lease, cannot
    // break a lease rule: it skips the check.
    let plain_single = ctx.session.leases.total() == 0
        && keys.len() == 1
        && keys.iter().all(|key| key.options.is_plain());
    if !plain_single {
        let open_reads_max = ctx.limits.open_reads_max;
        if let Err(reply) = check_leases(&ctx.session.leases, keys, open_reads_max) {
            ctx.out.put(reply);
            return Flow::Continue;
        }
    }
    for key in keys.iter() {
        match serve_key(ctx, key, cas).await {
            Ok(()) => {}
            Err(KeyFailure::Gone) => return Flow::Close,
            Err(KeyFailure::Engine(e)) => {
                // In place of END: the client must not take a partial reply as whole.
                put_engine_error(ctx.out.replies(), &e);
                return Flow::Continue;
            }
            Err(KeyFailure::Refused(reply)) => {
                ctx.out.put(reply);
                return Flow::Continue;
            }
        }
        // Many keys for large items: write as we go, so one request never holds more
        // than about one item past the threshold in memory.
        if !ctx.out.write_if_over(ctx.metrics).await {
            return Flow::Close;
        }
    }
    ctx.out.put(reply::END);
    Flow::Continue
}

/// The lease rules for the whole request, before any of it runs, so a refused request
/// changes nothing. The keys are replayed in execution order against running counts:
/// per reader (a key may repeat, or name a reader both as `q.r` and `q+r`) and over
/// all readers. Per key: `abort` releases every lease on the reader, `close` confirms
/// one, then `open` takes one. An `open` that finds nothing takes nothing, so the
/// counts are an upper bound on what execution will hold.
fn check_leases(
    leases: &Leases,
    keys: GetKeys<'_>,
    open_reads_max: u64,
) -> Result<(), &'static [u8]> {
    // Only readers whose count the request changes; others are read from `leases`.
    let mut running: HashMap<(&str, &str), u64> = HashMap::new();
    let mut total = leases.total() as u64;
    for key in keys.iter() {
        let reader = (key.queue, key.reader);
        let held = match running.get(&reader) {
            Some(&n) => n,
            None => leases.count(key.queue, key.reader) as u64,
        };
        debug_assert!(held <= total);
        let o = key.options;
        let mut after = held;
        if o.abort {
            total -= after;
            after = 0;
        }
        if o.close && after > 0 {
            after -= 1;
            total -= 1;
        }
        if o.is_plain() && after > 0 {
            return Err(reply::CLOSE_FIRST);
        }
        if o.open {
            if after >= open_reads_max {
                return Err(reply::CLOSE_FIRST);
            }
            // Leases over many readers: bounded per connection too.
            if total >= LEASES_PER_CONNECTION_MAX as u64 {
                return Err(reply::TOO_MANY_OPEN_ITEMS);
            }
            after += 1;
            total += 1;
        }
        if after != held {
            running.insert(reader, after);
        }
    }
    Ok(())
}

async fn serve_key(ctx: &mut Ctx<'_>, key: ReadKey<'_>, cas: bool) -> Result<(), KeyFailure> {
    let o = key.options;
    if o.abort {
        ctx.session.leases.release(key.queue, key.reader);
        return Ok(());
    }
    if o.touch {
        return touch_all(ctx, &key).await;
    }
    if o.close {
        close_oldest(ctx, &key).await?;
    }
    if !o.takes() {
        return Ok(());
    }
    take_waiting(ctx, &key, cas).await
}

/// `touch`: every lease this connection holds on the key's reader now times out the
/// queue's `open_timeout` from now (on JetStream, one AckWait). One no longer open
/// (timed out already) is forgotten: its item may be another client's by now.
async fn touch_all(ctx: &mut Ctx<'_>, key: &ReadKey<'_>) -> Result<(), KeyFailure> {
    let Some((reader, ids)) = ctx.session.leases.all(key.queue, key.reader) else {
        return Ok(());
    };
    for id in ids {
        match reader.touch(&id, None).await {
            Ok(true) => {}
            Ok(false) => {
                ctx.session.leases.remove(key.queue, key.reader, &id);
            }
            Err(e) if e.kind() == Kind::NotFound => {}
            Err(e) => return Err(KeyFailure::Engine(e)),
        }
    }
    Ok(())
}

/// `close`: confirms this connection's oldest lease on the key's reader. The lease
/// is forgotten only once confirmed: one whose confirm failed stays held, and goes
/// back when the connection ends.
async fn close_oldest(ctx: &mut Ctx<'_>, key: &ReadKey<'_>) -> Result<(), KeyFailure> {
    let Some((reader, id)) = ctx.session.leases.oldest(key.queue, key.reader) else {
        return Ok(());
    };
    match reader.confirm(&id).await {
        // Unknown (timed out) or deleted: nothing left to confirm.
        Ok(_) => {}
        Err(e) if e.kind() == Kind::NotFound => {}
        Err(e) => return Err(KeyFailure::Engine(e)),
    }
    ctx.session.leases.remove(key.queue, key.reader, &id);
    Ok(())
}

/// `open`, `peek` or a plain take, waiting up to the key's `t=MS`.
async fn take_waiting(ctx: &mut Ctx<'_>, key: &ReadKey<'_>, cas: bool) -> Result<(), KeyFailure> {
    let o = key.options;
    let mode = if o.open {
        TakeMode::Lease
    } else if o.peek {
        TakeMode::Peek
    } else {
        TakeMode::Take
    };
    if o.peek {
        ctx.metrics.peeks.add(1);
    }
    let wait_ms = o.wait_ms.unwrap_or(0).min(ctx.limits.wait_ms_max);
    let wait = Duration::from_millis(wait_ms);
    if !wait.is_zero() {
        // A wait uses the connection (to send what is pending, to notice a close), so
        // it holds its own clone of the handle.
        let reader = reader_handle(ctx, key.queue, key.reader).await?;
        let result = match take(ctx, &reader, mode, wait).await {
            Waited::Gone => return Err(KeyFailure::Gone),
            Waited::Done(result) => result,
        };
        if !is_stale(&result) {
            let leases = &mut ctx.session.leases;
            let out = ctx.out.replies();
            return deliver(ctx.metrics, leases, out, &reader, result, key.text, cas);
        }
        // Deleted during the wait: look once more, on a fresh handle.
        ctx.session.handles.evict(key.queue);
    }
    take_now(ctx, key, mode, cas).await
}

/// A look without a wait, on the cached handle. A handle on a queue deleted since it
/// was cached answers NotFound: forget it and look once more.
async fn take_now(
    ctx: &mut Ctx<'_>,
    key: &ReadKey<'_>,
    mode: TakeMode,
    cas: bool,
) -> Result<(), KeyFailure> {
    let backend = &ctx.shared.backend;
    let mut evicted = false;
    loop {
        let Some(reader) = ctx
            .session
            .handles
            .reader_to_look(backend, key.queue, key.reader)
            .await?
        else {
            // No such queue (JetStream creates none for a look): nothing to take.
            ctx.metrics.get_misses.add(1);
            return Ok(());
        };
        let result = reader.take(mode, Duration::ZERO).await;
        if is_stale(&result) && !evicted {
            evicted = true;
            ctx.session.handles.evict(key.queue);
            continue;
        }
        let leases = &mut ctx.session.leases;
        let out = ctx.out.replies();
        return deliver(ctx.metrics, leases, out, reader, result, key.text, cas);
    }
}

/// Puts what a look found into the reply, and keeps its lease.
fn deliver(
    metrics: &LoopMetrics,
    leases: &mut Leases,
    out: &mut BytesMut,
    reader: &Reader,
    result: weir_backend::Result<Option<Taken>>,
    text: &str,
    cas: bool,
) -> Result<(), KeyFailure> {
    match result.map_err(KeyFailure::Engine)? {
        Some(taken) => {
            metrics.get_hits.add(1);
            if let Some(id) = taken.lease {
                // `check_leases` left room; refused anyway, the item went back.
                if leases.push(reader, id).is_err() {
                    return Err(KeyFailure::Refused(reply::TOO_MANY_OPEN_ITEMS));
                }
            }
            put_value(out, text, &taken.item, cas);
        }
        None => metrics.get_misses.add(1),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leases::TooManyLeases;

    fn check(leases: &Leases, keys: &str, max: u64) -> Result<(), &'static [u8]> {
        let mut spans = Vec::new();
        let keys = GetKeys::parse(keys, usize::MAX, &mut spans).map_err(|_| &b"bad key"[..])?;
        check_leases(leases, keys, max)
    }

    #[test]
    fn lease_rules_run_over_the_whole_request() {
        let none = Leases::default();
        assert_eq!(
            check(&none, "q/open q/open", 1),
            Err(crate::reply::CLOSE_FIRST)
        );
        assert_eq!(check(&none, "q/open q", 1), Err(crate::reply::CLOSE_FIRST));
        assert_eq!(
            check(&none, "q.r/open q+r/open", 1),
            Err(crate::reply::CLOSE_FIRST)
        );
        assert_eq!(check(&none, "q/open/open", 1), Ok(()));
        assert_eq!(check(&none, "q/open q/open", 2), Ok(()));
        assert_eq!(
            check(&none, "q/open q/open q/open", 2),
            Err(crate::reply::CLOSE_FIRST)
        );
        assert_eq!(check(&none, "q/open q.r/open Q/open", 1), Ok(()));
        assert_eq!(check(&none, "q/close/open q/close/open", 1), Ok(()));
        assert_eq!(
            check(&none, "q/open q/close q/open q", 1),
            Err(crate::reply::CLOSE_FIRST)
        );
        assert_eq!(check(&none, "q/open q/close q/open q/abort q", 1), Ok(()));
        assert_eq!(check(&none, "q/open q/peek q.r", 1), Ok(()));
        assert_eq!(check(&none, "q q q/close q/abort", 1), Ok(()));
    }

    #[test]
    fn the_connection_cap_counts_across_keys_and_push_refuses_past_it(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = weir::Store::open(dir.path())?;
        let queue = store.queue("a")?;
        let engine_reader = queue.reader("")?;
        let reader = Reader::Embedded(engine_reader.clone());
        let mut leases = Leases::default();
        for _ in 0..LEASES_PER_CONNECTION_MAX {
            queue.append(b"x", Default::default())?;
            let lease = engine_reader.take_leased()?.ok_or("an item")?;
            let id = weir_backend::Lease::Embedded(lease.id);
            assert_eq!(leases.push(&reader, id), Ok(()));
        }
        let max = u64::MAX;
        assert_eq!(
            check(&leases, "b/open", max),
            Err(crate::reply::TOO_MANY_OPEN_ITEMS)
        );
        assert_eq!(
            check(&leases, "a/open", max),
            Err(crate::reply::TOO_MANY_OPEN_ITEMS)
        );
        assert_eq!(check(&leases, "a/close b/open", max), Ok(()));
        assert_eq!(
            check(&leases, "a/close b/open c/open", max),
            Err(crate::reply::TOO_MANY_OPEN_ITEMS)
        );
        assert_eq!(check(&leases, "a/abort b/open c/open", max), Ok(()));
        // Past the cap, push refuses (no panic) and gives the item back.
        queue.append(b"y", Default::default())?;
        let lease = engine_reader.take_leased()?.ok_or("an item")?;
        let id = weir_backend::Lease::Embedded(lease.id);
        assert_eq!(leases.push(&reader, id), Err(TooManyLeases));
        assert_eq!(leases.total(), LEASES_PER_CONNECTION_MAX);
        let again = engine_reader.take()?.map(|item| item.data.to_vec());
        assert_eq!(again, Some(b"y".to_vec()));
        Ok(())
    }
}
