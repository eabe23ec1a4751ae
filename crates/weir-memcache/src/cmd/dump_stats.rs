//! `dump_stats [QUEUE...]`: Kestrel's block form, one block per queue (all queues when
//! none is named) and one per named reader as `queue 'NAME+READER'`, then `END`.

use bytes::{BufMut, BytesMut};

use super::ctx::{Ctx, Flow};
use super::replies::{blocking, put_failure, put_u64};
use crate::reply;

fn field(out: &mut BytesMut, name: &str, value: u64) {
    out.put_slice(b"  ");
    out.put_slice(name.as_bytes());
    out.put_u8(b'=');
    put_u64(out, value);
    out.put_slice(b"\r\n");
}

fn open_block(out: &mut BytesMut, queue: &str, reader: &str) {
    out.put_slice(b"queue '");
    out.put_slice(queue.as_bytes());
    if !reader.is_empty() {
        out.put_u8(b'+');
        out.put_slice(reader.as_bytes());
    }
    out.put_slice(b"' {\r\n");
}

/// Thousands of queues make a large reply: it is built on the blocking pool.
pub async fn execute(ctx: &mut Ctx<'_>, names: &str) -> Flow {
    let wanted: Vec<String> = names
        .split(' ')
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect();
    let wanted = (!wanted.is_empty()).then_some(wanted);
    let stats = match ctx.shared.backend.stats(wanted).await {
        Ok(stats) => stats,
        Err(e) => {
            put_failure(ctx.out.replies(), &e.into());
            return Flow::Continue;
        }
    };
    match blocking(move || blocks(&stats)).await {
        Ok(bytes) => ctx.out.put(&bytes),
        Err(f) => {
            put_failure(ctx.out.replies(), &f);
            return Flow::Continue;
        }
    }
    ctx.out.put(reply::END);
    Flow::Continue
}

/// The blocks of the queues' stats, in order.
fn blocks(stats: &[weir_backend::QueueStats]) -> BytesMut {
    let mut out = BytesMut::new();
    let out = &mut out;
    for s in stats {
        open_block(out, &s.name, "");
        field(out, "items", s.items);
        field(out, "bytes", s.bytes);
        field(out, "total_items", s.total_items);
        field(out, "logsize", s.disk_bytes);
        field(out, "expired_items", s.expired);
        field(out, "discarded", s.discarded);
        field(out, "dead_lettered", s.dead_lettered);
        field(out, "open_transactions", s.open_leases);
        field(out, "waiters", s.waiters);
        field(out, "age", s.age_ms);
        out.put_slice(b"}\r\n");
        for r in s.readers.iter().filter(|r| !r.name.is_empty()) {
            open_block(out, &s.name, &r.name);
            field(out, "items", r.items);
            field(out, "bytes", r.bytes);
            field(out, "taken_items", r.taken);
            field(out, "confirmed_items", r.confirmed);
            field(out, "expired_items", r.expired);
            field(out, "discarded", r.discarded);
            field(out, "dead_lettered", r.dead_lettered);
            field(out, "open_transactions", r.open_leases);
            field(out, "waiters", r.waiters);
            field(out, "age", r.age_ms);
            out.put_slice(b"}\r\n");
        }
    }
    std::mem::take(out)
}
