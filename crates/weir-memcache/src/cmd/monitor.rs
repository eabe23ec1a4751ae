//! `monitor QUEUE SECONDS [MAX_ITEMS]`: Kestrel's streaming read. For up to SECONDS,
//! every item that is or becomes available is taken under a lease held by this
//! connection and sent at once, up to MAX_ITEMS; then `END`. The client confirms
//! with `confirm QUEUE N` (or `get QUEUE/close`); what it does not confirm goes back
//! when it disconnects. `open_reads_max` does not apply; [`MONITOR_ITEMS_MAX`] and
//! [`MONITOR_SECONDS_MAX`] do.

use std::time::{Duration, Instant};

use weir_backend::TakeMode;

use super::ctx::{Ctx, Flow};
use super::replies::{put_engine_error, put_value};
use super::wait::{reader_handle, take, Waited};
use crate::leases::LEASES_PER_CONNECTION_MAX;
use crate::reply;
use crate::request::ReadKey;

/// Most items one `monitor` hands out.
pub const MONITOR_ITEMS_MAX: u64 = 10_000;
/// Longest a `monitor` runs.
pub const MONITOR_SECONDS_MAX: u64 = 3_600;

pub async fn execute(
    ctx: &mut Ctx<'_>,
    parsed: ReadKey<'_>,
    seconds: u64,
    items_max: Option<u64>,
) -> Flow {
    let room = LEASES_PER_CONNECTION_MAX.saturating_sub(ctx.session.leases.total()) as u64;
    let items_max = items_max
        .unwrap_or(MONITOR_ITEMS_MAX)
        .min(MONITOR_ITEMS_MAX)
        .min(room);
    let deadline = Instant::now() + Duration::from_secs(seconds.min(MONITOR_SECONDS_MAX));
    let reader = match reader_handle(ctx, parsed.queue, parsed.reader).await {
        Ok(r) => r,
        Err(e) => {
            put_engine_error(ctx.out.replies(), &e);
            return Flow::Continue;
        }
    };
    let mut sent = 0;
    while sent < items_max {
        let remaining = deadline.saturating_duration_since(Instant::now());
        match take(ctx, &reader, TakeMode::Lease, remaining).await {
            Waited::Gone => return Flow::Close,
            Waited::Done(Err(e)) => {
                put_engine_error(ctx.out.replies(), &e);
                return Flow::Continue;
            }
            Waited::Done(Ok(None)) => break,
            Waited::Done(Ok(Some(taken))) => {
                if let Some(id) = taken.lease {
                    // `room` bounds `items_max`; refused anyway, the item went back.
                    if ctx.session.leases.push(&reader, id).is_err() {
                        ctx.out.put(reply::TOO_MANY_OPEN_ITEMS);
                        return Flow::Continue;
                    }
                }
                // The key as sent, reader included, as `get` does (and as Kestrel,
                // whose fanout queue `q+r` is a queue of that name).
                put_value(ctx.out.replies(), parsed.text, &taken.item, false);
                sent += 1;
            }
        }
        // Items already there are taken without a wait, and a wait writes what is
        // pending only when it starts: bound what piles up in between.
        if !ctx.out.write_if_over(ctx.metrics).await {
            return Flow::Close;
        }
    }
    ctx.out.put(reply::END);
    Flow::Continue
}
