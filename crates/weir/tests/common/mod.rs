//! Helpers shared by the engine's integration tests: stores with chosen settings,
//! payloads that carry their own identity (so a test can tell a wrong item from a
//! damaged one), and small polling helpers.
#![allow(dead_code)]

pub mod power_cut;

use std::path::Path;
use std::time::{Duration, Instant};

use weir::{QueueConfig, Store, StoreOptions};

/// Opens `dir` with `config` as the settings of every queue.
/// Now, in Unix milliseconds (the clock of items' times).
#[allow(dead_code)]
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub fn open_with_config(dir: &Path, config: QueueConfig) -> weir::Result<Store> {
    Store::open_with(
        dir,
        StoreOptions {
            defaults: config,
            config_for: None,
            ..StoreOptions::default()
        },
    )
}

/// A store with `config` for every queue, on a `ManualClock` the test moves: for
/// tests of expiry and lease timeouts that say when time passes instead of sleeping.
pub fn open_on_manual_clock(dir: &Path, config: QueueConfig) -> (Store, weir::ManualClock) {
    let clock = weir::ManualClock::new();
    let store = Store::open_with(
        dir,
        StoreOptions {
            defaults: config,
            clock: clock.clock(),
            ..StoreOptions::default()
        },
    )
    .expect("open store");
    (store, clock)
}

/// The settings most tests use: defaults with a small segment size, so that a few
/// hundred items already roll over into several segment files.
pub fn small_segments(segment_size_bytes: u64) -> QueueConfig {
    QueueConfig {
        segment_size_bytes,
        ..QueueConfig::default()
    }
}

/// A payload of `len` bytes that identifies item `id`: the id (little endian) in the
/// first 8 bytes (as much of it as fits), then a pattern that depends on the id and
/// the position, so a shifted, truncated or foreign payload never passes `check`.
pub fn payload(id: u64, len: usize) -> Vec<u8> {
    let mut out: Vec<u8> = id.to_le_bytes().iter().copied().take(len).collect();
    out.extend(
        (out.len()..len).map(|i| (id.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8),
    );
    out
}

/// The id encoded in a payload of at least 8 bytes.
pub fn payload_id(data: &[u8]) -> Option<u64> {
    let bytes: [u8; 8] = data.get(..8)?.try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

/// Whether `data` is exactly `payload(id, len)`.
pub fn is_payload(data: &[u8], id: u64, len: usize) -> bool {
    data.len() == len && data == payload(id, len).as_slice()
}

/// The process's resident set size in KiB (VmRSS), and its anonymous part (RssAnon).
pub fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("RssAnon:"))
}

/// Polls `f` until it is true or `timeout` passes; returns its last answer.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The segment files of queue `name`, sorted by the first sequence number in their
/// file name (`DIR/queues/NAME/SEQ.segment_first_seq`).
pub fn segment_files(dir: &Path, name: &str) -> Vec<std::path::PathBuf> {
    let qdir = dir.join("queues").join(name);
    let mut segs: Vec<(u64, std::path::PathBuf)> = std::fs::read_dir(&qdir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "seg"))
                .map(|p| {
                    let first = p
                        .file_stem()
                        .and_then(|s| s.to_str())
                        .and_then(|s| s.parse::<u64>().ok())
                        .unwrap_or(u64::MAX);
                    (first, p)
                })
                .collect()
        })
        .unwrap_or_default();
    segs.sort();
    segs.into_iter().map(|(_, p)| p).collect()
}

/// Runs `f` with the engine's log (WARN and above) captured for this thread, and
/// returns it as text, one event per line ("ERROR ...", "WARN ..."). Only what `f`
/// logs on the calling thread is captured (not the store's background thread).
pub fn capture_logs<T>(f: impl FnOnce() -> T) -> (T, String) {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let sink = Sink::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .without_time()
        .with_target(false)
        .finish();
    let out = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8_lossy(&sink.0.lock().unwrap()).into_owned();
    (out, text)
}
