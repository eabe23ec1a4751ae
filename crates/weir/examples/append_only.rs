//! Buffered appends of 512 B from one thread, for profiling:
//! `cargo run --release --example append_only -- DIR COUNT`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic
use weir::{AppendOptions, Durability, QueueConfig, Store, StoreOptions};

fn main() -> weir::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "/tmp/weir-append".into());
    let n: u64 = args
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3_000_000);
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::open_with(
        &dir,
        StoreOptions {
            defaults: QueueConfig {
                durability: Durability::Buffered,
                ..Default::default()
            },
            config_for: None,
            ..StoreOptions::default()
        },
    )?;
    let q = store.queue("a")?;
    let record = vec![1u8; 512];
    let t = std::time::Instant::now();
    for _ in 0..n {
        q.append(&record, AppendOptions::default())?;
    }
    let s = t.elapsed().as_secs_f64();
    println!("{n} appends in {s:.3} s: {:.0}/s", n as f64 / s);
    store.close()
}
