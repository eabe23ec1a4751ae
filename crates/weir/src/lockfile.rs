//! One process owns a data directory at a time: a lock on the directory itself, and one
//! on its `LOCK` file.
//!
//! Why the directory: a lock on a file only excludes openers of that same file. Once
//! `LOCK` is unlinked (by an operator cleaning up, a script, a backup restore), a second
//! process creates a new `LOCK`, locks it, and two servers write one directory. A
//! directory cannot be unlinked while it holds files (the store's `queues/` at least),
//! and one that is renamed or replaced is a different directory, so `flock` on the
//! data directory's own descriptor is what a second opener always meets.
//!
//! Why `LOCK` as well: its POSIX record lock (`fcntl(F_SETLK)`) is what weir versions
//! before the directory lock take, so a new and an old server exclude each other during
//! an upgrade. `flock` belongs to the open file description: a child process forked by a
//! program using the library shares it until it execs (our descriptors are
//! close-on-exec), which can at most delay another opener for that moment.
//!
//! Neither lock excludes a second opener in the same process (a record lock belongs to
//! the process; a second `flock` on a new descriptor would, but the registry answers
//! first and without a system call), so a registry of the directories this process has
//! open does that.

use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{Error, Result};

/// Directories this process has open (canonical paths).
static OPEN_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// The lock of one data directory; released on drop.
pub(crate) struct DirLock {
    file: Option<File>,
    /// The data directory itself, `flock`ed.
    dir_file: Option<File>,
    dir: PathBuf,
}

/// Takes an exclusive `flock` on the directory `dir`; `Locked` when another open file
/// description holds it.
fn lock_directory(dir: &Path) -> Result<File> {
    let file = File::open(dir).map_err(|e| Error::io(format!("opening {}", dir.display()), e))?;
    // SAFETY: a valid descriptor; flock only reads its arguments.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => Err(Error::Locked {
                path: dir.to_path_buf(),
            }),
            _ => Err(Error::io(format!("locking {}", dir.display()), e)),
        };
    }
    Ok(file)
}

impl DirLock {
    pub fn acquire(dir: &Path) -> Result<DirLock> {
        let canonical = fs::canonicalize(dir)
            .map_err(|e| Error::io(format!("resolving {}", dir.display()), e))?;
        let mut open = OPEN_DIRS.lock().unwrap_or_else(|p| p.into_inner());
        if open.contains(&canonical) {
            return Err(Error::Locked {
                path: dir.to_path_buf(),
            });
        }
        let dir_file = lock_directory(&canonical).map_err(|e| match e {
            Error::Locked { .. } => Error::Locked {
                path: dir.to_path_buf(),
            },
            e => e,
        })?;
        let path = canonical.join("LOCK");
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        // SAFETY: `flock` is a plain C struct for which all-zero bytes are valid; the
        // fields that matter are set below.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = libc::F_WRLCK as libc::c_short;
        lock.l_whence = libc::SEEK_SET as libc::c_short;
        lock.l_start = 0;
        lock.l_len = 0;
        // SAFETY: a valid descriptor and a pointer to a live, initialised struct.
        let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &lock) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EACCES) | Some(libc::EAGAIN) => Err(Error::Locked {
                    path: dir.to_path_buf(),
                }),
                _ => Err(Error::io(format!("locking {}", path.display()), e)),
            };
        }
        open.push(canonical.clone());
        Ok(DirLock {
            file: Some(file),
            dir_file: Some(dir_file),
            dir: canonical,
        })
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Close first (releasing the record lock), then let this process open the
        // directory again: the other order would let a new opener take the lock and
        // then lose it when this descriptor closes (POSIX drops all of a process's
        // locks on a file when any of its descriptors for it is closed).
        drop(self.file.take());
        drop(self.dir_file.take());
        let mut open = OPEN_DIRS.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|d| d != &self.dir);
    }
}
