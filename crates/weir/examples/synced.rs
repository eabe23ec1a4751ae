//! Synced appends vs a plain write+fdatasync loop on the same filesystem:
//! `cargo run --release --example synced -- DIR SECONDS`.
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
    store.close()
}
