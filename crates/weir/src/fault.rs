//! Fault injection for tests: failures the tests cannot cause from outside without
//! root or a real crash. Compiled only with the cargo feature `fault-injection`, which
//! the crate's own tests turn on (a dev-dependency on itself) and nothing else does;
//! without it the hooks do not exist. They sit on cold paths only: the disk
//! reservation made once per mapping window, a move to `expire_to`, each fsync
//! (counted, so tests can see fsyncs happen and are shared) and each visit of the
//! background thread to a queue (counted, so tests can see idle queues cost none).
//!
//! Hooks are process-wide but scoped: a disk is "full" only for files under the
//! directories given, so tests running in parallel in one binary do not see each
//! other's faults.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Directories under which every disk reservation fails with `ENOSPC`.
static FULL_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// The point at which the process aborts, as a kill at that instant would stop it.
static ABORT_AT: Mutex<Option<String>> = Mutex::new(None);

/// Where a move to `expire_to` has appended its items to the target queue and not yet
/// confirmed them in the source queue.
pub const MOVE_APPENDED: &str = "move:appended";

/// Makes the disk under `dir` full (`true`) or not: reserving space for any file there
/// fails with `ENOSPC`, as `posix_fallocate` does on a full disk. Space already
/// reserved stays usable, as on a real disk.
pub fn set_disk_full(dir: &Path, full: bool) {
    let mut dirs = FULL_DIRS.lock().unwrap_or_else(|e| e.into_inner());
    dirs.retain(|d| d != dir);
    if full {
        dirs.push(dir.to_path_buf());
    }
}

/// Makes the process abort when it reaches `point` (one of this module's constants);
/// `None` disarms it.
pub fn abort_at(point: Option<&str>) {
    *ABORT_AT.lock().unwrap_or_else(|e| e.into_inner()) = point.map(str::to_string);
}

/// Whether reserving space for the file at `path` must fail.
pub(crate) fn disk_full(path: &Path) -> bool {
    let dirs = FULL_DIRS.lock().unwrap_or_else(|e| e.into_inner());
    dirs.iter().any(|d| path.starts_with(d))
}

/// Counts per queue directory: a hash map, since tests open thousands of queues.
type Counts = Mutex<Option<HashMap<PathBuf, u64>>>;

fn count(counts: &Counts, dir: &Path) {
    let mut counts = counts.lock().unwrap_or_else(|e| e.into_inner());
    *counts
        .get_or_insert_with(HashMap::new)
        .entry(dir.to_path_buf())
        .or_insert(0) += 1;
}

fn sum_under(counts: &Counts, dir: &Path) -> u64 {
    let counts = counts.lock().unwrap_or_else(|e| e.into_inner());
    counts
        .iter()
        .flatten()
        .filter(|(d, _)| d.starts_with(dir))
        .map(|(_, n)| n)
        .sum()
}

/// fdatasync calls made by the engine so far, per queue directory. Not a fault: a
/// count the tests read to see that a synced append really fsyncs, and that group
/// commit shares fsyncs between callers.
static FSYNCS: Counts = Mutex::new(None);

/// Counts one fdatasync of a file in the queue directory `dir`.
pub(crate) fn fsynced(dir: &Path) {
    count(&FSYNCS, dir);
}

/// fdatasync calls the engine made on files under `dir` (a store's or a queue's
/// directory) since the process started.
pub fn fsyncs_under(dir: &Path) -> u64 {
    sum_under(&FSYNCS, dir)
}

/// What the engine is about to make durable.
#[derive(Clone, Copy, Debug)]
pub enum Synced<'a> {
    /// A file about to be fdatasync'ed.
    File(&'a File),
    /// A directory about to be fsync'ed.
    Dir(&'a Path),
}

/// A function told of every fsync before it happens.
pub type SyncObserver = Arc<dyn Fn(Synced<'_>) + Send + Sync>;

static OBSERVERS: Mutex<Vec<(u64, SyncObserver)>> = Mutex::new(Vec::new());

/// Calls `observer` before each fsync the engine makes, with the file or directory,
/// until [`stop_observing`] with the id returned. The observer runs on the thread
/// about to fsync, which waits for it: a power-cut simulation records what each
/// fsync makes durable, and holds fsyncs back while it takes a crash image. It is
/// called for every store in the process; it filters by path itself.
pub fn observe_syncs(observer: SyncObserver) -> u64 {
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    OBSERVERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((id, observer));
    id
}

/// Stops the observer `id` (see [`observe_syncs`]).
pub fn stop_observing(id: u64) {
    OBSERVERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|(i, _)| *i != id);
}

/// Tells every observer of an fsync about to happen.
pub(crate) fn before_sync(what: Synced<'_>) {
    // Cloned out, so an observer may take its time (or fsync) without this lock.
    let observers: Vec<SyncObserver> = OBSERVERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(_, o)| Arc::clone(o))
        .collect();
    for observer in observers {
        observer(what);
    }
}

/// fsyncs of directories, per directory (exact path, not counted under parents).
static DIR_SYNCS: Counts = Mutex::new(None);

/// Counts one fsync of the directory `dir`.
pub(crate) fn dir_synced(dir: &Path) {
    count(&DIR_SYNCS, dir);
}

/// fsyncs the engine made of the directory `dir` itself since the process started:
/// what makes a file created, renamed or removed in it survive a power cut.
pub fn dir_syncs_of(dir: &Path) -> u64 {
    let counts = DIR_SYNCS.lock().unwrap_or_else(|e| e.into_inner());
    counts
        .as_ref()
        .and_then(|c| c.get(dir))
        .copied()
        .unwrap_or(0)
}

/// Aborts the process if it was told to at `point`.
pub(crate) fn reached(point: &str) {
    let armed = ABORT_AT.lock().unwrap_or_else(|e| e.into_inner());
    if armed.as_deref() == Some(point) {
        std::process::abort();
    }
}

/// Visits of the background thread to queues, per queue directory (see `fsynced`).
static TICKS: Counts = Mutex::new(None);

/// Counts one visit of the background thread to the queue in `dir`.
pub(crate) fn ticked(dir: &Path) {
    count(&TICKS, dir);
}

/// Visits of the background thread to queues under `dir` since the process started.
pub fn ticks_under(dir: &Path) -> u64 {
    sum_under(&TICKS, dir)
}
