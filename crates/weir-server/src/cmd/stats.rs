//! `stats`: memcache's general `STAT` lines, then per queue and per named reader
//! (`queue_NAME+READER_...`, as Kestrel names fanout queues), then `END`.

use std::sync::atomic::Ordering::Relaxed;

use bytes::{BufMut, BytesMut};

use super::{put_u64, Ctx, Flow};
use crate::parse::CommandKind;

fn stat(out: &mut BytesMut, name: &str, value: u64) {
    out.put_slice(b"STAT ");
    out.put_slice(name.as_bytes());
    out.put_u8(b' ');
    put_u64(out, value);
    out.put_slice(b"\r\n");
}

fn queue_stat(out: &mut BytesMut, queue: &str, reader: &str, field: &str, value: u64) {
    out.put_slice(b"STAT queue_");
    out.put_slice(queue.as_bytes());
    if !reader.is_empty() {
        out.put_u8(b'+');
        out.put_slice(reader.as_bytes());
    }
    out.put_u8(b'_');
    out.put_slice(field.as_bytes());
    out.put_u8(b' ');
    put_u64(out, value);
    out.put_slice(b"\r\n");
}

pub fn execute(ctx: &mut Ctx<'_>) -> Flow {
    let shared = ctx.shared;
    let m = &shared.metrics;
    let out = &mut *ctx.out;
    let queues: Vec<weir::QueueStats> = shared
        .store
        .queue_names()
        .iter()
        .filter_map(|name| shared.store.existing_queue(name).ok().flatten())
        .map(|q| q.stats())
        .collect();
    stat(out, "pid", u64::from(std::process::id()));
    stat(out, "uptime", shared.started.elapsed().as_secs());
    stat(out, "time", weir::now_ms() / 1000);
    out.put_slice(b"STAT version weir-");
    out.put_slice(env!("CARGO_PKG_VERSION").as_bytes());
    out.put_slice(b"\r\n");
    stat(out, "curr_items", queues.iter().map(|q| q.items).sum());
    stat(
        out,
        "total_items",
        queues.iter().map(|q| q.total_items).sum(),
    );
    stat(out, "bytes", queues.iter().map(|q| q.bytes).sum());
    stat(out, "curr_connections", m.connections_current.load(Relaxed));
    stat(out, "total_connections", m.connections_total.load(Relaxed));
    stat(out, "cmd_get", m.command_count(CommandKind::Get));
    stat(out, "cmd_set", m.command_count(CommandKind::Set));
    stat(out, "cmd_peek", m.peeks());
    stat(out, "get_hits", m.get_hits());
    stat(out, "get_misses", m.get_misses());
    stat(out, "bytes_read", m.bytes_read());
    stat(out, "bytes_written", m.bytes_written());
    for q in &queues {
        let name = q.name.as_str();
        queue_stat(out, name, "", "items", q.items);
        queue_stat(out, name, "", "bytes", q.bytes);
        queue_stat(out, name, "", "total_items", q.total_items);
        queue_stat(out, name, "", "expired_items", q.expired);
        queue_stat(out, name, "", "discarded", q.discarded);
        queue_stat(out, name, "", "open_transactions", q.open_leases);
        queue_stat(out, name, "", "waiters", q.waiters);
        queue_stat(out, name, "", "age", q.age_ms);
        queue_stat(out, name, "", "logsize", q.disk_bytes);
        for r in q.readers.iter().filter(|r| !r.name.is_empty()) {
            queue_stat(out, name, &r.name, "items", r.items);
            queue_stat(out, name, &r.name, "bytes", r.bytes);
            queue_stat(out, name, &r.name, "taken_items", r.taken);
            queue_stat(out, name, &r.name, "confirmed_items", r.confirmed);
            queue_stat(out, name, &r.name, "expired_items", r.expired);
            queue_stat(out, name, &r.name, "discarded", r.discarded);
            queue_stat(out, name, &r.name, "open_transactions", r.open_leases);
            queue_stat(out, name, &r.name, "waiters", r.waiters);
            queue_stat(out, name, &r.name, "age", r.age_ms);
        }
    }
    out.put_slice(b"END\r\n");
    Flow::Continue
}
