//! `space-reserve`: disk space set aside so that readers can always drain a full disk.
//!
//! On a full disk, appends fail (`DiskFull`) and that is the contract. But consuming
//! items writes too: each take or confirmation is a reader-journal record, and a new
//! reader writes the reader list. If those failed for lack of space, nothing could be
//! consumed, no segment would ever be deleted, and the disk would stay full for good
//! (a deadlock only an operator could break). So the store keeps a file of
//! [`crate::StoreOptions::space_reserve_bytes`] (preallocated, so its blocks are really
//! taken) that appends never get: they meet the full disk while it still exists. The
//! first write of reader state that fails for lack of space deletes it and tries
//! again; the space it gave back lets readers consume until whole segments are deleted,
//! which gives back far more. The background thread sets the reserve up again once
//! the file system has room for it several times over.
//!
//! Why a file and not a count: the space must be really free when it is needed, also
//! after a restart on a full disk, and also against other programs on the same file
//! system; only blocks the store holds can promise that.

use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

/// The file's name in the data directory.
pub(crate) const FILE_NAME: &str = "space-reserve";
/// The reserve is set up again only when the file system has this many times its size
/// free: otherwise appends would fill the disk again at once and the reserve would
/// flap between taken and released.
const FREE_FACTOR_TO_RESTORE: u64 = 4;

pub(crate) struct SpaceReserve {
    path: PathBuf,
    bytes: u64,
    state: Mutex<State>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// The file holds its space.
    Present,
    /// Given to readers on a full disk: appends are held back until as much is free.
    Released,
    /// Never set up (no room for it yet, or turned off): nothing to protect.
    Absent,
}

impl SpaceReserve {
    /// The reserve of the store in `dir`; set up now if there is room (a store opened
    /// on a full disk starts without it, and gets it back once there is room).
    pub fn open(dir: &Path, bytes: u64) -> SpaceReserve {
        let path = dir.join(FILE_NAME);
        let present = bytes > 0
            && fs::metadata(&path)
                .map(|m| m.len() >= bytes)
                .unwrap_or(false);
        let reserve = SpaceReserve {
            path,
            bytes,
            state: Mutex::new(if present {
                State::Present
            } else {
                State::Absent
            }),
        };
        if bytes == 0 {
            // Disabled: a reserve left by an earlier configuration is given back.
            let _ = fs::remove_file(&reserve.path);
        }
        reserve.restore();
        reserve
    }

    /// Gives the reserved space back to the file system; false when there was none to
    /// give (already released, or disabled).
    pub fn release(&self) -> bool {
        let mut state = self.state.lock();
        if *state != State::Present {
            return false;
        }
        match fs::remove_file(&self.path) {
            Ok(()) => {
                *state = State::Released;
                tracing::warn!(path = %self.path.display(), bytes = self.bytes, "disk full: space reserve released so readers can go on; appends refused until as much is free");
                true
            }
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "could not release the space reserve");
                false
            }
        }
    }

    /// Whether appends may take space now: always while the reserve holds its space;
    /// once it was released, only while the file system has at least the reserve's
    /// size free, so that appends never eat what was given back to readers. Costs a
    /// `statvfs` only in that second case (a full disk).
    pub fn appends_allowed(&self) -> bool {
        if *self.state.lock() != State::Released {
            return true;
        }
        free_bytes(self.path.parent().unwrap_or(Path::new(".")))
            .map_or(true, |free| free >= self.bytes)
    }

    /// Sets the reserve up again if it is missing and the file system has room for it
    /// several times over. Cheap when it is present (no system call).
    pub fn restore(&self) {
        let mut state = self.state.lock();
        if *state == State::Present || self.bytes == 0 {
            return;
        }
        match free_bytes(self.path.parent().unwrap_or(Path::new("."))) {
            Ok(free) if free >= self.bytes.saturating_mul(FREE_FACTOR_TO_RESTORE) => {}
            Ok(_) => return,
            Err(e) => {
                tracing::debug!(error = %e, "statvfs of the data directory failed");
                return;
            }
        }
        match allocate(&self.path, self.bytes) {
            Ok(()) => {
                *state = State::Present;
                tracing::info!(path = %self.path.display(), bytes = self.bytes, "space reserve in place");
            }
            Err(e) => {
                let _ = fs::remove_file(&self.path);
                tracing::debug!(path = %self.path.display(), error = %e, "could not set up the space reserve");
            }
        }
    }

    #[cfg(test)]
    fn is_present(&self) -> bool {
        *self.state.lock() == State::Present
    }
}

/// Creates `path` with `bytes` of blocks really allocated (not a sparse file).
fn allocate(path: &Path, bytes: u64) -> io::Result<()> {
    let file = File::create(path)?;
    // SAFETY: a valid descriptor and two offsets; posix_fallocate touches no memory of
    // ours.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, bytes as libc::off_t) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    crate::mapfile::sync_file(&file)
}

/// Bytes an unprivileged writer could still allocate on the file system of `dir`.
fn free_bytes(dir: &Path) -> io::Result<u64> {
    let mut c_path = dir.as_os_str().as_bytes().to_vec();
    c_path.push(0);
    // SAFETY: statvfs is a plain C struct for which all-zero bytes are valid.
    let mut state: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a pointer to a live struct.
    let rc = unsafe { libc::statvfs(c_path.as_ptr().cast(), &mut state) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((state.f_bavail as u64).saturating_mul(state.f_frsize as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_up_released_and_restored() {
        let dir = tempfile::tempdir().unwrap();
        let reserve = SpaceReserve::open(dir.path(), 64 * 1024);
        let path = dir.path().join(FILE_NAME);
        assert!(reserve.is_present());
        assert_eq!(fs::metadata(&path).unwrap().len(), 64 * 1024);
        assert!(reserve.release());
        assert!(!path.exists());
        assert!(!reserve.release(), "nothing left to release");
        assert!(reserve.appends_allowed(), "the file system has room");
        reserve.restore();
        assert!(reserve.is_present());
        // A store reopened finds it in place.
        drop(reserve);
        assert!(SpaceReserve::open(dir.path(), 64 * 1024).is_present());
        // Disabled: given back.
        let off = SpaceReserve::open(dir.path(), 0);
        assert!(!off.is_present() && !path.exists());
        assert!(!off.release());
        assert!(off.appends_allowed());
        // No room for it (a reserve larger than the disk): never set up, never in the
        // way of appends.
        let huge = SpaceReserve::open(dir.path(), u64::MAX / 8);
        assert!(!huge.is_present() && !path.exists());
        assert!(huge.appends_allowed());
    }
}
