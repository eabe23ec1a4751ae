//! 3 writers + 1 reader on one buffered queue, for profiling:
//! `cargo run --release --example rw -- DIR SECONDS [READ_BATCH]`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use weir::{AppendOptions, Durability, QueueConfig, Store, StoreOptions};

fn main() -> weir::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(
        args.get(1)
            .cloned()
            .unwrap_or_else(|| "/tmp/weir-rw".into()),
    );
    let secs: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let batch: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(256);
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
    let queue = store.queue("bench")?;
    let reader = queue.reader("")?;
    let record = vec![7u8; 512];
    let stop = AtomicBool::new(false);
    let (writes, reads) = (AtomicU64::new(0), AtomicU64::new(0));
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    if queue.append(&record, AppendOptions::default()).is_err() {
                        break;
                    }
                    n += 1;
                }
                writes.fetch_add(n, Ordering::Relaxed);
            });
        }
        s.spawn(|| {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                match reader.take_batch(batch) {
                    Ok(items) => n += items.len() as u64,
                    Err(_) => break,
                }
            }
            reads.fetch_add(n, Ordering::Relaxed);
        });
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
    });
    let el = start.elapsed().as_secs_f64();
    let (w, r) = (writes.into_inner(), reads.into_inner());
    println!(
        "writes {:.0}/s reads {:.0}/s total {:.0}/s backlog {}",
        w as f64 / el,
        r as f64 / el,
        (w + r) as f64 / el,
        queue.stats().items
    );
    store.close()
}
