//! An append-only file written through a sliding shared memory mapping.
//!
//! Why a mapping: an append must be "handed to the OS" before it returns, so that a
//! killed process loses nothing it acknowledged. A `write(2)` per append costs a system
//! call on every request; a store into a `MAP_SHARED` mapping lands in the same page
//! cache with none. A killed process's dirty pages stay in the page cache and reach the
//! disk as usual; `fdatasync` writes them like any other dirty page.
//!
//! Why a sliding window: pages touched through a mapping count in the process's RSS
//! while they stay mapped. Only a window of `window_bytes` is mapped at a time, so RSS
//! stays bounded however large the file grows. Keep windows small: the kernel may back
//! a file with large folios and map a folio whole, so a mapping's RSS tends toward its
//! full size (measured: a 1 MiB window cost 1 MiB of RSS after 64 KiB of writes).
//!
//! Why `posix_fallocate` before mapping: storing into a mapped page whose disk blocks
//! cannot be allocated raises SIGBUS. Reserving the blocks first turns a full disk into
//! an `ENOSPC` error from a system call, before anything is written.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::{MmapMut, MmapOptions};

/// Page size assumed for mapping offsets; 4 KiB on every platform we run on, and any
/// multiple of the real page size would do.
const PAGE_BYTES: u64 = 4096;

/// `MADV_POPULATE_WRITE` (Linux 5.14); not in every libc crate release.
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// How far ahead of the write position pages are faulted in, in one call. Small enough
/// that a slow queue does not hold a whole window of RSS, large enough that the call is
/// rare (once per 64 KiB written).
const POPULATE_AHEAD_BYTES: u64 = 64 * 1024;

pub(crate) struct MapFile {
    file: Arc<File>,
    path: PathBuf,
    window: Option<MmapMut>,
    /// File offset of the window's first byte (page-aligned).
    window_start: u64,
    /// File offset up to which the window's pages have been faulted in.
    populated_to: u64,
    /// Offset of the next byte to write: everything before it is valid data.
    end: u64,
    /// Bytes reserved on disk (the file's size while it is being written).
    allocated: u64,
    window_bytes: u64,
    /// Windows stop here (a segment's nominal size) unless one append needs more, so
    /// small segments do not reserve a whole window of disk each.
    cap_bytes: u64,
}

impl MapFile {
    /// Wraps an open file whose valid data ends at `end` (its size may be larger).
    pub fn new(file: File, path: &Path, end: u64, window_bytes: u64) -> io::Result<MapFile> {
        let allocated = file.metadata()?.len().max(end);
        Ok(MapFile {
            file: Arc::new(file),
            path: path.to_path_buf(),
            window: None,
            window_start: 0,
            populated_to: 0,
            end,
            allocated,
            window_bytes: window_bytes.max(PAGE_BYTES),
            cap_bytes: u64::MAX,
        })
    }

    /// Caps windows at `cap_bytes` of file (see the field).
    pub fn with_cap(mut self, cap_bytes: u64) -> MapFile {
        self.cap_bytes = cap_bytes;
        self
    }

    /// Makes room for `len` more bytes (reserving disk and mapping), so that the appends
    /// that follow, up to `len` bytes in all, cannot fail.
    pub fn reserve(&mut self, len: u64) -> io::Result<()> {
        self.ensure_window(len)
    }

    pub fn file(&self) -> &Arc<File> {
        &self.file
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn end(&self) -> u64 {
        self.end
    }

    /// Appends the concatenation of `parts`; returns the offset it was written at.
    /// On error nothing was written and `end` is unchanged.
    pub fn append(&mut self, parts: &[&[u8]]) -> io::Result<u64> {
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        self.ensure_window(len)?;
        if self.end + len > self.populated_to {
            self.populate(self.end + len);
        }
        let at = self.end;
        let window = match self.window.as_mut() {
            Some(w) => w,
            None => return Err(io::Error::other("mapping window missing after ensure")),
        };
        let mut pos = (at - self.window_start) as usize;
        for part in parts {
            window[pos..pos + part.len()].copy_from_slice(part);
            pos += part.len();
        }
        self.end += len;
        Ok(at)
    }

    /// The bytes `[offset, offset+len)` if they are valid data inside the mapped window.
    pub fn mapped(&self, offset: u64, len: u64) -> Option<&[u8]> {
        let window = self.window.as_ref()?;
        if offset < self.window_start || offset + len > self.end {
            return None;
        }
        let start = (offset - self.window_start) as usize;
        let stop = start + len as usize;
        if stop > window.len() {
            return None;
        }
        Some(&window[start..stop])
    }

    /// Makes the window cover `[end, end+len)`, reserving disk blocks first.
    fn ensure_window(&mut self, len: u64) -> io::Result<()> {
        if let Some(w) = &self.window {
            if self.end + len <= self.window_start + w.len() as u64 {
                return Ok(());
            }
        }
        let start = self.end / PAGE_BYTES * PAGE_BYTES;
        let need = self.end + len - start;
        let window = self.window_bytes.min(self.cap_bytes.saturating_sub(start));
        let window_len = need.max(window).div_ceil(PAGE_BYTES) * PAGE_BYTES;
        if start + window_len > self.allocated {
            #[cfg(feature = "fault-injection")]
            if crate::fault::disk_full(&self.path) {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            let from = self.allocated;
            let grow = start + window_len - from;
            // SAFETY: posix_fallocate takes a valid open descriptor and two offsets; it
            // touches no memory of ours.
            let rc = unsafe {
                libc::posix_fallocate(
                    self.file.as_raw_fd(),
                    from as libc::off_t,
                    grow as libc::off_t,
                )
            };
            if rc != 0 {
                // Some blocks may have been reserved before the failure; the file's
                // size says how far it got, and the tail is zeroes, which never parse.
                if let Ok(meta) = self.file.metadata() {
                    self.allocated = self.allocated.max(meta.len());
                }
                return Err(io::Error::from_raw_os_error(rc));
            }
            self.allocated = start + window_len;
        }
        self.window = None;
        // SAFETY: the mapping is of a file we own and keep open; its range lies inside
        // the file (reserved just above), so no access can fault for lack of backing.
        // We never hand out references that outlive `&self`, and every access goes
        // through `&mut self` (writes) or `&self` (reads) under the queue's lock, so
        // Rust's aliasing rules hold. Other processes do not write our files (the store
        // holds a lock file).
        let map = unsafe {
            MmapOptions::new()
                .offset(start)
                .len(window_len as usize)
                .map_mut(&*self.file)?
        };
        // Fault the whole window in with one call instead of one trap per page: each
        // first store into a page would otherwise take a read fault and a write fault.
        // Old kernels (before 5.14) refuse the advice; the stores then fault as usual.
        // SAFETY: the range is exactly the mapping just created, which we own.
        unsafe {
            libc::madvise(
                map.as_ptr() as *mut libc::c_void,
                map.len(),
                MADV_POPULATE_WRITE,
            );
        }
        self.window = Some(map);
        self.window_start = start;
        Ok(())
    }

    /// Faults in the window's pages from `populated_to` to at least `to` (and up to
    /// [`POPULATE_AHEAD_BYTES`] further) with one call, instead of one trap per page:
    /// each first store into a page would otherwise take a read fault and a write
    /// fault. Old kernels (before 5.14) refuse the advice; the stores then fault as
    /// usual, which is only slower.
    fn populate(&mut self, to: u64) {
        let Some(window) = &self.window else { return };
        let window_end = self.window_start + window.len() as u64;
        let from = self.populated_to.max(self.window_start);
        let until = to.max(from + POPULATE_AHEAD_BYTES).div_ceil(PAGE_BYTES) * PAGE_BYTES;
        let until = until.min(window_end);
        if until <= from {
            return;
        }
        let offset = (from - self.window_start) as usize;
        // SAFETY: `[offset, offset + len)` lies inside the mapping we own (checked
        // against `window_end` above); madvise only faults pages in.
        unsafe {
            libc::madvise(
                window.as_ptr().add(offset) as *mut libc::c_void,
                (until - from) as usize,
                MADV_POPULATE_WRITE,
            );
        }
        self.populated_to = until;
    }

    /// Drops the window and cuts the file to its valid data; used when a segment is
    /// sealed and on a clean close.
    pub fn trim(&mut self) -> io::Result<()> {
        self.window = None;
        if self.allocated != self.end {
            self.file.set_len(self.end)?;
            self.allocated = self.end;
        }
        Ok(())
    }

    /// Drops the mapping (frees its RSS); the next append maps again.
    pub fn unmap(&mut self) {
        self.window = None;
    }
}

/// fsyncs a directory, so that files created or removed in it survive an OS crash.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}
