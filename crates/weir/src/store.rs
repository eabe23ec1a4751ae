//! `Store`: one data directory, its lock, its queues and the background syncer.
//!
//! Layout on disk (see `docs/storage.md`):
//!
//! ```text
//! DIR/LOCK                      a POSIX record lock held while the store is open
//! DIR/queues/NAME/SEQ.seg       segment files, named by their first sequence number
//! DIR/queues/NAME/readers.GEN   reader-state journal, generation GEN
//! ```
//!
//! A queue comes into being on first use. The store's background thread fsyncs queues
//! in `periodic` mode and releases leases that outlive `open_timeout`.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

use crate::config::StoreOptions;
use crate::core::QueueCore;
use crate::error::{Error, Result};
use crate::lockfile::DirLock;
use crate::name::validate_queue_name;
use crate::queue::Queue;

/// How often the background thread wakes to look for work (lease timeouts, periodic
/// fsyncs whose interval has passed).
const TICK: Duration = Duration::from_millis(20);

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

pub(crate) struct StoreInner {
    dir: PathBuf,
    /// Held (flock) while the store is open; dropping the file releases the lock.
    lock: Mutex<Option<DirLock>>,
    options: RwLock<StoreOptions>,
    queues: Mutex<HashMap<String, Arc<QueueCore>>>,
    closed: AtomicBool,
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

impl Store {
    /// Opens (creating if needed) the store in `dir` with default options.
    pub fn open(dir: impl AsRef<Path>) -> Result<Store> {
        Store::open_with(dir, StoreOptions::default())
    }

    /// Opens (creating if needed) the store in `dir`. A second opener of the same
    /// directory, in this process or another, gets [`Error::Locked`].
    pub fn open_with(dir: impl AsRef<Path>, options: StoreOptions) -> Result<Store> {
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(dir.join("queues"))
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let lock = DirLock::acquire(&dir)?;
        let inner = Arc::new(StoreInner {
            dir,
            lock: Mutex::new(Some(lock)),
            options: RwLock::new(options),
            queues: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            background: Mutex::new(None),
            stop: Arc::new((Mutex::new(false), Condvar::new())),
        });
        // Open every queue that exists on disk, so that recovery (and its errors)
        // happens at open, not at first use.
        let names = inner.names_on_disk()?;
        for name in names {
            inner.open_queue(&name)?;
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

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.handle.inner.dir
    }

    /// The queue `name`, created on first use.
    pub fn queue(&self, name: &str) -> Result<Queue> {
        self.handle.inner.check_open()?;
        let core = self.handle.inner.open_queue(name)?;
        Ok(Queue { core })
    }

    /// The queue `name` if it exists; never creates it.
    pub fn existing_queue(&self, name: &str) -> Result<Option<Queue>> {
        self.handle.inner.check_open()?;
        validate_queue_name(name)?;
        Ok(self.handle.inner.queues.lock().get(name).map(|core| Queue {
            core: Arc::clone(core),
        }))
    }

    /// Names of all queues, sorted.
    pub fn queue_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.handle.inner.queues.lock().keys().cloned().collect();
        names.sort();
        names
    }

    /// Deletes a queue, its items and its readers; false when there was none. Handles
    /// on it get [`Error::NotFound`] afterwards.
    pub fn delete_queue(&self, name: &str) -> Result<bool> {
        self.handle.inner.check_open()?;
        validate_queue_name(name)?;
        // Under the map lock the queue is retired and its directory moved to a name no
        // queue can have, so a concurrent `queue(name)` creates a fresh queue and never
        // reopens the old files; the tombstone is removed afterwards, outside the lock.
        let tomb = {
            let mut queues = self.handle.inner.queues.lock();
            let Some(core) = queues.remove(name) else {
                return Ok(false);
            };
            let tomb = self
                .handle
                .inner
                .dir
                .join("queues")
                .join(tombstone_name(name));
            if let Err(e) = core.retire(&tomb) {
                queues.insert(name.to_string(), core);
                return Err(e);
            }
            tomb
        };
        fs::remove_dir_all(&tomb)
            .map_err(|e| Error::io(format!("deleting {}", tomb.display()), e))?;
        Ok(true)
    }

    /// Replaces the options and applies the new settings to every open queue.
    pub fn set_options(&self, options: StoreOptions) {
        let queues: Vec<Arc<QueueCore>> =
            self.handle.inner.queues.lock().values().cloned().collect();
        for q in &queues {
            q.set_config(options.config(&q.name));
        }
        *self.handle.inner.options.write() = options;
    }

    /// fdatasyncs every queue now.
    pub fn sync(&self) -> Result<()> {
        let queues: Vec<Arc<QueueCore>> =
            self.handle.inner.queues.lock().values().cloned().collect();
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

fn tombstone_name(queue: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{TOMBSTONE_PREFIX}{queue}-{nanos}")
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
            if name.starts_with(TOMBSTONE_PREFIX) {
                // A deletion interrupted by a crash: finish it.
                if let Err(e) = fs::remove_dir_all(entry.path()) {
                    tracing::warn!(path = %entry.path().display(), error = %e, "could not remove a deleted queue");
                }
                continue;
            }
            if validate_queue_name(&name).is_ok() && entry.path().is_dir() {
                names.push(name);
            }
        }
        Ok(names)
    }

    pub(crate) fn open_queue(self: &Arc<Self>, name: &str) -> Result<Arc<QueueCore>> {
        validate_queue_name(name)?;
        let mut queues = self.queues.lock();
        // Checked under the map lock: `shutdown` marks the store closed before it
        // drains the map, so no queue is opened after the drain.
        self.check_open()?;
        if let Some(core) = queues.get(name) {
            return Ok(Arc::clone(core));
        }
        let config = self.options.read().config(name);
        let core = QueueCore::open(
            name,
            &self.dir.join("queues").join(name),
            config,
            Arc::downgrade(self),
        )?;
        queues.insert(name.to_string(), Arc::clone(&core));
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
        let queues: Vec<Arc<QueueCore>> = self.queues.lock().drain().map(|(_, q)| q).collect();
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

/// The background thread: fsyncs `periodic` queues when their interval has passed and
/// times out leases. It holds the store only while it works, never while it sleeps, so
/// dropping the last handle is never delayed by it.
fn background(store: Weak<StoreInner>, stop: Arc<(Mutex<bool>, Condvar)>) {
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
        let queues: Vec<Arc<QueueCore>> = inner.queues.lock().values().cloned().collect();
        drop(inner);
        let now = Instant::now();
        for q in queues {
            q.tick(now);
        }
    }
}
