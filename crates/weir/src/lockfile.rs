//! One process owns a data directory at a time: the `LOCK` file.
//!
//! Why POSIX record locks (`fcntl(F_SETLK)`) and not `flock`: an `flock` lock belongs to
//! the open file description, which a child process inherits between `fork` and `exec`;
//! a program that starts processes could then keep its own directory locked after
//! closing the store. Record locks belong to the process and are never inherited. They
//! do not exclude a second opener in the same process, so a registry of the
//! directories this process has open does that.

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
    dir: PathBuf,
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
        let mut open = OPEN_DIRS.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|d| d != &self.dir);
    }
}
