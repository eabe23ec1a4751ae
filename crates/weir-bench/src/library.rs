//! library: popout's suite on the engine itself (`weir::Store` in a temporary
//! directory), with the physical references the engine issue measures it against.
//!
//! Cases, in order (records of 512 B unless said):
//! - references on the same filesystem: a plain loop of 1 MiB writes (sequential
//!   bandwidth) and a plain loop of 512 B write + fdatasync (the synced-write ceiling);
//! - append throughput with 1, 2 and 8 threads, `buffered` and `synced`, and 64 threads
//!   `synced` (group commit);
//! - 3 writers + 1 reader for a while: successful reads counted, backlog at the end;
//! - one iteration over 1,000,000 kept records (`Queue::iter`);
//! - append+take pairs on an empty queue, then with 8,388,608 items of 1 KiB queued;
//! - reopen of a large backlog (10 GB by default): time to open and the RSS of a fresh
//!   process that opened it, against one that opened an empty store. The opening runs
//!   in a child process (`weir-bench probe-open`) so that this process's own
//!   allocations cannot hide or inflate the difference.
//!
//! Each row carries its reference and the goal the engine issue states, so a reader
//! sees at once which numbers hold.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use indicatif::ProgressBar;
use weir::{AppendOptions, Durability, QueueConfig, Store, StoreOptions};

use crate::report::{f, Cell, Report, Row};

/// Records per `append_batch` call when filling a backlog.
const FILL_BATCH: usize = 1024;

#[derive(Clone, Debug)]
pub struct LibraryParams {
    /// Parent directory of the temporary stores (the filesystem under test).
    pub dir: Option<PathBuf>,
    pub record_bytes: usize,
    /// Duration of each timed write / read+write case.
    pub seconds: f64,
    pub threads: Vec<usize>,
    pub group_threads: usize,
    pub rw_durability: Durability,
    /// Items the reader takes per call in the read+write case.
    pub rw_read_batch: usize,
    pub iter_records: u64,
    pub backlog_bytes: u64,
    pub backlog_item_bytes: usize,
    pub deep_items: u64,
    pub apptake_pairs: u64,
    /// Upper bound on the bytes the sequential-write reference writes.
    pub seq_bytes_max: u64,
}

pub fn parse_durability(s: &str) -> Result<Durability, String> {
    match s {
        "buffered" => Ok(Durability::Buffered),
        "periodic" => Ok(Durability::default()),
        "synced" => Ok(Durability::Synced),
        other => Err(format!(
            "unknown durability {other:?}: buffered, periodic or synced"
        )),
    }
}

fn durability_name(d: Durability) -> &'static str {
    match d {
        Durability::Buffered => "buffered",
        Durability::Periodic(_) => "periodic",
        Durability::Synced => "synced",
    }
}

fn options(durability: Durability) -> StoreOptions {
    StoreOptions {
        defaults: QueueConfig {
            durability,
            ..QueueConfig::default()
        },
        config_for: None,
        ..StoreOptions::default()
    }
}

struct Ctx<'a> {
    p: &'a LibraryParams,
    bar: &'a ProgressBar,
    fill_bar: &'a ProgressBar,
    report: Report,
}

impl Ctx<'_> {
    fn tempdir(&self, what: &str) -> Result<tempfile::TempDir> {
        let prefix = format!("weir-bench-lib-{what}-");
        let mut b = tempfile::Builder::new();
        b.prefix(&prefix);
        match &self.p.dir {
            Some(d) => {
                std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
                b.tempdir_in(d)
            }
            None => b.tempdir(),
        }
        .context("creating a temporary directory for the library suite")
    }

    fn step(&self, msg: String) {
        self.bar.set_message(msg);
    }

    fn done(&self) {
        self.bar.inc(1);
    }
}

/// A row of the library table.
#[allow(clippy::too_many_arguments)]
fn row(
    case: &str,
    threads: usize,
    durability: &str,
    ops: u64,
    seconds: f64,
    rate: f64,
    unit: &str,
) -> Row {
    Row::new()
        .with("case", case)
        .with("target", "weir-lib")
        .with("threads", threads as u64)
        .with("durability", durability)
        .with("ops", ops)
        .with("seconds", f(seconds, 3))
        .with("rate", f(rate, if rate < 100.0 { 3 } else { 0 }))
        .with("unit", unit)
}

/// Adds the reference columns: `measured / reference` against `goal` (pass when
/// `ratio >= goal`, or `<=` when `at_most`).
fn judged(
    row: Row,
    reference: &str,
    reference_value: f64,
    ratio: f64,
    goal: f64,
    at_most: bool,
) -> Row {
    let pass = if at_most {
        ratio <= goal
    } else {
        ratio >= goal
    };
    row.with("reference", reference)
        .with(
            "reference_value",
            f(reference_value, if reference_value < 100.0 { 3 } else { 0 }),
        )
        .with("ratio", f(ratio, 2))
        .with(
            "goal",
            format!("{}{goal}", if at_most { "<=" } else { ">=" }),
        )
        .with("pass", if pass { "yes" } else { "NO" })
}

pub fn run(p: &LibraryParams, bar: &ProgressBar, fill_bar: &ProgressBar) -> Result<Report> {
    let mut ctx = Ctx {
        p,
        bar,
        fill_bar,
        report: Report::new(
            "library",
            format!(
                "library: the engine in-process, {} B records",
                p.record_bytes
            ),
        ),
    };
    let cases = 2 + 2 * p.threads.len() + 1 + 1 + 1 + 1 + 2 + 1;
    bar.set_length(cases as u64);
    let record = crate::proto::payload(p.record_bytes);
    let secs = Duration::from_secs_f64(p.seconds);

    let (seq_records_s, fsync_rate) = references(&mut ctx, &record, secs)?;
    append_cases(&mut ctx, &record, secs, seq_records_s, fsync_rate)?;
    wake_ceiling_case(&mut ctx, fsync_rate, secs);
    read_write_case(&mut ctx, &record, secs)?;
    iterate_case(&mut ctx, &record)?;
    deep_and_reopen(&mut ctx)?;
    Ok(ctx.report)
}

/// The physical references on the same filesystem; returns the sequential bandwidth in
/// records/s and the write+fdatasync rate.
fn references(ctx: &mut Ctx, record: &[u8], secs: Duration) -> Result<(f64, f64)> {
    let p = ctx.p;
    // References on the same filesystem.
    ctx.step("reference: 1 MiB sequential writes".into());
    let (seq_bytes, seq_s) = sequential_writes(ctx, secs)?;
    let seq_mib_s = seq_bytes as f64 / seq_s / (1024.0 * 1024.0);
    let seq_records_s = seq_bytes as f64 / seq_s / p.record_bytes as f64;
    ctx.report.rows.push(row(
        "ref: 1MiB writes",
        1,
        "none",
        seq_bytes / (1024 * 1024),
        seq_s,
        seq_mib_s,
        "MiB/s",
    ));
    ctx.done();
    ctx.step("reference: write+fdatasync loop".into());
    let (sync_ops, sync_s) = fdatasync_loop(ctx, record, secs)?;
    let fsync_rate = sync_ops as f64 / sync_s;
    ctx.report.rows.push(row(
        "ref: write+fdatasync",
        1,
        "fdatasync",
        sync_ops,
        sync_s,
        fsync_rate,
        "writes/s",
    ));
    ctx.done();
    Ok((seq_records_s, fsync_rate))
}

/// Append throughput, buffered and synced, at each thread count, each judged against
/// its goal.
fn append_cases(
    ctx: &mut Ctx,
    record: &[u8],
    secs: Duration,
    seq_records_s: f64,
    fsync_rate: f64,
) -> Result<()> {
    let p = ctx.p;
    // Append throughput.
    let mut buffered_1 = None;
    let mut synced_1 = None;
    for durability in [Durability::Buffered, Durability::Synced] {
        let mut threads: Vec<usize> = p.threads.clone();
        if durability == Durability::Synced {
            threads.push(p.group_threads);
        }
        for &t in &threads {
            let name = durability_name(durability);
            ctx.step(format!("append {name} x{t}"));
            let (ops, s) = write_case(ctx, t, durability, record, secs)
                .with_context(|| format!("append, {t} threads, {name}"))?;
            let rate = ops as f64 / s;
            let r = row("append", t, name, ops, s, rate, "items/s");
            let r = match (durability, t) {
                (Durability::Buffered, 1) => {
                    buffered_1 = Some(rate);
                    // Goal: >= min(1.5M items/s, 80% of sequential bandwidth).
                    let goal_rate = 1_500_000f64.min(0.8 * seq_records_s);
                    judged(
                        r,
                        "min(1.5M/s, 0.8 x seq bw)",
                        goal_rate,
                        rate / goal_rate,
                        1.0,
                        false,
                    )
                }
                (Durability::Buffered, _) => match buffered_1 {
                    Some(b1) => judged(r, "buffered x1", b1, rate / b1, 1.0, false),
                    None => r,
                },
                (Durability::Synced, 1) => {
                    synced_1 = Some(rate);
                    judged(
                        r,
                        "write+fdatasync",
                        fsync_rate,
                        rate / fsync_rate,
                        0.8,
                        false,
                    )
                }
                (Durability::Synced, t) if t == p.group_threads => match synced_1 {
                    Some(s1) => judged(r, "synced x1", s1, rate / s1, 20.0, false),
                    None => r,
                },
                _ => r,
            };
            ctx.report.rows.push(r);
            ctx.done();
        }
    }
    Ok(())
}

/// What group commit can reach at best on this machine: the group's threads woken in
/// rounds as long as one fsync, with no disk and no queue at all.
fn wake_ceiling_case(ctx: &mut Ctx, fsync_rate: f64, secs: Duration) {
    let p = ctx.p;
    // What group commit can reach at best on this machine: the group's threads woken
    // in rounds as long as one fsync, with no disk and no queue at all.
    ctx.step(format!("reference: wake ceiling x{}", p.group_threads));
    let round = Duration::from_secs_f64(1.0 / fsync_rate.max(1.0));
    let (wakes, wake_s) = wake_ceiling(p.group_threads, round, secs);
    let ceiling = wakes as f64 / wake_s;
    ctx.report.rows.push(row(
        "ref: wake ceiling",
        p.group_threads,
        "none",
        wakes,
        wake_s,
        ceiling,
        "wakes/s",
    ));
    if let Some(group) = ctx.report.rows.iter().find_map(|r| {
        let is_group = matches!(r.get("case"), Some(Cell::Text(c)) if c == "append")
            && matches!(r.get("durability"), Some(Cell::Text(d)) if d == "synced")
            && r.get("threads").and_then(|t| t.as_f64()) == Some(p.group_threads as f64);
        if is_group {
            r.get("rate").and_then(|x| x.as_f64())
        } else {
            None
        }
    }) {
        ctx.report.notes.push(format!(
            "synced x{t}: {group:.0}/s = {:.2} x the wake ceiling ({ceiling:.0}/s: {t} \
             threads parked and woken in rounds of one fsync ({:.0} us), no disk, no queue)",
            group / ceiling,
            round.as_secs_f64() * 1e6,
            t = p.group_threads,
        ));
    }
    ctx.done();
}

/// 3 writers + 1 reader.
fn read_write_case(ctx: &mut Ctx, record: &[u8], secs: Duration) -> Result<()> {
    let p = ctx.p;
    // 3 writers + 1 reader.
    ctx.step("3 writers + 1 reader".into());
    let (writes, reads, backlog, s) = read_write(ctx, record, secs)?;
    let total = (writes + reads) as f64 / s;
    let r = row(
        "3 writers + 1 reader",
        4,
        durability_name(p.rw_durability),
        writes + reads,
        s,
        total,
        "ops/s",
    )
    .with("writes/s", f(writes as f64 / s, 0))
    .with("reads/s", f(reads as f64 / s, 0))
    .with("backlog_end", backlog);
    ctx.report.rows.push(judged(
        r,
        "1.5M ops/s",
        1_500_000.0,
        total / 1_500_000.0,
        1.0,
        false,
    ));
    ctx.done();
    Ok(())
}

/// One iteration over kept records.
fn iterate_case(ctx: &mut Ctx, record: &[u8]) -> Result<()> {
    let p = ctx.p;
    // One iteration over kept records.
    ctx.step(format!("iterate {} records", p.iter_records));
    let iter_s = iterate(ctx, record)?;
    let r = row(
        "iterate",
        1,
        "buffered",
        p.iter_records,
        iter_s,
        p.iter_records as f64 / iter_s,
        "items/s",
    )
    .with("iter_seconds", f(iter_s, 3));
    let r = if p.iter_records == 1_000_000 {
        judged(r, "0.5 s", 0.5, iter_s / 0.5, 1.0, true)
    } else {
        r
    };
    ctx.report.rows.push(r);
    ctx.done();
    Ok(())
}

/// Plain 1 MiB writes to a file for `secs` (or `seq_bytes_max`): the page cache and
/// disk bandwidth any append path has to live within.
fn sequential_writes(ctx: &Ctx, secs: Duration) -> Result<(u64, f64)> {
    let dir = ctx.tempdir("seq")?;
    let path = dir.path().join("seq.dat");
    let mut file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let chunk = vec![0x5au8; 1024 * 1024];
    sync_filesystems();
    let start = Instant::now();
    let mut written = 0u64;
    while start.elapsed() < secs && written < ctx.p.seq_bytes_max {
        file.write_all(&chunk)
            .with_context(|| format!("writing {}", path.display()))?;
        written += chunk.len() as u64;
    }
    Ok((written, start.elapsed().as_secs_f64()))
}

/// Plain record-sized write + fdatasync for `secs`: what one synced append can cost
/// at best on this filesystem.
fn fdatasync_loop(ctx: &Ctx, record: &[u8], secs: Duration) -> Result<(u64, f64)> {
    let dir = ctx.tempdir("fsync")?;
    let path = dir.path().join("fsync.dat");
    let mut file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    sync_filesystems();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < secs {
        file.write_all(record)
            .with_context(|| format!("writing {}", path.display()))?;
        file.sync_data()
            .with_context(|| format!("fdatasync {}", path.display()))?;
        n += 1;
    }
    Ok((n, start.elapsed().as_secs_f64()))
}

/// `threads` threads that each park until a coordinator wakes every parked one, once per
/// `round` (as a group commit's leader wakes its round after each fsync), for `secs`;
/// returns (wake-ups, seconds). No disk, no queue: the scheduler's part of group
/// commit alone, an upper bound for synced appends from that many threads.
fn wake_ceiling(threads: usize, round: Duration, secs: Duration) -> (u64, f64) {
    struct Slot {
        woken: AtomicU8,
        thread: std::thread::Thread,
    }
    let parked: Mutex<Vec<Arc<Slot>>> = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let total = AtomicU64::new(0);
    let finished = AtomicUsize::new(0);
    let wake = |parked: &Mutex<Vec<Arc<Slot>>>| {
        let batch = std::mem::take(&mut *parked.lock().unwrap_or_else(|e| e.into_inner()));
        for slot in &batch {
            slot.woken.store(1, Ordering::Release);
            slot.thread.unpark();
        }
    };
    let mut elapsed = 0.0;
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let slot = Arc::new(Slot {
                    woken: AtomicU8::new(0),
                    thread: std::thread::current(),
                });
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    slot.woken.store(0, Ordering::Relaxed);
                    parked
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Arc::clone(&slot));
                    while slot.woken.load(Ordering::Acquire) == 0 {
                        std::thread::park();
                    }
                    n += 1;
                }
                total.fetch_add(n, Ordering::Relaxed);
                finished.fetch_add(1, Ordering::Release);
            });
        }
        let start = Instant::now();
        while start.elapsed() < secs {
            std::thread::sleep(round);
            wake(&parked);
        }
        elapsed = start.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        // Wake the stragglers until every thread has seen `stop`.
        while finished.load(Ordering::Acquire) < threads {
            wake(&parked);
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    (total.load(Ordering::Relaxed), elapsed)
}

/// `threads` threads appending for `secs`; returns (appends, seconds).
fn write_case(
    ctx: &Ctx,
    threads: usize,
    durability: Durability,
    record: &[u8],
    secs: Duration,
) -> Result<(u64, f64)> {
    let dir = ctx.tempdir("write")?;
    // Every timed case starts with nothing dirty in the page cache: none pays for the
    // writeback of an earlier one.
    sync_filesystems();
    let store = Store::open_with(dir.path(), options(durability))?;
    let queue = store.queue("bench")?;
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(threads + 1);
    let (ops, elapsed) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        queue.append(record, AppendOptions::default())?;
                        n += 1;
                    }
                    Ok::<u64, weir::Error>(n)
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        std::thread::sleep(secs);
        stop.store(true, Ordering::Relaxed);
        let mut total = 0u64;
        let mut first_error = None;
        for h in handles {
            match h.join() {
                Ok(Ok(n)) => total += n,
                Ok(Err(e)) => {
                    first_error.get_or_insert_with(|| anyhow!(e));
                }
                Err(_) => {
                    first_error.get_or_insert_with(|| anyhow!("a writer thread panicked"));
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok((total, start.elapsed().as_secs_f64())),
        }
    })?;
    store.close()?;
    Ok((ops, elapsed))
}

/// 3 writers and 1 reader on one queue for `secs`; (writes, successful reads,
/// backlog at the end, seconds).
fn read_write(ctx: &Ctx, record: &[u8], secs: Duration) -> Result<(u64, u64, u64, f64)> {
    let dir = ctx.tempdir("rw")?;
    sync_filesystems();
    let store = Store::open_with(dir.path(), options(ctx.p.rw_durability))?;
    let queue = store.queue("bench")?;
    let reader = queue.reader("")?;
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(5);
    let result = std::thread::scope(|s| {
        let writers: Vec<_> = (0..3)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        queue.append(record, AppendOptions::default())?;
                        n += 1;
                    }
                    Ok::<u64, weir::Error>(n)
                })
            })
            .collect();
        let reading = s.spawn(|| {
            barrier.wait();
            let mut n = 0u64;
            // Writers append one item per call, as popout's suite does; the reader
            // drains with take_batch (the engine's batch take), one lock round per
            // batch instead of per item, so it can keep up with three writers.
            let batch = ctx.p.rw_read_batch;
            while !stop.load(Ordering::Relaxed) {
                if batch <= 1 {
                    if reader.take()?.is_some() {
                        n += 1;
                    }
                } else {
                    n += reader.take_batch(batch)?.len() as u64;
                }
            }
            Ok::<u64, weir::Error>(n)
        });
        barrier.wait();
        let start = Instant::now();
        std::thread::sleep(secs);
        stop.store(true, Ordering::Relaxed);
        let mut writes = 0u64;
        for w in writers {
            writes += w
                .join()
                .map_err(|_| anyhow!("a writer thread panicked"))??;
        }
        let reads = reading
            .join()
            .map_err(|_| anyhow!("the reader thread panicked"))??;
        Ok::<_, anyhow::Error>((writes, reads, start.elapsed().as_secs_f64()))
    })?;
    let backlog = queue.stats().items;
    store.close()?;
    Ok((result.0, result.1, backlog, result.2))
}

/// Appends `count` copies of `record` in batches, with progress.
fn fill(ctx: &Ctx, queue: &weir::Queue, record: &[u8], count: u64, what: &str) -> Result<()> {
    ctx.fill_bar.reset();
    ctx.fill_bar.set_length(count);
    ctx.fill_bar.set_message(what.to_string());
    let batch: Vec<&[u8]> = vec![record; FILL_BATCH];
    let mut left = count;
    while left > 0 {
        let n = left.min(FILL_BATCH as u64) as usize;
        queue.append_batch(&batch[..n], AppendOptions::default())?;
        left -= n as u64;
        ctx.fill_bar.inc(n as u64);
    }
    Ok(())
}

/// One pass of `Queue::iter` over `iter_records` records; seconds.
fn iterate(ctx: &Ctx, record: &[u8]) -> Result<f64> {
    let dir = ctx.tempdir("iter")?;
    let store = Store::open_with(dir.path(), options(Durability::Buffered))?;
    let queue = store.queue("bench")?;
    fill(
        ctx,
        &queue,
        record,
        ctx.p.iter_records,
        "filling for iteration",
    )?;
    let start = Instant::now();
    let mut n = 0u64;
    for item in queue.iter()? {
        let item = item?;
        if item.data.len() != record.len() {
            bail!(
                "iteration returned a record of {} bytes, stored {}",
                item.data.len(),
                record.len()
            );
        }
        n += 1;
    }
    let s = start.elapsed().as_secs_f64();
    if n != ctx.p.iter_records {
        bail!(
            "iteration returned {n} records, stored {}",
            ctx.p.iter_records
        );
    }
    store.close()?;
    Ok(s)
}

/// Waits until every dirty page is written back (`sync(2)`), so a measurement does not
/// pay for the writes that came before it.
fn sync_filesystems() {
    // SAFETY: sync(2) takes no arguments, touches no memory of ours and cannot fail.
    unsafe { libc::sync() };
}

/// `pairs` append+take pairs on `queue`'s default reader; items/s of pairs.
fn append_take(queue: &weir::Queue, record: &[u8], pairs: u64) -> Result<(f64, f64)> {
    let reader = queue.reader("")?;
    let start = Instant::now();
    for _ in 0..pairs {
        queue.append(record, AppendOptions::default())?;
        if reader.take()?.is_none() {
            bail!("take found the queue empty right after an append");
        }
    }
    let s = start.elapsed().as_secs_f64();
    Ok((pairs as f64 / s, s))
}

fn deep_and_reopen(ctx: &mut Ctx) -> Result<()> {
    let p = ctx.p;
    let item = crate::proto::payload(p.backlog_item_bytes);
    let dir = ctx.tempdir("deep")?;
    let store_dir = dir.path().join("store");
    let store = Store::open(&store_dir)?;

    ctx.step("append+take, empty queue".into());
    let shallow = store.queue("shallow")?;
    sync_filesystems();
    let (empty_rate, empty_s) = append_take(&shallow, &item, p.apptake_pairs)?;
    ctx.report.rows.push(row(
        "append+take, empty queue",
        1,
        "periodic",
        p.apptake_pairs,
        empty_s,
        empty_rate,
        "pairs/s",
    ));
    ctx.done();

    ctx.step(format!("append+take, {} queued", p.deep_items));
    let deep = store.queue("deep")?;
    // The reader exists before the fill, so it starts at the oldest item and the
    // backlog stays at deep_items while pairs run.
    deep.reader("")?;
    fill(ctx, &deep, &item, p.deep_items, "filling the deep queue")?;
    // Write the fill back before the clock starts: right after writing gigabytes the
    // kernel is still flushing dirty pages and throttles every writer, which would
    // measure the fill, not a deep queue. The empty case gets the same treatment.
    deep.sync()?;
    sync_filesystems();
    let (deep_rate, deep_s) = append_take(&deep, &item, p.apptake_pairs)?;
    let r = row(
        "append+take, deep queue",
        1,
        "periodic",
        p.apptake_pairs,
        deep_s,
        deep_rate,
        "pairs/s",
    )
    .with("backlog_end", deep.stats().items);
    ctx.report.rows.push(judged(
        r,
        "append+take empty",
        empty_rate,
        deep_rate / empty_rate,
        0.9,
        false,
    ));
    ctx.done();

    reopen_case(ctx, store, store_dir, deep, shallow, &item)
}

/// Fills the deep queue up to the backlog size, closes the store, and times a reopen
/// in a fresh process against an empty store's.
fn reopen_case(
    ctx: &mut Ctx,
    store: Store,
    store_dir: std::path::PathBuf,
    deep: weir::Queue,
    shallow: weir::Queue,
    item: &[u8],
) -> Result<()> {
    let p = ctx.p;
    ctx.step(format!("reopen a {} byte backlog", p.backlog_bytes));
    let want_items = p.backlog_bytes.div_ceil(p.backlog_item_bytes.max(1) as u64);
    let have = deep.stats().items;
    if want_items > have {
        fill(ctx, &deep, item, want_items - have, "filling the backlog")?;
    }
    let items = deep.stats().items;
    drop((deep, shallow));
    store.close()?;
    let disk = crate::sys::disk_usage_bytes(&store_dir)?;
    let empty_dir = ctx.tempdir("empty")?;
    let empty = probe_open(empty_dir.path())?;
    let big = probe_open(&store_dir)?;
    if big.items != items {
        bail!(
            "after reopen the deep queue has {} items, expected {items}",
            big.items
        );
    }
    let rss_delta = big.rss_bytes as f64 - empty.rss_bytes as f64;
    let r = row(
        "reopen backlog",
        1,
        "periodic",
        items,
        big.open_seconds,
        big.open_seconds,
        "seconds",
    )
    .with("backlog_bytes", disk)
    .with("rss_empty_MiB", f(empty.rss_bytes as f64 / 1048576.0, 1))
    .with("rss_reopened_MiB", f(big.rss_bytes as f64 / 1048576.0, 1));
    ctx.report
        .rows
        .push(judged(r, "1 s", 1.0, big.open_seconds, 1.0, true));
    ctx.report.notes.push(format!(
        "reopen: {} items, {:.1} GiB on disk, open {:.3} s, RSS {:.1} MiB vs {:.1} MiB for an empty store (+{:.1} MiB; goal: a few MB)",
        items,
        disk as f64 / (1u64 << 30) as f64,
        big.open_seconds,
        big.rss_bytes as f64 / 1048576.0,
        empty.rss_bytes as f64 / 1048576.0,
        rss_delta / 1048576.0
    ));
    ctx.done();
    Ok(())
}

/// What `weir-bench probe-open DIR` reports.
struct Probe {
    open_seconds: f64,
    rss_bytes: u64,
    items: u64,
}

fn probe_open(dir: &Path) -> Result<Probe> {
    let exe = std::env::current_exe().context("finding weir-bench's own executable")?;
    let out = Command::new(exe)
        .arg("probe-open")
        .arg(dir)
        .output()
        .context("running weir-bench probe-open")?;
    if !out.status.success() {
        bail!(
            "probe-open {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(text.trim())
        .with_context(|| format!("probe-open printed {text:?}"))?;
    let num = |k: &str| {
        v.get(k)
            .and_then(|x| x.as_f64())
            .with_context(|| format!("probe-open gave no {k}"))
    };
    Ok(Probe {
        open_seconds: num("open_seconds")?,
        rss_bytes: num("rss_bytes")? as u64,
        items: num("items")? as u64,
    })
}

/// The child side of `probe_open`: open the store, report time, RSS and the item count
/// of its `deep` queue (0 when absent) as one JSON line.
pub fn probe_open_main(dir: &Path) -> Result<()> {
    let start = Instant::now();
    let store = Store::open(dir)?;
    let open_seconds = start.elapsed().as_secs_f64();
    let rss_bytes = crate::sys::self_rss_bytes()?;
    let items = store
        .existing_queue("deep")?
        .map(|q| q.stats().items)
        .unwrap_or(0);
    store.close()?;
    println!(
        "{}",
        serde_json::json!({ "open_seconds": open_seconds, "rss_bytes": rss_bytes, "items": items })
    );
    Ok(())
}

/// Cells the library chart reads: write throughput by thread count.
pub fn chart_rows(report: &Report) -> Report {
    let mut r = Report::new("library", "append throughput by threads");
    for row in &report.rows {
        if matches!(row.get("case"), Some(Cell::Text(c)) if c == "append") {
            r.rows.push(row.clone());
        }
    }
    r
}
