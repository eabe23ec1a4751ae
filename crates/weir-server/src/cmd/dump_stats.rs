//! `dump_stats [QUEUE...]`: Kestrel's block form, one block per queue (all queues when
//! none is named) and one per named reader as `queue 'NAME+READER'`, then `END`.

use bytes::{BufMut, BytesMut};

use super::{put_u64, Ctx, Flow};

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

pub fn execute(ctx: &mut Ctx<'_>, names: &str) -> Flow {
    let store = &ctx.shared.store;
    let mut wanted: Vec<String> = names
        .split(' ')
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect();
    if wanted.is_empty() {
        wanted = store.queue_names();
    }
    let out = &mut *ctx.out;
    for name in &wanted {
        let Ok(Some(q)) = store.existing_queue(name) else {
            continue;
        };
        let s = q.stats();
        open_block(out, &s.name, "");
        field(out, "items", s.items);
        field(out, "bytes", s.bytes);
        field(out, "total_items", s.total_items);
        field(out, "logsize", s.disk_bytes);
        field(out, "expired_items", s.expired);
        field(out, "discarded", s.discarded);
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
            field(out, "open_transactions", r.open_leases);
            field(out, "waiters", r.waiters);
            field(out, "age", r.age_ms);
            out.put_slice(b"}\r\n");
        }
    }
    out.put_slice(b"END\r\n");
    Flow::Continue
}
