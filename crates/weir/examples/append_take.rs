//! A tight append+take loop for profiling:
//! `cargo run --release --example append_take -- DIR PAIRS SIZE [BACKLOG]`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic
use weir::{AppendOptions, Store};

fn main() -> weir::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "/tmp/weir-prof".into());
    let n: u64 = args
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let size: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::open(&dir)?;
    let q = store.queue("p")?;
    let r = q.reader("")?;
    let payload = vec![7u8; size];
    let backlog: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(0);
    let batch: Vec<&[u8]> = vec![&payload[..]; 1024];
    for _ in 0..backlog / 1024 {
        q.append_batch(&batch, AppendOptions::default())?;
    }
    // Not timed: the kernel's writeback of the backlog just written.
    // SAFETY: sync(2) takes no arguments and touches no memory of ours.
    unsafe { libc::sync() };
    eprintln!("backlog of {backlog} written; timing {n} pairs");
    let t = std::time::Instant::now();
    for _ in 0..n {
        q.append(&payload, AppendOptions::default())?;
        if r.take()?.is_none() {
            return Err(weir::Error::InvalidArgument("missing item".into()));
        }
    }
    let s = t.elapsed().as_secs_f64();
    println!("{n} pairs in {s:.3} s: {:.0} pairs/s", n as f64 / s);
    store.close()
}
