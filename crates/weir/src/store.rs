//! `Store`: one data directory, its lock, its queues and the background syncer.
//!
//! Layout on disk (see `docs/storage.md`):
//!
//! ```text
//! DIR/LOCK                      a POSIX record lock held while the store is open
//! DIR/queues/NAME/SEQ.segment_first_seq       segment files, named by their first sequence number
//! DIR/queues/NAME/readers.GEN   reader-state journal, generation GEN
//! ```
//!
//! A queue comes into being on first use, all or nothing: its directory is built under
//! a name no queue can have (`.creating-NAME-...`) and renamed into place once whole, so
//! a crash or a full disk in the middle never leaves a half-made queue behind. The
//! file work of opening or creating a queue happens outside the store's map lock (the
//! name is marked as being opened, and counted against `queues_max`, meanwhile), so a
//! lookup of an open queue never waits behind another queue's disk work. The store's
//! background thread fsyncs queues in `periodic` mode and releases leases that outlive
//! `open_timeout`.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

use crate::clock::Clock;
use crate::config::StoreOptions;
use crate::error::{Error, Result};
use crate::file_cell::FilesBudget;
use crate::lockfile::DirLock;
use crate::mapfile::sync_dir;
use crate::name::validate_queue_name;
use crate::queue::queue_core::{QueueCore, StoreLink};
use crate::queue::Queue;
use crate::space_reserve::SpaceReserve;

/// How often the background thread wakes to look for work (lease timeouts, periodic
/// fsyncs whose interval has passed).
const TICK: Duration = Duration::from_millis(20);
/// Most descriptors the store's queues may hold at once (at least a few, so that one
/// queue can always work).
fn files_open_max(options: &StoreOptions) -> usize {
    options.files_open_max.max(FILES_OPEN_MIN)
}

/// How often the background thread tries to bring the descriptors under their
/// budget when operations gave up (see `FilesBudget::retry_above`).
const BUDGET_CHECK: Duration = Duration::from_millis(250);

/// How often the background thread looks whether a released space reserve can be set
/// up again (a `statvfs`).
const RESERVE_CHECK: Duration = Duration::from_secs(1);
/// The least `files_open_max` taken: what one queue in use needs (the segment being
/// written, the reader journal, a sealed segment a reader is in, one more being
/// read), so that one queue can always work.
const FILES_OPEN_MIN: usize = 4;

/// An open data directory. Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct Store {
    handle: Arc<StoreHandle>,
}

/// Shared by every clone of a `Store`; dropping the last clone closes the store, at
/// once, whatever other threads (the background one included) are doing.
struct StoreHandle {
    inner: Arc<StoreInner>,
}

impl Drop for StoreHandle {
    fn drop(&mut self) {
        if let Err(e) = self.inner.shutdown() {
            tracing::error!(dir = %self.inner.dir.display(), error = %e, "closing the store");
        }
    }
}

/// The store's queues by name, and the names whose files are being opened or created
/// right now (outside the lock).
#[derive(Default)]
struct Registry {
    queues: HashMap<String, Arc<QueueCore>>,
    opening: HashSet<String>,
}

impl Registry {
    /// Queues open or on their way: what `queues_max` is checked against.
    fn count(&self) -> usize {
        self.queues.len() + self.opening.len()
    }
}

/// Whether opening a queue may create it, and whether `queues_max` applies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OpenMode {
    /// A queue found on disk when the store opens: never refused.
    OnDisk,
    /// A client's (or `expire_to`'s) first use: created when missing, within the cap.
    Use,
}

pub(crate) struct StoreInner {
    dir: PathBuf,
    /// Held (flock) while the store is open; dropping the file releases the lock.
    lock: Mutex<Option<DirLock>>,
    options: RwLock<StoreOptions>,
    registry: Mutex<Registry>,
    /// Notified whenever a name leaves `Registry::opening`.
    opened: Condvar,
    /// Space that only reader state may use once the disk is full.
    pub(crate) reserve: Arc<SpaceReserve>,
    /// Queues whose files are open now (see `QueueCore`'s idle close), held under
    /// `StoreOptions::files_open_max` by the background thread and by each operation
    /// that finds the store over it.
    pub(crate) files_budget: Arc<FilesBudget>,
    /// Queues with work for the background thread (see `QueueCore::tick`): every
    /// queue in use, none that is idle, so thousands of idle queues cost it nothing.
    active: Mutex<Vec<Arc<QueueCore>>>,
    closed: AtomicBool,
    /// Set by [`Store::begin_shutdown`]: leases that end unconfirmed keep their items
    /// out of reach until the store is reopened.
    pub(crate) shutting_down: AtomicBool,
    /// `StoreOptions::clock`, fixed when the store opens.
    pub(crate) clock: Clock,
    /// The work-queue features' shared state (`jobs`).
    pub(crate) jobs: Arc<crate::jobs::shared::JobsShared>,
    background: Mutex<Option<JoinHandle<()>>>,
    /// Outside the store, so the background thread can sleep on it without keeping the
    /// store alive.
    stop: Arc<(Mutex<bool>, Condvar)>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.handle.inner.dir)
            .finish()
    }
}

/// Creates the data directory and its `queues/` where missing, and makes their entries
/// durable (an fsync of each parent) before any queue is created in them: a queue
/// synced later must not vanish after a power cut with the directory it lives in.
fn create_store_dirs(dir: &Path) -> Result<()> {
    let queues = dir.join("queues");
    if queues.is_dir() {
        return Ok(());
    }
    let dir_existed = dir.is_dir();
    fs::create_dir_all(&queues).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let sync = |d: &Path| sync_dir(d).map_err(|e| Error::io(format!("syncing {}", d.display()), e));
    sync(dir)?;
    if !dir_existed {
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync(parent)?;
        }
    }
    Ok(())
}

impl Store {
    /// Opens (creating if needed) the store in `dir` with default options.
    pub fn open(dir: impl AsRef<Path>) -> Result<Store> {
        Store::open_with(dir, StoreOptions::default())
    }

    /// Opens (creating if needed) the store in `dir`. A second opener of the same
    /// directory, in this process or another, gets [`Error::Locked`].
    pub fn open_with(dir: impl AsRef<Path>, options: StoreOptions) -> Result<Store> {
        let dir = dir.as_ref().to_path_buf();
        create_store_dirs(&dir)?;
        let lock = DirLock::acquire(&dir)?;
        let reserve = Arc::new(SpaceReserve::open(&dir, options.space_reserve_bytes));
        let inner = Arc::new(StoreInner {
            clock: options.clock.clone(),
            jobs: Arc::default(),
            reserve,
            files_budget: Arc::new(FilesBudget {
                max: AtomicUsize::new(files_open_max(&options)),
                ..FilesBudget::default()
            }),
            active: Mutex::new(Vec::new()),
            dir,
            lock: Mutex::new(Some(lock)),
            options: RwLock::new(options),
            registry: Mutex::new(Registry::default()),
            opened: Condvar::new(),
            closed: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
            background: Mutex::new(None),
            stop: Arc::new((Mutex::new(false), Condvar::new())),
        });
        // Open every queue that exists on disk, so that recovery (and its errors)
        // happens at open, not at first use.
        let names = inner.names_on_disk()?;
        for name in names {
            match inner.open_queue(&name, OpenMode::OnDisk) {
                Ok(_) => {}
                // Opening never needs free space in the usual case, but recovering a
                // damaged queue can (a new journal, a segment header): a full disk must
                // not keep every other queue from being served, and draining them is
                // how space comes back. The queue is opened at its first use.
                Err(e) if e.kind() == crate::error::ErrorKind::DiskFull => {
                    tracing::error!(queue = %name, error = %e, "could not open a queue: the disk is full; it is opened again at its first use");
                }
                Err(e) => return Err(e),
            }
        }
        let weak = Arc::downgrade(&inner);
        let stop = Arc::clone(&inner.stop);
        let handle = std::thread::Builder::new()
            .name("weir-syncer".into())
            .spawn(move || background(weak, stop))
            .map_err(|e| Error::io("starting the background thread", e))?;
        *inner.background.lock() = Some(handle);
        Ok(Store {
            handle: Arc::new(StoreHandle { inner }),
        })
    }

    /// The work-queue features' state shared by this store's handles.
    pub(crate) fn jobs_shared(&self) -> Arc<crate::jobs::shared::JobsShared> {
        Arc::clone(&self.handle.inner.jobs)
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.handle.inner.dir
    }

    /// The queue `name`, created on first use.
    pub fn queue(&self, name: &str) -> Result<Queue> {
        self.handle.inner.check_open()?;
        let core = self.handle.inner.open_queue(name, OpenMode::Use)?;
        Ok(Queue { core })
    }

    /// The queue `name` if it exists; never creates it.
    pub fn existing_queue(&self, name: &str) -> Result<Option<Queue>> {
        self.handle.inner.check_open()?;
        validate_queue_name(name)?;
        Ok(self
            .handle
            .inner
            .registry
            .lock()
            .queues
            .get(name)
            .map(|core| Queue {
                core: Arc::clone(core),
            }))
    }

    /// Names of all queues, sorted.
    pub fn queue_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .handle
            .inner
            .registry
            .lock()
            .queues
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }

    /// Every open queue, sorted by name: one lock of the store's map for the lot (a
    /// whole-store command walks thousands of queues).
    pub fn queues(&self) -> Vec<Queue> {
        let mut queues: Vec<Queue> = self
            .handle
            .inner
            .registry
            .lock()
            .queues
            .values()
            .map(|core| Queue {
                core: Arc::clone(core),
            })
            .collect();
        queues.sort_by(|a, b| a.name().cmp(b.name()));
        queues
    }

    /// The most queues the store creates (`StoreOptions::queues_max`, as set now).
    pub fn queues_max(&self) -> usize {
        self.handle.inner.options.read().queues_max
    }

    /// How many queues the store holds (open, or being opened or created).
    pub fn queue_count(&self) -> usize {
        self.handle.inner.registry.lock().count()
    }

    /// Deletes a queue, its items and its readers; false when there was none. Handles
    /// on it get [`Error::NotFound`] afterwards.
    pub fn delete_queue(&self, name: &str) -> Result<bool> {
        self.handle.inner.check_open()?;
        validate_queue_name(name)?;
        // Under the map lock the queue is retired and its directory moved to a name no
        // queue can have, so a concurrent `queue(name)` creates a fresh queue and never
        // reopens the old files; the tombstone is removed afterwards, outside the lock.
        let inner = &self.handle.inner;
        let tomb = {
            let mut registry = inner.registry.lock();
            // A queue being opened or created is waited for: deleting it means
            // deleting what that open produces.
            while registry.opening.contains(name) {
                inner.opened.wait(&mut registry);
            }
            let Some(core) = registry.queues.remove(name) else {
                return Ok(false);
            };
            let tomb = inner.dir.join("queues").join(tombstone_name(name));
            if let Err(e) = core.retire(&tomb) {
                registry.queues.insert(name.to_string(), core);
                return Err(e);
            }
            tomb
        };
        // Make the rename durable before the files go: after a power cut the queue is
        // either whole under its name or a tombstone that the next open removes.
        let queues_dir = inner.dir.join("queues");
        sync_dir(&queues_dir)
            .map_err(|e| Error::io(format!("syncing {}", queues_dir.display()), e))?;
        fs::remove_dir_all(&tomb)
            .map_err(|e| Error::io(format!("deleting {}", tomb.display()), e))?;
        Ok(true)
    }

    /// Starts a shutdown: from now on, a lease that ends without a confirm (released,
    /// timed out, or its holder gone) does not put its item back for other readers
    /// of this process. The item stays out until the store is reopened, which delivers
    /// it again, as after a kill. A server calls this when a graceful shutdown begins,
    /// before it closes its clients' connections: an item a closing connection had
    /// received must not be handed to another connection in the moments before the
    /// process ends. Appends, takes of other items and confirms go on as before.
    pub fn begin_shutdown(&self) {
        self.handle
            .inner
            .shutting_down
            .store(true, Ordering::Release);
    }

    /// The store's clock ([`StoreOptions::clock`]): front doors that turn a relative
    /// time into an item's expiry use it, so they agree with the engine.
    pub fn clock(&self) -> &Clock {
        &self.handle.inner.clock
    }

    /// Replaces the options and applies the new settings to every open queue.
    pub fn set_options(&self, options: StoreOptions) {
        let inner = &self.handle.inner;
        inner
            .files_budget
            .max
            .store(files_open_max(&options), Ordering::Relaxed);
        let queues = inner.cores();
        for q in &queues {
            q.set_config(options.config(&q.name));
        }
        *self.handle.inner.options.write() = options;
    }

    /// fdatasyncs every queue now.
    pub fn sync(&self) -> Result<()> {
        let queues = self.handle.inner.cores();
        for q in queues {
            q.sync_now()?;
        }
        Ok(())
    }

    /// Syncs and closes every queue and stops the background thread. Other handles
    /// get [`Error::Closed`] afterwards. Dropping the last handle without `close` is
    /// safe too: nothing acknowledged is lost, only the final fsync is skipped.
    pub fn close(self) -> Result<()> {
        self.handle.inner.shutdown()
    }
}

/// Prefix of a deleted queue's directory while it is being removed; not a valid queue
/// name, so it is never opened as one (leftovers are removed at open).
const TOMBSTONE_PREFIX: &str = ".deleted-";
/// Prefix of a queue's directory while it is being created (see the module docs).
pub(crate) const CREATING_PREFIX: &str = ".creating-";

fn tombstone_name(queue: &str) -> String {
    temporary_name(TOMBSTONE_PREFIX, queue)
}

/// `PREFIXqueue-NANOS`: unique within the process, never a valid queue name.
pub(crate) fn temporary_name(prefix: &str, queue: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{prefix}{queue}-{nanos}")
}

impl StoreInner {
    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            Err(Error::Closed)
        } else {
            Ok(())
        }
    }

    fn names_on_disk(&self) -> Result<Vec<String>> {
        let qdir = self.dir.join("queues");
        let mut names = Vec::new();
        let entries =
            fs::read_dir(&qdir).map_err(|e| Error::io(format!("listing {}", qdir.display()), e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(format!("listing {}", qdir.display()), e))?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if name.starts_with(TOMBSTONE_PREFIX) || name.starts_with(CREATING_PREFIX) {
                // A deletion or a creation interrupted by a crash: finish the one,
                // undo the other (nothing was acknowledged in a queue not yet made).
                if let Err(e) = fs::remove_dir_all(entry.path()) {
                    tracing::warn!(path = %entry.path().display(), error = %e, "could not remove a deleted or half-made queue");
                }
                continue;
            }
            if validate_queue_name(&name).is_ok() && entry.path().is_dir() {
                names.push(name);
            }
        }
        Ok(names)
    }

    /// Ticks the queues on the active list; the ones with work left go back on it.
    fn tick_active(&self, now: Instant) {
        let batch = std::mem::take(&mut *self.active.lock());
        for queue in batch {
            queue.clear_active();
            if queue.tick(now) {
                queue.mark_active();
            }
        }
    }

    /// Over the descriptor budget: closes the files of the queues used least
    /// recently, down to nine tenths of it (so that it is not met again at once).
    /// Every queue with open files is on the active list. `from_background`: the
    /// background thread's periodic attempt, made whatever `retry_above` says.
    pub(crate) fn enforce_files_budget(&self, from_background: bool) {
        let budget = &self.files_budget;
        let over = budget.open.load(Ordering::Relaxed) > budget.max.load(Ordering::Relaxed);
        if !over || !(from_background || budget.over()) {
            return;
        }
        // One at a time; whoever is at it brings the count down for all.
        let Some(_enforcing) = budget.enforcing.try_lock() else {
            return;
        };
        let max = budget.max.load(Ordering::Relaxed);
        let open = budget.open.load(Ordering::Relaxed);
        let active: Vec<Arc<QueueCore>> = self.active.lock().clone();
        let mut queues: Vec<(Instant, Arc<QueueCore>)> = active
            .into_iter()
            .filter_map(|q| Some((q.last_used()?, q)))
            .collect();
        queues.sort_by_key(|(used, _)| *used);
        let target = max - max / 10;
        let mut closed = 0usize;
        for (_, queue) in queues {
            if budget.open.load(Ordering::Relaxed) <= target {
                break;
            }
            if queue.close_files() {
                closed += 1;
            }
        }
        let now_open = budget.open.load(Ordering::Relaxed);
        let retry_above = if now_open > max {
            now_open + max / 10
        } else {
            0
        };
        budget.retry_above.store(retry_above, Ordering::Relaxed);
        tracing::debug!(
            open,
            max,
            closed,
            "closed the files of the queues used least recently"
        );
    }

    /// Every open queue.
    fn cores(&self) -> Vec<Arc<QueueCore>> {
        self.registry.lock().queues.values().cloned().collect()
    }

    /// The queue `name`, opened (or, for a use, created) if it is not open yet. The
    /// file work runs outside the map lock, with the name in `Registry::opening`: a
    /// second caller for the same name waits for the first, callers for other names do
    /// not wait at all.
    fn open_queue(self: &Arc<Self>, name: &str, mode: OpenMode) -> Result<Arc<QueueCore>> {
        validate_queue_name(name)?;
        let mut registry = self.registry.lock();
        loop {
            // Checked under the map lock: `shutdown` marks the store closed before it
            // waits for openings to end and drains the map.
            self.check_open()?;
            if let Some(core) = registry.queues.get(name) {
                return Ok(Arc::clone(core));
            }
            if !registry.opening.contains(name) {
                break;
            }
            self.opened.wait(&mut registry);
        }
        let (config, queues_max) = {
            let options = self.options.read();
            (options.config(name), options.queues_max)
        };
        if mode == OpenMode::Use && registry.count() >= queues_max {
            return Err(Error::TooManyQueues { max: queues_max });
        }
        registry.opening.insert(name.to_string());
        drop(registry);
        let dir = self.dir.join("queues").join(name);
        let opened = match mode {
            OpenMode::OnDisk => QueueCore::open(name, &dir, config, Arc::downgrade(self)),
            OpenMode::Use => QueueCore::open_or_create(name, &dir, config, Arc::downgrade(self)),
        };
        let mut registry = self.registry.lock();
        registry.opening.remove(name);
        self.opened.notify_all();
        let core = opened?;
        if let Err(e) = self.check_open() {
            // The store closed while this queue was being opened: close it too.
            drop(registry);
            let _ = core.close();
            return Err(e);
        }
        registry.queues.insert(name.to_string(), Arc::clone(&core));
        Ok(core)
    }

    fn shutdown(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        {
            let (lock, cvar) = &*self.stop;
            *lock.lock() = true;
            cvar.notify_all();
        }
        if let Some(handle) = self.background.lock().take() {
            // The thread may be the one dropping the last handle; never join ourselves.
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
        let queues: Vec<Arc<QueueCore>> = {
            let mut registry = self.registry.lock();
            // Openings in progress end (closing what they opened, see `open_queue`)
            // before the map is drained.
            while !registry.opening.is_empty() {
                self.opened.wait(&mut registry);
            }
            registry.queues.drain().map(|(_, q)| q).collect()
        };
        let mut first_error = None;
        for q in queues {
            if let Err(e) = q.close() {
                first_error.get_or_insert(e);
            }
        }
        // Release the directory now, even if some thread still holds a reference.
        self.lock.lock().take();
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for StoreInner {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// The background thread: ticks the queues in use (fsyncs `periodic` queues when their
/// interval has passed, times out leases, closes idle queues' files), keeps the store
/// within its descriptor budget and sets up the space reserve again. It holds the
/// store only while it works, never while it sleeps, so dropping the last handle is
/// never delayed by it.
fn background(store: Weak<StoreInner>, stop: Arc<(Mutex<bool>, Condvar)>) {
    let mut reserve_checked = Instant::now();
    let mut budget_checked = Instant::now();
    loop {
        {
            let (lock, cvar) = &*stop;
            let mut stopped = lock.lock();
            if *stopped {
                return;
            }
            cvar.wait_for(&mut stopped, TICK);
            if *stopped {
                return;
            }
        }
        let Some(inner) = store.upgrade() else { return };
        if inner.closed.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        if now.duration_since(reserve_checked) >= RESERVE_CHECK {
            reserve_checked = now;
            inner.reserve.restore();
        }
        inner.tick_active(now);
        if now.duration_since(budget_checked) >= BUDGET_CHECK {
            budget_checked = now;
            inner.enforce_files_budget(true);
        }
    }
}

/// What a queue asks of its store (see `queue_core.rs`).
impl StoreLink for StoreInner {
    /// The queue `name`, created on first use within `queues_max` (how `expire_to`
    /// gets its target).
    fn queue_for_use(self: Arc<Self>, name: &str) -> Result<Arc<QueueCore>> {
        self.open_queue(name, OpenMode::Use)
    }

    /// Puts a queue on the background thread's list (see `QueueCore::mark_active`).
    fn activate(&self, queue: Arc<QueueCore>) {
        self.active.lock().push(queue);
    }

    fn enforce_files_budget(&self, from_background: bool) {
        StoreInner::enforce_files_budget(self, from_background);
    }

    fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }
}
