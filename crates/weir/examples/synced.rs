//! Synced appends vs a plain write+fdatasync loop on the same filesystem, then the
//! same appends from THREADS threads at once (group commit):
//! `cargo run --release --example synced -- DIR SECONDS THREADS`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic
use std::io::Write;
use std::time::{Duration, Instant};
use weir::{AppendOptions, Durability, QueueConfig, Store, StoreOptions};

fn main() -> weir::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(
        args.get(1)
            .cloned()
            .unwrap_or_else(|| "/tmp/weir-synced".into()),
    );
    let secs: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let threads: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(64);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| weir::Error::InvalidArgument(e.to_string()))?;
    let record = vec![5u8; 512];
    let plain = {
        let mut f = std::fs::File::create(dir.join("plain"))
            .map_err(|e| weir::Error::InvalidArgument(e.to_string()))?;
        let t = Instant::now();
        let mut n = 0u64;
        while t.elapsed() < Duration::from_secs_f64(secs) {
            f.write_all(&record)
                .map_err(|e| weir::Error::InvalidArgument(e.to_string()))?;
            f.sync_data()
                .map_err(|e| weir::Error::InvalidArgument(e.to_string()))?;
            n += 1;
        }
        n as f64 / t.elapsed().as_secs_f64()
    };
    let store = Store::open_with(
        dir.join("store"),
        StoreOptions {
            defaults: QueueConfig {
                durability: Durability::Synced,
                ..Default::default()
            },
            config_for: None,
            ..StoreOptions::default()
        },
    )?;
    let q = store.queue("s")?;
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed() < Duration::from_secs_f64(secs) {
        q.append(&record, AppendOptions::default())?;
        n += 1;
    }
    let weir = n as f64 / t.elapsed().as_secs_f64();
    println!(
        "plain write+fdatasync {plain:.0}/s, weir synced {weir:.0}/s, ratio {:.2}",
        weir / plain
    );
    let total = std::sync::atomic::AtomicU64::new(0);
    let t = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                let mut n = 0u64;
                while t.elapsed() < Duration::from_secs_f64(secs) {
                    if q.append(&record, AppendOptions::default()).is_err() {
                        break;
                    }
                    n += 1;
                }
                total.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            });
        }
    });
    let group = total.into_inner() as f64 / t.elapsed().as_secs_f64();
    println!(
        "{threads} threads synced {group:.0}/s, {:.2}x one thread",
        group / weir
    );
    store.close()
}
