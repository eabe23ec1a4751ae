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
//!
//! Staging (for `buffered` durability, which may hold appends in the process for a
//! short, bounded time): appends collect in a buffer of [`STAGE_BYTES`] and reach the
//! file in one `pwrite` when it fills, or when the owner calls [`MapFile::flush_staged`]
//! (on a timer, before an fsync, before a scan of the file). Filling a page of the file
//! through a mapping costs the kernel a fault, a zeroed page and page-table work; one
//! `pwrite` per 64 KiB costs a copy (measured with `examples/append_only`: 2-3x more
//! 512 B appends per second from one thread). Staged bytes are served to readers from the buffer. Disk space is reserved
//! with `posix_fallocate` before a byte is staged, as for the mapping, so an append that
//! was accepted cannot meet a full disk when it is written.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::file_cell::{FileCell, FilesBudget};

use memmap2::{MmapMut, MmapOptions};

/// Page size assumed for mapping offsets; 4 KiB on every platform we run on, and any
/// multiple of the real page size would do.
const PAGE_BYTES: u64 = 4096;

/// `MADV_POPULATE_WRITE` (Linux 5.14); not in every libc crate release.
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// Size of the staging buffer: one `pwrite` per this many bytes of appends.
pub(crate) const STAGE_BYTES: usize = 64 * 1024;

/// Appends written with `pwrite` after the window was dropped (an idle file's first
/// writes) before a window is mapped again: mapping and faulting in a window costs
/// more than a few small writes, and many files see only a few (a queue among
/// thousands, touched once by a whole-store command). A file written on maps soon.
const WRITES_BEFORE_MAPPING: u32 = 8;

/// How far ahead of the write position pages are faulted in, in one call. Small enough
/// that a slow queue does not hold a whole window of RSS, large enough that the call is
/// rare (once per 64 KiB written).
const POPULATE_AHEAD_BYTES: u64 = 64 * 1024;
// Populating works in whole pages; a staged batch is written in one `pwrite`
// whose size the window can take.
const _: () = assert!(POPULATE_AHEAD_BYTES.is_multiple_of(PAGE_BYTES));
const _: () = assert!(PAGE_BYTES.is_power_of_two());
const _: () = assert!(STAGE_BYTES as u64 >= PAGE_BYTES);

pub(crate) struct MapFile {
    /// Closed by [`MapFile::close`] (an idle queue holds no descriptor) and opened
    /// again by the next use; closing never trims, so nothing else changes.
    file: FileCell,
    /// Appends written with `pwrite` since the window was last dropped (see
    /// [`WRITES_BEFORE_MAPPING`]).
    unmapped_writes: u32,
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
    /// Appends go to `staged` instead of the mapping (see the module docs).
    staging: bool,
    /// Bytes `[end - staged.len(), end)`, not yet written to the file.
    staged: Vec<u8>,
    /// When the oldest staged byte was appended.
    staged_since: Option<std::time::Instant>,
    /// Bytes a [`MapFile::reserve`] made room for in `staged` that the appends of
    /// that batch have not used yet: those appends do no I/O and cannot fail.
    stage_reserved: u64,
}

impl MapFile {
    /// Wraps an open file whose valid data ends at `end` (its size may be larger).
    pub fn new(file: File, path: &Path, end: u64, window_bytes: u64) -> io::Result<MapFile> {
        let allocated = file.metadata()?.len().max(end);
        Ok(MapFile {
            file: FileCell::open(path, file, true, None),
            unmapped_writes: 0,
            path: path.to_path_buf(),
            window: None,
            window_start: 0,
            populated_to: 0,
            end,
            allocated,
            window_bytes: window_bytes.max(PAGE_BYTES),
            cap_bytes: u64::MAX,
            staging: false,
            staged: Vec::new(),
            staged_since: None,
            stage_reserved: 0,
        })
    }

    /// Turns staging on or off (see the module docs); turning it off writes what is
    /// staged first. With staging on, the mapping window is dropped.
    pub fn set_staging(&mut self, on: bool) -> io::Result<()> {
        if on == self.staging {
            return Ok(());
        }
        if on {
            self.window = None;
        } else {
            self.flush_staged()?;
            self.staged = Vec::new();
        }
        self.staging = on;
        Ok(())
    }

    /// Whether staging is not what `wanted` says (a switch still to be made).
    pub fn staging_differs(&self, wanted: bool) -> bool {
        self.staging != wanted
    }

    /// End of what the file itself holds; `[file_end, end)` is staged. Reads of the
    /// file (not through [`MapFile::mapped`]) must stay below it: past it the file
    /// holds zeroes (reserved space) or nothing yet.
    pub fn file_end(&self) -> u64 {
        self.end - self.staged.len() as u64
    }

    /// Bytes staged and not yet written to the file.
    pub fn staged_len(&self) -> usize {
        self.staged.len()
    }

    /// Forgets the staged bytes from file offset `from` on, as if never appended: how
    /// a batch whose write failed is taken back whole. `from` must lie in the staged
    /// range.
    pub fn unstage_from(&mut self, from: u64) {
        let file_end = self.file_end();
        assert!(
            from >= file_end && from <= self.end,
            "unstage_from({from}) outside the staged range [{file_end}, {})",
            self.end
        );
        self.staged.truncate((from - file_end) as usize);
        self.end = from;
        self.stage_reserved = 0;
        if self.staged.is_empty() {
            self.staged_since = None;
        }
    }

    /// When the oldest staged byte was appended, if any is staged.
    pub fn staged_since(&self) -> Option<std::time::Instant> {
        self.staged_since
    }

    /// Writes the staged bytes to the file. On error they stay staged (a later call
    /// writes them again, from the same offset) and the error is returned.
    pub fn flush_staged(&mut self) -> io::Result<()> {
        if self.staged.is_empty() {
            return Ok(());
        }
        use std::os::unix::fs::FileExt;
        let at = self.file_end();
        self.fd()?.write_all_at(&self.staged, at)?;
        self.staged.clear();
        self.staged_since = None;
        self.stage_reserved = 0;
        if self.staged.capacity() > 4 * STAGE_BYTES {
            // Grown for one large batch: give the memory back.
            self.staged = Vec::new();
        }
        Ok(())
    }

    /// Caps windows at `cap_bytes` of file (see the field).
    pub fn with_cap(mut self, cap_bytes: u64) -> MapFile {
        self.cap_bytes = cap_bytes;
        self
    }

    /// Makes room for `len` more bytes (reserving disk, and mapping or staging room),
    /// so that the appends that follow, up to `len` bytes in all, cannot fail.
    pub fn reserve(&mut self, len: u64) -> io::Result<()> {
        if !self.staging {
            return self.ensure_window(len);
        }
        self.reserve_disk(self.end + len)?;
        if !self.staged.is_empty() && self.staged.len() as u64 + len > STAGE_BYTES as u64 {
            self.flush_staged()?;
        }
        // A batch larger than the buffer is staged whole, never written in parts: an
        // I/O error in its middle would leave half a batch behind `end`. The queue
        // writes it before the append returns (`State::append_records`).
        self.staged.reserve(len as usize);
        self.stage_reserved = len;
        Ok(())
    }

    /// Reserves disk blocks up to file offset `to` (in window-sized steps), so that
    /// writing below it cannot fail for lack of space.
    fn reserve_disk(&mut self, to: u64) -> io::Result<()> {
        if to <= self.allocated {
            return Ok(());
        }
        #[cfg(feature = "fault-injection")]
        if crate::fault::disk_full(&self.path) {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let step = self
            .window_bytes
            .min(self.cap_bytes.saturating_sub(self.allocated));
        let new_allocated = to.max(self.allocated + step).div_ceil(PAGE_BYTES) * PAGE_BYTES;
        let from = self.allocated;
        let file = Arc::clone(self.fd()?);
        // SAFETY: posix_fallocate takes a valid open descriptor and two offsets; it
        // touches no memory of ours.
        let rc = unsafe {
            libc::posix_fallocate(
                file.as_raw_fd(),
                from as libc::off_t,
                (new_allocated - from) as libc::off_t,
            )
        };
        if rc != 0 {
            // Some blocks may have been reserved before the failure; the file's size
            // says how far it got, and the tail is zeroes, which never parse.
            if let Ok(meta) = file.metadata() {
                self.allocated = self.allocated.max(meta.len());
            }
            return Err(io::Error::from_raw_os_error(rc));
        }
        self.allocated = new_allocated;
        Ok(())
    }

    /// The file, opened again if it was closed.
    pub fn file(&self) -> io::Result<&Arc<File>> {
        self.fd()
    }

    fn fd(&self) -> io::Result<&Arc<File>> {
        // What was reserved before is still the file's when it opens again: closing
        // never trims.
        self.file.get()
    }

    /// Whether the descriptor is open now.
    pub fn is_open(&self) -> bool {
        self.file.is_open()
    }

    /// Counts the descriptor in the store's tally (see `file_cell.rs`).
    pub fn set_tally(&mut self, tally: Option<Arc<FilesBudget>>) {
        self.file.set_tally(tally);
    }

    pub fn tally(&self) -> Option<Arc<FilesBudget>> {
        self.file.tally()
    }

    /// Writes what is staged, drops the window and closes the descriptor; nothing
    /// else changes, and the next use opens it again. On error (the staged bytes
    /// could not be written) it stays open.
    pub fn close(&mut self) -> io::Result<()> {
        self.flush_staged()?;
        self.staged = Vec::new();
        self.drop_window();
        self.file.close();
        Ok(())
    }

    fn drop_window(&mut self) {
        self.window = None;
        self.populated_to = 0;
        self.unmapped_writes = 0;
    }

    /// Writes one append with `pwrite`, without a mapping (see
    /// [`WRITES_BEFORE_MAPPING`]); disk space is reserved first, as for the mapping.
    fn append_unmapped(&mut self, parts: &[&[u8]], len: u64) -> io::Result<u64> {
        self.reserve_disk(self.end + len)?;
        let at = self.end;
        let joined;
        let bytes: &[u8] = match parts {
            [one] => one,
            _ => {
                joined = parts.concat();
                &joined
            }
        };
        use std::os::unix::fs::FileExt;
        self.fd()?.write_all_at(bytes, at)?;
        self.unmapped_writes += 1;
        self.end += len;
        Ok(at)
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
        if self.staging {
            if self.stage_reserved >= len {
                self.stage_reserved -= len;
            } else {
                self.reserve(len)?;
                self.stage_reserved -= len;
            }
            let at = self.end;
            for part in parts {
                self.staged.extend_from_slice(part);
            }
            if self.staged_since.is_none() {
                self.staged_since = Some(std::time::Instant::now());
            }
            self.end += len;
            return Ok(at);
        }
        if self.window.is_none() && self.unmapped_writes < WRITES_BEFORE_MAPPING {
            return self.append_unmapped(parts, len);
        }
        self.ensure_window(len)?;
        if self.end + len > self.populated_to {
            self.populate(self.end + len);
        }
        let at = self.end;
        let window = match self.window.as_mut() {
            Some(w) => w,
            None => return Err(io::Error::other("mapping window missing after ensure")),
        };
        assert!(
            at >= self.window_start && at + len <= self.window_start + window.len() as u64,
            "an append stays inside its mapping window"
        );
        let mut pos = (at - self.window_start) as usize;
        for part in parts {
            window[pos..pos + part.len()].copy_from_slice(part);
            pos += part.len();
        }
        self.end += len;
        Ok(at)
    }

    /// The bytes `[offset, offset+len)` if they are valid data inside the mapped window.
    /// When staging, the bytes still staged (and only those).
    pub fn mapped(&self, offset: u64, len: u64) -> Option<&[u8]> {
        if self.staging {
            let file_end = self.file_end();
            if offset < file_end || offset + len > self.end {
                return None;
            }
            let start = (offset - file_end) as usize;
            return Some(&self.staged[start..start + len as usize]);
        }
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
        self.reserve_disk(start + window_len)?;
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
                .map_mut(&**self.fd()?)?
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

    /// Writes what is staged, drops the window and cuts the file to its valid data;
    /// used when a segment is sealed and on a clean close.
    pub fn trim(&mut self) -> io::Result<()> {
        self.flush_staged()?;
        self.window = None;
        if self.allocated != self.end {
            self.fd()?.set_len(self.end)?;
            self.allocated = self.end;
        }
        Ok(())
    }

    /// Drops the mapping (frees its RSS); the next append maps again. Staged bytes
    /// are written first, and the staging buffer's memory is given back; if that write
    /// fails they stay staged and the error is returned.
    pub fn unmap(&mut self) -> io::Result<()> {
        self.drop_window();
        self.flush_staged()?;
        self.staged = Vec::new();
        Ok(())
    }
}

/// fsyncs a directory, so that files created or removed in it survive an OS crash.
/// Every directory fsync of the engine goes through here (see [`sync_file`]).
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(feature = "fault-injection")]
    crate::fault::before_sync(crate::fault::Synced::Dir(dir));
    File::open(dir)?.sync_all()?;
    #[cfg(feature = "fault-injection")]
    crate::fault::dir_synced(dir);
    Ok(())
}

/// fdatasyncs a file. Every file fsync of the engine goes through here, so that the
/// tests' power-cut simulation (`fault::observe_syncs`) sees each one.
pub(crate) fn sync_file(file: &File) -> io::Result<()> {
    #[cfg(feature = "fault-injection")]
    crate::fault::before_sync(crate::fault::Synced::File(file));
    file.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn open(dir: &Path) -> MapFile {
        let path = dir.join("f");
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        MapFile::new(file, &path, 0, 64 * 1024).unwrap()
    }

    fn file_bytes(m: &MapFile, from: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        m.file().unwrap().read_exact_at(&mut buf, from).unwrap();
        buf
    }

    #[test]
    fn staged_bytes_are_served_then_written_when_the_buffer_fills() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = open(dir.path());
        m.set_staging(true).unwrap();
        let rec = [7u8; 1000];
        assert_eq!(m.append(&[&rec[..10], &rec[10..]]).unwrap(), 0);
        assert_eq!((m.end(), m.file_end()), (1000, 0));
        assert_eq!(m.mapped(0, 1000), Some(&rec[..]));
        assert!(m.staged_since().is_some());
        // The file holds nothing yet (its reserved space reads as zeroes).
        assert_eq!(file_bytes(&m, 0, 4), [0, 0, 0, 0]);
        // Fill past one buffer: the first records reach the file, none is split.
        let mut n = 1u64;
        while m.file_end() == 0 {
            m.append(&[&rec]).unwrap();
            n += 1;
        }
        assert_eq!(m.end(), n * 1000);
        assert_eq!(m.file_end() % 1000, 0);
        assert!(m.end() - m.file_end() <= STAGE_BYTES as u64);
        assert_eq!(file_bytes(&m, 0, 1000), rec);
        // A range below `file_end` is the file's, not the buffer's.
        assert_eq!(m.mapped(0, 1000), None);
        m.trim().unwrap();
        assert_eq!(m.file_end(), m.end());
        assert_eq!(m.file().unwrap().metadata().unwrap().len(), m.end());
        assert_eq!(file_bytes(&m, m.end() - 1000, 1000), rec);
    }

    #[test]
    fn a_reserved_batch_larger_than_the_buffer_is_staged_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = open(dir.path());
        m.set_staging(true).unwrap();
        m.append(&[b"head"]).unwrap();
        let rec = vec![1u8; 4096];
        // Larger than the capacity kept after a flush, to see it given back.
        let count = 5 * STAGE_BYTES / rec.len();
        m.reserve((count * rec.len()) as u64).unwrap();
        // The reservation wrote what was staged before the batch ...
        assert_eq!(m.file_end(), 4);
        for _ in 0..count {
            m.append(&[&rec]).unwrap();
        }
        // ... and the batch itself waits whole, with no write in its middle.
        assert_eq!(m.file_end(), 4);
        assert_eq!(m.end(), 4 + (count * rec.len()) as u64);
        assert!(m.staged.capacity() > 4 * STAGE_BYTES);
        m.flush_staged().unwrap();
        assert_eq!(m.file_end(), m.end());
        assert_eq!(
            m.staged.capacity(),
            0,
            "a buffer grown for one batch is given back"
        );
        assert_eq!(file_bytes(&m, m.end() - 4096, 4096), rec);
    }

    #[test]
    fn turning_staging_off_writes_what_is_staged_and_maps_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = open(dir.path());
        m.append(&[b"mapped "]).unwrap();
        m.set_staging(true).unwrap();
        m.append(&[b"staged "]).unwrap();
        assert_eq!(m.file_end(), 7);
        m.set_staging(false).unwrap();
        assert_eq!(m.file_end(), m.end());
        m.append(&[b"written again"]).unwrap();
        assert_eq!(file_bytes(&m, 14, 13), b"written again");
        m.trim().unwrap();
        assert_eq!(file_bytes(&m, 0, 27), b"mapped staged written again");
    }

    #[test]
    fn the_first_writes_after_the_window_is_dropped_are_pwrites_then_it_maps() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = open(dir.path());
        for i in 0..WRITES_BEFORE_MAPPING {
            let at = m.append(&[b"ab", b"cd"]).unwrap();
            assert_eq!(at, u64::from(i) * 4);
            assert!(m.window.is_none(), "write {i} maps nothing");
            assert_eq!(m.mapped(at, 4), None);
        }
        let at = m.append(&[b"mapped"]).unwrap();
        assert!(m.window.is_some(), "a file written on is mapped");
        assert_eq!(m.mapped(at, 6), Some(&b"mapped"[..]));
        m.unmap().unwrap();
        let at = m.append(&[b"again"]).unwrap();
        assert!(m.window.is_none(), "dropping the window starts over");
        let len = (WRITES_BEFORE_MAPPING * 4) as usize;
        assert_eq!(
            file_bytes(&m, 0, len),
            b"abcd".repeat(WRITES_BEFORE_MAPPING as usize)
        );
        assert_eq!(file_bytes(&m, at, 5), b"again");
    }

    #[test]
    fn unstage_takes_back_the_tail_of_what_is_staged() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = open(dir.path());
        m.set_staging(true).unwrap();
        m.append(&[b"keep"]).unwrap();
        m.flush_staged().unwrap();
        m.append(&[b"also"]).unwrap();
        m.append(&[b"drop"]).unwrap();
        m.unstage_from(8);
        assert_eq!((m.file_end(), m.end()), (4, 8));
        assert_eq!(m.mapped(4, 4), Some(&b"also"[..]));
        m.unstage_from(4);
        assert_eq!((m.staged_len(), m.staged_since()), (0, None));
        m.append(&[b"next"]).unwrap();
        m.trim().unwrap();
        assert_eq!(file_bytes(&m, 0, 8), b"keepnext");
    }

    #[test]
    fn close_writes_staged_bytes_and_reopen_goes_on_where_it_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = open(dir.path());
        m.append(&[b"mapped "]).unwrap();
        m.set_staging(true).unwrap();
        m.append(&[b"staged "]).unwrap();
        m.close().unwrap();
        assert!(!m.is_open());
        assert_eq!(m.mapped(0, 7), None);
        assert_eq!(m.file_end(), 14);
        m.set_staging(false).unwrap();
        m.append(&[b"after"]).unwrap();
        m.trim().unwrap();
        assert_eq!(file_bytes(&m, 0, 19), b"mapped staged after");
    }

    #[test]
    fn unmap_writes_staged_bytes_and_frees_the_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = open(dir.path());
        m.set_staging(true).unwrap();
        m.append(&[b"abc"]).unwrap();
        m.unmap().unwrap();
        assert_eq!(m.file_end(), 3);
        assert_eq!(m.staged.capacity(), 0);
        assert_eq!(m.staged_since(), None);
        assert_eq!(file_bytes(&m, 0, 3), b"abc");
    }
}
