//! `FileCell`: a file a queue keeps open while it is in use, closed when it goes idle,
//! opened again on its next use; every open one counted in the store's tally.
//!
//! Why: each queue holds a few descriptors (the segment being written, the reader
//! journal, a sealed segment a reader is in). Ten thousand queues holding theirs
//! forever would exhaust the process's descriptors (a typical limit is 20,000), so
//! a queue unused for a while closes its files, and the store closes the least
//! recently used ones at once when the tally passes its budget (`store.rs`). Reopening
//! is lazy: whatever first needs the descriptor opens it, so an operation that needs
//! only the journal opens only the journal.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

/// The store's descriptor budget, shared with every `FileCell` of its queues.
#[derive(Default)]
pub(crate) struct FilesBudget {
    /// Descriptors open now in the store's `FileCell`s.
    pub open: AtomicUsize,
    /// Most that may be (`StoreOptions::files_open_max`).
    pub max: AtomicUsize,
    /// Held by whoever closes queues' files to get back under `max`: one at a time.
    pub enforcing: Mutex<()>,
    /// After an attempt that could not get under `max` (the queues used least recently
    /// had writes not fsync'ed yet, which keep their descriptors), operations try
    /// again only past this many: each attempt sorts every queue in use, and trying on
    /// every operation would make a burst over thousands of queues quadratic. The
    /// background thread tries again on its own, a few times a second.
    pub retry_above: AtomicUsize,
}

impl FilesBudget {
    /// Past the budget and worth an attempt from an operation: three relaxed loads,
    /// cheap enough for the end of every operation.
    pub fn over(&self) -> bool {
        let open = self.open.load(Ordering::Relaxed);
        open > self.max.load(Ordering::Relaxed) && open > self.retry_above.load(Ordering::Relaxed)
    }
}

/// A file opened on first use (read-write or read-only), closed by [`FileCell::close`].
pub(crate) struct FileCell {
    path: PathBuf,
    writable: bool,
    file: OnceLock<Arc<File>>,
    tally: Option<Arc<FilesBudget>>,
}

impl FileCell {
    /// A cell for `path`, not open yet.
    pub fn closed(path: &Path, writable: bool, tally: Option<Arc<FilesBudget>>) -> FileCell {
        FileCell {
            path: path.to_path_buf(),
            writable,
            file: OnceLock::new(),
            tally,
        }
    }

    /// A cell holding `file`, already open (counted from now on).
    pub fn open(
        path: &Path,
        file: File,
        writable: bool,
        tally: Option<Arc<FilesBudget>>,
    ) -> FileCell {
        let cell = FileCell::closed(path, writable, tally);
        cell.count(1);
        let _ = cell.file.set(Arc::new(file));
        cell
    }

    /// Counts this cell in `tally` (in place of the one it had, if any).
    pub fn set_tally(&mut self, tally: Option<Arc<FilesBudget>>) {
        let open = self.is_open();
        if open {
            self.count(-1);
        }
        self.tally = tally;
        if open {
            self.count(1);
        }
    }

    fn count(&self, delta: isize) {
        if let Some(tally) = &self.tally {
            if delta > 0 {
                tally.open.fetch_add(1, Ordering::Relaxed);
            } else {
                tally.open.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// The file, opened now if it is not.
    pub fn get(&self) -> io::Result<&Arc<File>> {
        if let Some(file) = self.file.get() {
            return Ok(file);
        }
        let file = File::options()
            .read(true)
            .write(self.writable)
            .open(&self.path)?;
        let mut ours = false;
        let cell = self.file.get_or_init(|| {
            ours = true;
            Arc::new(file)
        });
        if ours {
            self.count(1);
        }
        Ok(cell)
    }

    pub fn is_open(&self) -> bool {
        self.file.get().is_some()
    }

    /// The file if it is open now; never opens it.
    pub fn get_if_open(&self) -> Option<&Arc<File>> {
        self.file.get()
    }

    /// Closes the descriptor (others holding a clone of it keep it alive); true when
    /// one was open.
    pub fn close(&mut self) -> bool {
        let closed = self.file.take().is_some();
        if closed {
            self.count(-1);
        }
        closed
    }

    pub fn tally(&self) -> Option<Arc<FilesBudget>> {
        self.tally.clone()
    }
}

impl Drop for FileCell {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_on_use_and_counts_what_is_open() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("f");
        std::fs::write(&path, b"abc")?;
        let tally = Arc::new(FilesBudget::default());
        let mut a = FileCell::closed(&path, false, Some(Arc::clone(&tally)));
        assert!(!a.is_open());
        assert_eq!(tally.open.load(Ordering::Relaxed), 0);
        let mut buf = [0u8; 3];
        std::os::unix::fs::FileExt::read_exact_at(&**a.get()?, &mut buf, 0)?;
        assert_eq!(&buf, b"abc");
        a.get()?;
        assert_eq!(tally.open.load(Ordering::Relaxed), 1);
        let b = FileCell::open(&path, File::open(&path)?, false, Some(Arc::clone(&tally)));
        assert_eq!(tally.open.load(Ordering::Relaxed), 2);
        assert!(a.close());
        assert!(!a.close());
        assert_eq!(tally.open.load(Ordering::Relaxed), 1);
        drop(b);
        assert_eq!(tally.open.load(Ordering::Relaxed), 0);
        tally.max.store(0, Ordering::Relaxed);
        a.get()?;
        assert!(tally.over());
        let mut moved = a;
        moved.set_tally(None);
        assert_eq!(tally.open.load(Ordering::Relaxed), 0);
        Ok(())
    }
}
