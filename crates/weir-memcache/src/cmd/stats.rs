//! `stats`: memcache's general `STAT` lines, then per queue and per named reader
//! (`queue_NAME+READER_...`, as Kestrel names fanout queues), then `END`.
//! `stats settings`: the server's settings, memcached's names where they exist.
//! `stats reset`: the server's counters that `stats` shows (connections, commands,
//! hits and misses, bytes) count from zero again, as memcached's do; `RESET`. The
//! queues' own counters (`total_items`, `expired_items`, ...) are the queues' state and
//! stay, and `/metrics` is never reset (Prometheus counters only grow): the reset is a
//! baseline subtracted from what `stats` shows.
//!
//! The reply for thousands of queues is megabytes: it is built on the blocking pool,
//! not on the event loop, so other connections are not held up meanwhile.

use std::sync::atomic::Ordering::Relaxed;

use bytes::{BufMut, BytesMut};

use super::ctx::{Ctx, Flow};
use super::replies::{blocking, put_failure, put_u64};
use crate::metrics::{Metrics, StatsBaseline};
use crate::parse::CommandKind;
use crate::reply;

fn stat(out: &mut BytesMut, name: &str, value: u64) {
    out.put_slice(b"STAT ");
    out.put_slice(name.as_bytes());
    out.put_u8(b' ');
    put_u64(out, value);
    out.put_slice(b"\r\n");
}

fn stat_text(out: &mut BytesMut, name: &str, value: &str) {
    out.put_slice(b"STAT ");
    out.put_slice(name.as_bytes());
    out.put_u8(b' ');
    out.put_slice(value.as_bytes());
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

/// The server's counters as `stats` shows them: since the start or the last reset.
fn counters(m: &Metrics) -> StatsBaseline {
    let now = StatsBaseline {
        total_connections: m.connections_total.load(Relaxed),
        cmd_get: m.command_count(CommandKind::Get),
        cmd_set: m.command_count(CommandKind::Set),
        cmd_peek: m.peeks(),
        get_hits: m.get_hits(),
        get_misses: m.get_misses(),
        bytes_read: m.bytes_read(),
        bytes_written: m.bytes_written(),
    };
    now.since(&m.stats_baseline())
}

pub async fn execute(ctx: &mut Ctx<'_>) -> Flow {
    let shared = ctx.shared;
    let stats = match shared.backend.stats(None).await {
        Ok(stats) => stats,
        Err(e) => {
            put_failure(ctx.out.replies(), &e.into());
            return Flow::Continue;
        }
    };
    // Thousands of queues make many lines: formatted on the blocking pool.
    let queues = match blocking(move || queue_lines(&stats)).await {
        Ok(lines) => lines,
        Err(f) => {
            put_failure(ctx.out.replies(), &f);
            return Flow::Continue;
        }
    };
    let m = &shared.metrics;
    let out = ctx.out.replies();
    let c = counters(m);
    stat(out, "pid", u64::from(std::process::id()));
    stat(out, "uptime", shared.started.elapsed().as_secs());
    stat(out, "time", shared.backend.now_ms() / 1000);
    stat_text(out, "version", concat!("weir-", env!("CARGO_PKG_VERSION")));
    stat(out, "curr_items", queues.items);
    stat(out, "total_items", queues.total_items);
    stat(out, "bytes", queues.bytes);
    stat(out, "curr_connections", m.connections_current.load(Relaxed));
    stat(out, "total_connections", c.total_connections);
    stat(out, "cmd_get", c.cmd_get);
    stat(out, "cmd_set", c.cmd_set);
    stat(out, "cmd_peek", c.cmd_peek);
    stat(out, "get_hits", c.get_hits);
    stat(out, "get_misses", c.get_misses);
    stat(out, "bytes_read", c.bytes_read);
    stat(out, "bytes_written", c.bytes_written);
    out.put_slice(&queues.lines);
    out.put_slice(reply::END);
    Flow::Continue
}

/// What the queues contribute to `stats`: the totals and the per-queue lines.
struct QueueLines {
    items: u64,
    total_items: u64,
    bytes: u64,
    lines: BytesMut,
}

fn queue_lines(stats: &[weir_backend::QueueStats]) -> QueueLines {
    let mut all = QueueLines {
        items: 0,
        total_items: 0,
        bytes: 0,
        lines: BytesMut::new(),
    };
    let out = &mut all.lines;
    for q in stats {
        all.items += q.items;
        all.total_items += q.total_items;
        all.bytes += q.bytes;
        let name = q.name.as_str();
        queue_stat(out, name, "", "items", q.items);
        queue_stat(out, name, "", "bytes", q.bytes);
        queue_stat(out, name, "", "total_items", q.total_items);
        queue_stat(out, name, "", "expired_items", q.expired);
        queue_stat(out, name, "", "discarded", q.discarded);
        queue_stat(out, name, "", "dead_lettered", q.dead_lettered);
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
            queue_stat(out, name, &r.name, "dead_lettered", r.dead_lettered);
            queue_stat(out, name, &r.name, "open_transactions", r.open_leases);
            queue_stat(out, name, &r.name, "waiters", r.waiters);
            queue_stat(out, name, &r.name, "age", r.age_ms);
        }
    }
    all
}

/// `stats settings`.
pub fn settings(ctx: &mut Ctx<'_>) -> Flow {
    let shared = ctx.shared;
    let limits = shared.limits.get();
    let out = ctx.out.replies();
    let s = &shared.settings;
    stat_text(out, "listen", &s.listen);
    stat_text(out, "http_listen", &s.http_listen);
    stat_text(out, "data_dir", &s.data_dir.display().to_string());
    stat(out, "maxconns", s.connections_max as u64);
    stat(out, "num_threads", s.threads as u64);
    stat(out, "item_size_max", limits.item_size_bytes_max);
    stat(out, "line_bytes_max", limits.line_bytes_max as u64);
    stat(out, "get_keys_max", limits.get_keys_max as u64);
    stat(out, "max_open_reads", limits.open_reads_max);
    stat(out, "request_timeout_ms", limits.request_timeout_ms);
    stat(out, "wait_ms_max", limits.wait_ms_max);
    stat(out, "max_queues", shared.backend.queues_max() as u64);
    stat(out, "queue_files_max", s.files_open_max as u64);
    stat_text(
        out,
        "shutdown_command",
        if limits.shutdown_enabled { "yes" } else { "no" },
    );
    stat_text(
        out,
        "flush_all_reply",
        if limits.flush_all_kestrel {
            "kestrel"
        } else {
            "ok"
        },
    );
    stat_text(
        out,
        "reserved_queues_writable",
        if limits.reserved_queues_writable {
            "yes"
        } else {
            "no"
        },
    );
    // Where the queues live, and the backend's own restart-only settings.
    stat_text(out, "backend", shared.backend.kind_name());
    for (key, value) in shared.backend.settings() {
        stat_text(out, key, &value);
    }
    out.put_slice(reply::END);
    Flow::Continue
}

/// `stats reset`.
pub fn reset(ctx: &mut Ctx<'_>) -> Flow {
    let m = &ctx.shared.metrics;
    let now = counters(m).plus(&m.stats_baseline());
    m.set_stats_baseline(now);
    ctx.out.put(reply::RESET);
    Flow::Continue
}
