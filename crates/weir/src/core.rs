//! `QueueCore`: one queue's state behind one lock, and every operation on it.
//!
//! The state is small and bounded: the list of segment files, the writer's mapping
//! window, and per reader a position, its out-of-order confirmations (as ranges), its
//! leases and released items, and one read-ahead buffer. Nothing here grows with the
//! backlog; items live only in the segment files (and the OS page cache).
//!
//! Every operation takes the queue's lock once, does its work without system calls in
//! the common case (appends and confirmations are stores into mappings), and returns a
//! [`Ticket`] when the caller must wait for an fsync (`synced` durability). The wait
//! happens outside the lock, through group commit: the first waiter fsyncs for all,
//! and at the end of its round wakes only the waiters the round covered, plus the
//! oldest one it did not cover to lead the next round. Waking every waiter each round
//! (a condition variable's `notify_all`) cost more than the fsync itself with 64
//! threads on 2 cores: most of them woke only to sleep again.
//!
//! Invariants per reader (checked by `ReaderState::check` in debug builds):
//! - `acked_below <= next_seq` and `cursor_seq <= next_seq`;
//! - every leased or released seq lies in `[acked_below, cursor_seq)` and is not
//!   confirmed; every unconfirmed seq below the cursor is leased or released;
//! - after a reopen the cursor restarts at `acked_below`, so confirmations made out of
//!   order before the restart can lie above it (or pull `acked_below` past it): reading
//!   skips those items.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use tokio::sync::Notify;

use crate::config::{Durability, QueueConfig};
use crate::error::{Error, Result};
use crate::file_cell::FilesBudget;
use crate::frame::{
    decode_header, encode_header, new_seed, verify, RecordHeader, RECORD_HEADER_BYTES,
    RECORD_PAYLOAD_BYTES_MAX,
};
use crate::intervals::IntervalSet;
use crate::item::{now_ms, AppendOptions, Item, LeaseId, TakeMode, Taken};
use crate::iter::{Iter, IterSegment};
use crate::journal::{JRecord, Journal, JournalState, ReaderRecord};
use crate::mapfile::{sync_dir, MapFile, STAGE_BYTES};
use crate::name::validate_reader_name;
use crate::reader_list::{self, ReaderList};
use crate::readers::{Readers, READERS_PER_QUEUE_MAX};
use crate::segment::{
    self, encode_segment_header, parse_segment_file_name, segment_file_name, Found, Loc, ReadBuf,
    Segment, FILE_HEADER_BYTES, READ_AHEAD_BYTES,
};
use crate::space_reserve::SpaceReserve;
use crate::stats::{QueueStats, ReaderStats};
use crate::store::StoreInner;

/// Mapping window of the segment being written: bounds the RSS the writer adds.
const WRITE_WINDOW_BYTES: u64 = 256 * 1024;
/// When every reader has confirmed everything and the segment being written is at
/// least this large, a new segment is started so the old one can be deleted: disk use
/// follows the backlog down instead of waiting for the segment to fill.
const ROLL_WHEN_EMPTY_BYTES: u64 = 4 * 1024 * 1024;
/// A queue not written for this long gives back its mapping windows (their RSS); the
/// next write maps again. Bounds the memory of many idle queues.
const IDLE_UNMAP: std::time::Duration = std::time::Duration::from_secs(2);
/// In `buffered` mode, appends staged in memory (see `mapfile.rs`) are written to the
/// file once the oldest has waited this long, if the buffer has not filled first: the
/// bound on what a killed process can lose, besides a buffer's worth.
pub(crate) const BUFFERED_STAGE_MS_MAX: u64 = 50;
/// A queue not used for this long closes its files (segments, journal), so that
/// thousands of idle queues hold no descriptors; the next operation opens them again
/// (two `open`s and, for a write, a new mapping window).
const IDLE_CLOSE: std::time::Duration = std::time::Duration::from_secs(10);
/// Most expired items one take drops (or moves) before it lets go of the lock.
const EXPIRED_PER_CALL_MAX: u32 = 1024;

/// What a caller must wait for before its operation is durable: `(last data seq,
/// journal position)`, or nothing.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Ticket(Option<(u64, u64)>);

/// Calls [`QueueCore::mark_active`] when dropped: at the end of an operation, after
/// the state lock (declared first, so dropped last).
struct MarkActiveOnDrop<'a>(&'a QueueCore);

impl Drop for MarkActiveOnDrop<'_> {
    fn drop(&mut self) {
        self.0.mark_active();
        // An operation that reopened files may have put the store over its budget;
        // the background thread would notice within a tick, but a loop over
        // thousands of idle queues reopens them faster than that.
        if self.0.budget.as_ref().is_some_and(|b| b.over()) {
            if let Some(store) = self.0.store.upgrade() {
                store.enforce_files_budget(false);
            }
        }
    }
}

/// Counts a waiter for `stats` while it lives.
pub(crate) struct WaiterGuard(Option<Arc<AtomicU64>>);

impl Drop for WaiterGuard {
    fn drop(&mut self) {
        if let Some(w) = &self.0 {
            w.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

pub(crate) struct QueueCore {
    pub(crate) name: String,
    dir: PathBuf,
    store: Weak<StoreInner>,
    /// This queue, for handing itself to the store's list of active queues.
    me: Weak<QueueCore>,
    /// On the store's list of queues its background thread visits (see `tick`).
    active: AtomicBool,
    /// The store's descriptor budget (`None` once the store is gone).
    budget: Option<Arc<FilesBudget>>,
    state: Mutex<State>,
    sync: Mutex<SyncState>,
    /// Bumped whenever an item may have become available; blocking (thread) waiters
    /// sleep on `wake_cv` until it moves.
    wake_gen: AtomicU64,
    wake_lock: Mutex<()>,
    wake_cv: Condvar,
    blocking_waiters: AtomicU64,
}

#[derive(Default)]
struct SyncState {
    /// Every item up to this seq is on disk.
    data_seq: u64,
    /// The journal is on disk up to this position.
    journal: u64,
    in_progress: bool,
    /// Callers waiting for a round in progress to end, oldest first.
    waiting: VecDeque<SyncWaiter>,
    next_waiter_id: u64,
}

/// Most times a round's leader yields the CPU to let more callers join before it
/// fsyncs (see [`QueueCore::wait_durable`]).
const SYNC_GATHER_YIELDS_MAX: usize = 8;

/// One caller parked in [`QueueCore::wait_durable`]; woken by being removed from
/// [`SyncState::waiting`] and unparked.
struct SyncWaiter {
    id: u64,
    seq: u64,
    jpos: u64,
    thread: std::thread::Thread,
}

impl SyncState {
    fn covers(&self, seq: u64, jpos: u64) -> bool {
        self.data_seq >= seq && self.journal >= jpos
    }

    /// After a round: takes out of the list the waiters it covered, and the oldest of
    /// the others (if any) to lead the next round, successor first; the caller wakes
    /// them once it has dropped the lock. Those left stay listed: a round is about to
    /// start (the successor leads it, or finds another caller leading it), and its
    /// leader runs this again when it ends.
    fn take_woken_after_round(&mut self) -> Vec<std::thread::Thread> {
        let mut woken = Vec::with_capacity(self.waiting.len());
        let mut kept = VecDeque::with_capacity(self.waiting.len());
        let mut successor = None;
        while let Some(w) = self.waiting.pop_front() {
            if self.covers(w.seq, w.jpos) {
                woken.push(w.thread);
            } else if successor.is_none() {
                successor = Some(w.thread);
            } else {
                kept.push_back(w);
            }
        }
        self.waiting = kept;
        if let Some(t) = successor {
            woken.insert(0, t);
        }
        woken
    }

    /// After a failed round: everyone retries (and meets the error themselves).
    fn take_all(&mut self) -> Vec<std::thread::Thread> {
        self.waiting.drain(..).map(|w| w.thread).collect()
    }
}

struct LeaseInfo {
    seq: u64,
    loc: Loc,
    len: u32,
    deadline: Option<Instant>,
    /// Held by the engine for an expired item being moved to `expire_to` (see
    /// [`Move`]), not by a caller: no timeout, and no caller may confirm or release it.
    moving: bool,
}

struct ReaderState {
    id: u32,
    acked_below: u64,
    confirmed: IntervalSet,
    cursor_seq: u64,
    cursor: Loc,
    leases: BTreeMap<u64, LeaseInfo>,
    /// Released items, redelivered first in seq order: seq -> (loc, payload length).
    released: BTreeMap<u64, (Loc, u32)>,
    pending_bytes: u64,
    rb: ReadBuf,
    notify: Arc<Notify>,
    waiters: Arc<AtomicU64>,
    taken: u64,
    confirmed_total: u64,
    expired: u64,
    discarded: u64,
    /// Leases held for items being moved to `expire_to`, and their payload bytes.
    moving: u64,
    moving_bytes: u64,
    /// Where the oldest item this reader holds is and when it was enqueued, as read
    /// when the queue's files were last closed, so that `stats` needs no descriptor
    /// while they are.
    oldest_enqueued: Option<(Loc, u64)>,
    /// `(cursor_seq, ms)`: the item at the cursor, found unexpired by an `expire`,
    /// cannot expire before `ms` (valid while the cursor has not moved, nothing was
    /// released and the settings are the same), so the next `expire` before then reads
    /// nothing.
    head_expiry: Option<(u64, u64)>,
}

impl ReaderState {
    /// Where the oldest item this reader has not confirmed is: leased, released, or at
    /// the cursor.
    fn oldest_loc(&self, next_seq: u64) -> Option<Loc> {
        let mut oldest: Option<(u64, Loc)> = None;
        for l in self.leases.values() {
            if oldest.is_none_or(|(s, _)| l.seq < s) {
                oldest = Some((l.seq, l.loc));
            }
        }
        if let Some((&s, &(loc, _))) = self.released.iter().next() {
            if oldest.is_none_or(|(o, _)| s < o) {
                oldest = Some((s, loc));
            }
        }
        if oldest.is_none() && self.cursor_seq < next_seq {
            oldest = Some((self.cursor_seq, self.cursor));
        }
        oldest.map(|(_, loc)| loc)
    }

    fn pending_items(&self, next_seq: u64) -> u64 {
        next_seq - self.acked_below - self.confirmed.count()
    }

    /// What this reader holds against `max_items`/`max_bytes`: items being moved to
    /// `expire_to` are on their way out and count as gone, as they did when a move
    /// confirmed them at once.
    fn room_used(&self, next_seq: u64) -> (u64, u64) {
        (
            self.pending_items(next_seq).saturating_sub(self.moving),
            self.pending_bytes.saturating_sub(self.moving_bytes),
        )
    }

    /// Records `[from, to)` as confirmed in memory (the journal was written already).
    fn confirm_mem(&mut self, from: u64, to: u64, bytes: u64) {
        let from = from.max(self.acked_below);
        if from >= to {
            return;
        }
        if from == self.acked_below && self.confirmed.is_empty() {
            self.acked_below = to;
        } else {
            self.confirmed.insert(from, to);
            while let Some(end) = self.confirmed.take_range_at(self.acked_below) {
                self.acked_below = end;
            }
        }
        self.pending_bytes = self.pending_bytes.saturating_sub(bytes);
    }

    /// Byte counts are estimates after a reopen; an empty reader holds none.
    fn settle(&mut self, next_seq: u64) {
        if self.pending_items(next_seq) == 0 {
            self.pending_bytes = 0;
        }
    }

    #[cfg(debug_assertions)]
    fn check(&self, next_seq: u64) {
        assert!(
            self.acked_below <= next_seq,
            "acked {} > next {}",
            self.acked_below,
            next_seq
        );
        assert!(
            self.cursor_seq <= next_seq,
            "cursor {} > next {}",
            self.cursor_seq,
            next_seq
        );
        for seq in self
            .leases
            .values()
            .map(|l| l.seq)
            .chain(self.released.keys().copied())
        {
            assert!(
                seq >= self.acked_below && seq < self.cursor_seq,
                "held seq {seq} outside [acked, cursor)"
            );
            assert!(!self.confirmed.contains(seq), "held seq {seq} is confirmed");
        }
    }

    #[cfg(not(debug_assertions))]
    fn check(&self, _next_seq: u64) {}
}

struct State {
    /// The queue's name (its `expire_to` may not name itself).
    name: String,
    config: QueueConfig,
    closed: bool,
    deleted: bool,
    /// An fsync failed: the kernel may have dropped the dirty pages, so a later fsync
    /// that succeeds proves nothing. The queue refuses work until the store reopens.
    poisoned: Option<String>,
    /// Oldest first; the last one is being written through `writer`.
    segments: VecDeque<Segment>,
    writer: MapFile,
    next_seq: u64,
    /// Oldest seq kept when the queue has no reader.
    floor: u64,
    /// The oldest item of a queue without readers, as `ReaderState::oldest_enqueued`.
    floor_oldest: Option<(Loc, u64)>,
    /// `(floor, ms)`: the oldest item of a queue without readers cannot expire before
    /// `ms` (see `ReaderState::head_expiry`).
    floor_head_expiry: Option<(u64, u64)>,
    /// The store's tally of open descriptors (see `file_cell.rs`), which every file
    /// of the queue counts itself in; `None` once the store is gone.
    tally: Option<Arc<FilesBudget>>,
    /// Oldest seq kept for readers the store lost track of (see `reader_list.rs`):
    /// nothing from it on is reclaimed until the whole queue is flushed.
    hold: Option<u64>,
    /// The reader list was rewritten since the last fsync.
    reader_list_dirty: bool,
    /// The store's space reserve (`None` once the store is gone).
    reserve: Option<Arc<SpaceReserve>>,
    /// The queue was created (`QueueCore::open_or_create`) and its files and
    /// directory entries not fsync'ed yet: its first fsync covers them all, its parent
    /// directory included.
    created_unsynced: bool,
    floor_bytes: u64,
    floor_loc: Option<Loc>,
    floor_discarded: u64,
    floor_expired: u64,
    floor_rb: ReadBuf,
    readers: Readers<ReaderState>,
    next_reader_id: u32,
    next_lease_id: u64,
    journal: Journal,
    total_appended: u64,
    corrupt_records: u64,
    /// Written since the last fsync.
    dirty: bool,
    /// A file was created in the queue's directory since the last fsync.
    dir_dirty: bool,
    /// Sealed segments not yet fsync'ed, with the descriptor they were written
    /// through (see `roll`).
    unsynced: Vec<(PathBuf, Arc<File>)>,
    last_sync: Instant,
    /// When the queue last wrote (an append or a journal record); windows idle for
    /// `IDLE_UNMAP` are unmapped.
    last_write: Instant,
    /// Written since the background thread last looked.
    wrote: bool,
    /// Used (an operation went through `ready`) since the background thread last
    /// looked, and when it last saw that: files close after [`IDLE_CLOSE`] unused.
    used: bool,
    last_used: Instant,
    /// The last take stopped after dropping `EXPIRED_PER_CALL_MAX` expired items.
    expired_budget_spent: bool,
    mapped: bool,
}

/// What a reader's next item is and where it comes from.
struct Candidate {
    header: RecordHeader,
    data: Bytes,
    loc: Loc,
    /// Where the cursor goes when this item is consumed; `None` for a released item.
    next_cursor: Option<Loc>,
}

impl Candidate {
    /// The item, its payload moved out: a clone of a fresh `Bytes` would make it shared
    /// (an allocation) only to drop one of the two handles at once.
    fn into_item(self) -> Item {
        Item {
            seq: self.header.seq,
            data: self.data,
            flags: self.header.flags,
            enqueued_at_ms: self.header.enqueued_at_ms,
            expires_at_ms: self.header.expires_at_ms,
        }
    }

    fn item(&self) -> Item {
        Item {
            seq: self.header.seq,
            data: self.data.clone(),
            flags: self.header.flags,
            enqueued_at_ms: self.header.enqueued_at_ms,
            expires_at_ms: self.header.expires_at_ms,
        }
    }
}

/// An expired item on its way to the queue's `expire_to` queue. A take meets it under
/// this queue's lock, but the append to the target must happen outside it (one queue
/// lock at a time, and queues may expire into each other). So the item is held under a
/// lease, not confirmed: the confirmation is journaled only once the item is in the
/// target. A process killed in between moves it again after the restart (a duplicate
/// in the target) instead of losing it from both queues.
struct Move {
    reader: String,
    lease: u64,
    item: Item,
}

/// What a take is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Purpose {
    Take,
    Lease,
    Peek,
    /// Drop the oldest item to make room.
    Discard,
    /// Drop the next item only if it has expired.
    ExpireHead,
}

fn is_disk_full(e: &io::Error) -> bool {
    crate::error::is_disk_full(e)
}

fn io_err(context: impl FnOnce() -> String) -> impl FnOnce(io::Error) -> Error {
    move |e| Error::io(context(), e)
}

/// When the item `h` heads expires at the earliest (its own expiry or `max_age`);
/// `u64::MAX` when never.
fn expiry_ms(h: &RecordHeader, config: &QueueConfig) -> u64 {
    let own = if h.expires_at_ms != 0 {
        h.expires_at_ms
    } else {
        u64::MAX
    };
    let aged = config.max_age.map_or(u64::MAX, |age| {
        h.enqueued_at_ms.saturating_add(age.as_millis() as u64)
    });
    own.min(aged)
}

fn is_expired(h: &RecordHeader, now_ms: u64, config: &QueueConfig) -> bool {
    if h.expires_at_ms != 0 && h.expires_at_ms <= now_ms {
        return true;
    }
    match config.max_age {
        Some(age) => h.enqueued_at_ms.saturating_add(age.as_millis() as u64) <= now_ms,
        None => false,
    }
}

/// Reads the record at `loc`, from the writer's mapping when it is there (no system
/// call), else through the read-ahead buffer. `Ok(None)` at the end of valid data.
/// `Err(Ok(()))`-like damage is reported as `ReadAt::Bad`.
enum ReadAt {
    Rec(RecordHeader, Bytes),
    End,
    Bad,
    /// The segment is gone (deleted): the position must be looked up again.
    Missing,
}

fn seg_index(segments: &VecDeque<Segment>, first_seq: u64) -> Option<usize> {
    let i = segments.partition_point(|s| s.first_seq < first_seq);
    (i < segments.len() && segments[i].first_seq == first_seq).then_some(i)
}

fn read_at(
    segments: &VecDeque<Segment>,
    writer: &MapFile,
    rb: &mut ReadBuf,
    loc: Loc,
) -> io::Result<ReadAt> {
    let Some(i) = seg_index(segments, loc.seg) else {
        return Ok(ReadAt::Missing);
    };
    let seg = &segments[i];
    let active = i + 1 == segments.len();
    let limit = if active { writer.end() } else { seg.end };
    if loc.off >= limit {
        return Ok(ReadAt::End);
    }
    // Reads of the file stop where the file's data does: past it the active segment's
    // bytes are staged in memory (served by `writer.mapped` below).
    let file_limit = if active { writer.file_end() } else { seg.end };
    if active {
        if let Some(hb) = writer.mapped(loc.off, RECORD_HEADER_BYTES as u64) {
            let Some(h) = decode_header(hb) else {
                return Ok(ReadAt::Bad);
            };
            if let Some(rec) = writer.mapped(loc.off, h.record_bytes()) {
                if !verify(&h, rec, seg.seed) {
                    return Ok(ReadAt::Bad);
                }
                return Ok(ReadAt::Rec(
                    h,
                    Bytes::copy_from_slice(&rec[RECORD_HEADER_BYTES..]),
                ));
            }
        }
    }
    match segment::read_record(
        rb,
        seg_file(segments, writer, i)?,
        seg.first_seq,
        seg.seed,
        loc.off,
        file_limit,
        READ_AHEAD_BYTES,
    )? {
        Found::Record(h, rec) => Ok(ReadAt::Rec(
            h,
            Bytes::copy_from_slice(&rec[RECORD_HEADER_BYTES..]),
        )),
        Found::End => Ok(ReadAt::End),
        Found::Bad => Ok(ReadAt::Bad),
    }
}

/// The descriptor to read segment `i` through: the writer's for the segment being
/// written, else the segment's own (opened on first use).
fn seg_file<'a>(
    segments: &'a VecDeque<Segment>,
    writer: &'a MapFile,
    i: usize,
) -> io::Result<&'a Arc<File>> {
    if i + 1 == segments.len() {
        writer.file()
    } else {
        segments[i].file()
    }
}

/// Creates the segment file starting at `first_seq` (replacing any file of that name)
/// with its header written, and the writer for it.
fn create_segment(
    dir: &Path,
    first_seq: u64,
    segment_size_bytes: u64,
    tally: Option<Arc<FilesBudget>>,
) -> Result<(Segment, MapFile)> {
    let path = dir.join(segment_file_name(first_seq));
    let err = |e| Error::io(format!("creating segment {}", path.display()), e);
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .map_err(err)?;
    let mut map = MapFile::new(file, &path, 0, WRITE_WINDOW_BYTES)
        .map_err(err)?
        .with_cap(segment_size_bytes);
    let seed = new_seed();
    if let Err(e) = map.append(&[&encode_segment_header(first_seq, seed)]) {
        drop(map);
        let _ = fs::remove_file(&path);
        return Err(err(e));
    }
    map.set_tally(tally.clone());
    let segment = Segment::new(first_seq, seed, path, map.end(), tally);
    Ok((segment, map))
}

/// Where the first record with seq ≥ `seq` starts (the tail when there is none).
fn locate_in(
    segments: &VecDeque<Segment>,
    writer: &MapFile,
    next_seq: u64,
    seq: u64,
) -> io::Result<Loc> {
    let Some(last) = segments.back() else {
        return Ok(Loc {
            seg: next_seq,
            off: FILE_HEADER_BYTES,
        });
    };
    if seq >= next_seq {
        return Ok(Loc {
            seg: last.first_seq,
            off: writer.end(),
        });
    }
    let i = segments
        .partition_point(|s| s.first_seq <= seq)
        .saturating_sub(1);
    let seg = &segments[i];
    let limit = if i + 1 == segments.len() {
        writer.end()
    } else {
        seg.end
    };
    let off = segment::locate(
        seg_file(segments, writer, i)?,
        seg.first_seq,
        seg.seed,
        limit,
        seq,
    )?;
    Ok(Loc {
        seg: seg.first_seq,
        off,
    })
}

/// Payload bytes from `loc` to the tail, estimated from file sizes: exact unless
/// records in that span were confirmed out of order or lost to damage.
fn span_payload_bytes(segments: &VecDeque<Segment>, writer: &MapFile, loc: Loc, items: u64) -> u64 {
    let mut bytes = 0u64;
    let n = segments.len();
    for (i, seg) in segments.iter().enumerate() {
        if seg.first_seq < loc.seg {
            continue;
        }
        let end = if i + 1 == n { writer.end() } else { seg.end };
        let start = if seg.first_seq == loc.seg {
            loc.off
        } else {
            FILE_HEADER_BYTES
        };
        bytes += end.saturating_sub(start);
    }
    bytes.saturating_sub(items * RECORD_HEADER_BYTES as u64)
}

/// Reads only the header of the record at `loc`.
fn header_at(segments: &VecDeque<Segment>, writer: &MapFile, loc: Loc) -> Option<RecordHeader> {
    let i = seg_index(segments, loc.seg)?;
    if i + 1 == segments.len() {
        if let Some(b) = writer.mapped(loc.off, RECORD_HEADER_BYTES as u64) {
            return decode_header(b);
        }
    }
    let mut buf = [0u8; RECORD_HEADER_BYTES];
    segment::read_full_at(seg_file(segments, writer, i).ok()?, &mut buf, loc.off).ok()?;
    decode_header(&buf)
}

impl State {
    fn check_usable(&self) -> Result<()> {
        if self.deleted {
            Err(Error::NotFound {
                what: format!("queue at {}", self.writer.path().display()),
            })
        } else if self.closed {
            Err(Error::Closed)
        } else if let Some(why) = &self.poisoned {
            Err(Error::io(
                format!(
                    "queue in {} failed an fsync earlier ({why}); reopen the store",
                    self.dir().display()
                ),
                io::Error::other("fsync failed"),
            ))
        } else {
            Ok(())
        }
    }

    /// Refuses work on a closed, deleted or poisoned queue, and opens its files again
    /// if they were closed while it was idle: every operation that may touch a file
    /// starts here.
    fn ready(&mut self) -> Result<()> {
        self.check_usable()?;
        self.used = true;
        Ok(())
    }

    /// Whether the queue holds any descriptor now.
    fn any_file_open(&self) -> bool {
        self.writer.is_open()
            || self.journal.is_open()
            || self.segments.iter().any(Segment::is_open)
    }

    /// Closes every descriptor the queue holds, so that an idle queue costs none; the
    /// next operation opens them again ([`State::ready`]). What `stats` would read from
    /// the files is read first. Staged bytes are written first; if that fails nothing
    /// is closed. Returns whether anything was open.
    fn close_files(&mut self) -> Result<bool> {
        if !self.any_file_open() || self.unsynced_writes() {
            // Written and not fsync'ed: the descriptors stay until the fsync, since a
            // write-back error is reported only through a descriptor that was open
            // when it happened (see `roll`). `tick` syncs an idle queue first.
            return Ok(false);
        }
        let next_seq = self.next_seq;
        // Read only where the oldest item moved since the last close: a queue closed
        // and reopened by a whole-store command reads nothing here.
        let enqueued = |loc: Option<Loc>, kept: Option<(Loc, u64)>| {
            let loc = loc?;
            match kept {
                Some((at, ms)) if at == loc => Some((loc, ms)),
                _ => header_at(&self.segments, &self.writer, loc).map(|h| (loc, h.enqueued_at_ms)),
            }
        };
        let floor = enqueued(
            self.floor_loc.filter(|_| self.floor < next_seq),
            self.floor_oldest,
        );
        let oldest: Vec<Option<(Loc, u64)>> = self
            .readers
            .values()
            .map(|r| enqueued(r.oldest_loc(next_seq), r.oldest_enqueued))
            .collect();
        let dir = self.dir().to_path_buf();
        let err = |e| Error::io(format!("closing the files of {}", dir.display()), e);
        self.writer.close().map_err(err)?;
        self.journal.close().map_err(err)?;
        for seg in self.segments.iter_mut() {
            seg.close_file();
        }
        self.mapped = false;
        self.floor_oldest = floor;
        for (r, t) in self.readers.values_mut().zip(oldest) {
            r.oldest_enqueued = t;
            r.rb.clear();
        }
        self.floor_rb.clear();
        Ok(true)
    }

    /// Gives back the mapping windows of a queue not written for [`IDLE_UNMAP`].
    fn tick_unmap(&mut self, now: Instant, queue: &str) {
        if std::mem::take(&mut self.wrote) {
            self.last_write = now;
        } else if self.mapped && now.duration_since(self.last_write) >= IDLE_UNMAP {
            match self.writer.unmap() {
                Ok(()) => {
                    self.journal.unmap();
                    self.mapped = false;
                }
                Err(e) => {
                    tracing::error!(queue, error = %e, "could not write staged appends; they stay staged and are tried again");
                }
            }
        }
    }

    /// Writes staged appends (`buffered`) once the oldest has waited
    /// [`BUFFERED_STAGE_MS_MAX`], and retries a durability switch whose first attempt
    /// failed (`set_config`).
    fn tick_staged(&mut self, now: Instant, queue: &str) {
        if let Err(e) = self.apply_staging() {
            tracing::error!(queue, error = %e, "could not write staged appends; they stay staged and are tried again");
        }
        let waited = self
            .writer
            .staged_since()
            .is_some_and(|t| now.duration_since(t).as_millis() as u64 >= BUFFERED_STAGE_MS_MAX);
        if waited {
            if let Err(e) = self.flush_staged() {
                tracing::error!(queue, error = %e, "could not write staged appends; they stay staged and are tried again");
            }
        }
    }

    /// Releases the leases past their `open_timeout`; returns the readers to wake.
    fn tick_leases(&mut self, now: Instant) -> Vec<String> {
        let mut woke = Vec::new();
        if self.config.open_timeout.is_none() {
            return woke;
        }
        for (name, r) in self.readers.iter_mut() {
            let due: Vec<u64> = r
                .leases
                .iter()
                .filter(|(_, l)| !l.moving && l.deadline.is_some_and(|d| d <= now))
                .map(|(&id, _)| id)
                .collect();
            for id in &due {
                if let Some(l) = r.leases.remove(id) {
                    r.released.insert(l.seq, (l.loc, l.len));
                }
            }
            if !due.is_empty() {
                woke.push(name.clone());
            }
        }
        woke
    }

    /// Closes the files of a queue unused for [`IDLE_CLOSE`], and in a queue in use
    /// the sealed segments nobody reads. Returns whether an fsync must come first
    /// (an idle `buffered` queue with writes not synced: see `close_files`).
    fn tick_close(&mut self, now: Instant, queue: &str) -> bool {
        if std::mem::take(&mut self.used) {
            self.last_used = now;
        }
        if !self.any_file_open() {
            return false;
        }
        if now.duration_since(self.last_used) < IDLE_CLOSE {
            self.close_unused_segments();
            return false;
        }
        if self.unsynced_writes() {
            return true;
        }
        if let Err(e) = self.close_files() {
            tracing::error!(queue, error = %e, "could not close the files of an idle queue");
        }
        false
    }

    /// Whether anything was written and not fsync'ed yet.
    fn unsynced_writes(&self) -> bool {
        self.dirty
            || self.created_unsynced
            || self.dir_dirty
            || self.reader_list_dirty
            || !self.unsynced.is_empty()
            || self.writer.staged_len() > 0
    }

    /// Whether an `expire` now would find nothing, known from memory alone: every
    /// reader (or the queue, with none) is empty, or its head was seen unexpired and
    /// cannot expire before a time still to come.
    fn nothing_to_expire(&self, now: u64) -> bool {
        if self.readers.is_empty() {
            return self.floor >= self.next_seq
                || self
                    .floor_head_expiry
                    .is_some_and(|(floor, due)| floor == self.floor && now < due);
        }
        self.readers.values().all(|r| {
            r.released.is_empty()
                && (r.cursor_seq >= self.next_seq
                    || r.head_expiry
                        .is_some_and(|(seq, due)| seq == r.cursor_seq && now < due))
        })
    }

    /// Whether the background thread must come back (see [`QueueCore::tick`]).
    fn needs_tick(&self) -> bool {
        let periodic = matches!(self.config.durability, Durability::Periodic(_));
        let sync_pending =
            self.dirty || self.created_unsynced || self.dir_dirty || self.reader_list_dirty;
        self.any_file_open()
            || self.mapped
            || self.writer.staged_len() > 0
            || self.writer.staging_differs(self.staging_wanted())
            || (periodic && sync_pending)
            || (self.config.open_timeout.is_some()
                && self
                    .readers
                    .values()
                    .any(|r| r.leases.len() as u64 > r.moving))
    }

    /// Closes the descriptors of sealed segments that no reader's cursor (nor the
    /// floor) is in; a lease or a released item in one opens it again when read.
    fn close_unused_segments(&mut self) {
        let in_use: Vec<u64> = self
            .readers
            .values()
            .map(|r| r.cursor.seg)
            .chain(self.floor_loc.map(|l| l.seg))
            .collect();
        let last = self.segments.len().saturating_sub(1);
        for seg in self.segments.iter_mut().take(last) {
            if !in_use.contains(&seg.first_seq) {
                seg.close_file();
            }
        }
    }

    /// Creates the reader `name` on first use (a reader comes into being the first
    /// time it is read from), after [`State::ready`].
    fn usable_reader(&mut self, name: &str) -> Result<()> {
        self.ready()?;
        if !self.readers.contains_key(name) {
            validate_reader_name(name)?;
            self.create_reader(name)?;
        }
        Ok(())
    }

    fn dir(&self) -> &Path {
        self.writer.path().parent().unwrap_or(Path::new("."))
    }

    /// Writes what the segment writer has staged (buffered durability) to the file:
    /// before anything reads the active segment through the file rather than through
    /// the writer (scans, iteration, fsync).
    fn flush_staged(&mut self) -> Result<()> {
        self.writer
            .flush_staged()
            .map_err(|e| Error::io(format!("writing {}", self.writer.path().display()), e))
    }

    /// Whether the segment writer should stage appends: the queue is `buffered`.
    fn staging_wanted(&self) -> bool {
        self.config.durability == Durability::Buffered
    }

    /// Stages appends in memory (see `mapfile.rs`) when the queue is `buffered`, and
    /// stops (writing what is staged) when it is not; nothing to do when it already
    /// matches.
    fn apply_staging(&mut self) -> Result<()> {
        let on = self.staging_wanted();
        self.writer
            .set_staging(on)
            .map_err(|e| Error::io(format!("writing {}", self.writer.path().display()), e))
    }

    fn journal_append(&mut self, rec: JRecord) -> Result<()> {
        let mut result = self.journal.append(&rec);
        if result.as_ref().is_err_and(is_disk_full) && self.release_reserve() {
            result = self.journal.append(&rec);
        }
        if let Err(e) = result {
            return Err(Error::io(
                format!("writing reader state in {}", self.dir().display()),
                e,
            ));
        }
        self.dirty = true;
        self.wrote = true;
        self.mapped = true;
        Ok(())
    }

    /// Gives the store's space reserve back to the file system (see
    /// `space_reserve.rs`), so that reader state can be written on a full disk; false
    /// when there was none left to give.
    fn release_reserve(&self) -> bool {
        // For consuming only: a queue with nothing to consume (a new one, say) must not
        // take the space that readers of full queues need.
        let holds_items = self.oldest_kept() < self.next_seq;
        holds_items && self.reserve.as_ref().is_some_and(|r| r.release())
    }

    /// Rotates the journal when it is due. A failure leaves the current file in use.
    fn maybe_rotate_journal(&mut self) {
        if !self.journal.needs_rotation() {
            return;
        }
        let state = self.journal_state();
        if let Err(e) = self.journal.rotate(&state) {
            tracing::warn!(dir = %self.dir().display(), error = %e, "could not rotate the reader journal");
        }
    }

    fn journal_state(&self) -> JournalState {
        let mut readers = BTreeMap::new();
        for (name, r) in self.readers.iter() {
            readers.insert(
                r.id,
                ReaderRecord {
                    name: name.clone(),
                    acked_below: r.acked_below,
                    confirmed: r.confirmed.clone(),
                },
            );
        }
        JournalState {
            floor: self.floor,
            readers,
            next_reader_id: self.next_reader_id,
        }
    }

    /// The oldest seq some reader (or, with none, the queue itself) still keeps: what a
    /// new reader starts at, and below which segments may go. A hold (readers lost with
    /// the journal and the reader list, see `reader_list.rs`) keeps everything from it.
    fn oldest_kept(&self) -> u64 {
        let kept = self
            .readers
            .values()
            .map(|r| r.acked_below)
            .min()
            .unwrap_or(self.floor);
        self.hold.map_or(kept, |hold| kept.min(hold))
    }

    /// Rewrites the reader list (`reader_list.rs`) from the readers in memory, plus
    /// `extra` when one is about to be created; its fsync goes with the queue's next.
    fn write_reader_list(&mut self, extra: Option<&str>) -> Result<()> {
        let mut names: Vec<String> = self.readers.keys().cloned().collect();
        names.extend(extra.map(str::to_string));
        let list = ReaderList {
            names,
            hold: self.hold,
        };
        let dir = self.dir().to_path_buf();
        let mut result = reader_list::write(&dir, &list);
        if result.as_ref().is_err_and(is_disk_full) && self.release_reserve() {
            result = reader_list::write(&dir, &list);
        }
        result
            .map_err(|e| Error::io(format!("writing the reader list in {}", dir.display()), e))?;
        self.reader_list_dirty = true;
        self.dir_dirty = true;
        Ok(())
    }

    /// Starts a new segment at `next_seq`; the current one is sealed.
    fn roll(&mut self) -> Result<()> {
        debug_assert!(
            self.writer.end() > FILE_HEADER_BYTES,
            "never roll an empty segment"
        );
        // What is staged belongs to the segment being sealed: written before the seal,
        // or the roll fails and it stays staged.
        self.flush_staged()?;
        let dir = self.dir().to_path_buf();
        let (segment, mut map) = create_segment(
            &dir,
            self.next_seq,
            self.config.segment_size_bytes,
            self.tally.clone(),
        )?;
        if let Err(e) = map.set_staging(self.staging_wanted()) {
            return Err(Error::io(format!("writing {}", map.path().display()), e));
        }
        let mut old = std::mem::replace(&mut self.writer, map);
        if let Some(last) = self.segments.back_mut() {
            last.end = old.end();
        }
        if let Err(e) = old.trim() {
            tracing::warn!(path = %old.path().display(), error = %e, "could not trim a sealed segment");
        }
        // Sealed segments are fsync'ed off the append path, by the next fsync of the
        // queue: a group commit (synced, or an append with `sync`), the periodic sync
        // (periodic), or an explicit sync or close (buffered: its contract is that an
        // OS crash may lose what was not synced, so nothing syncs it in the
        // background). Doing it here, inline, would write up to a whole segment to
        // disk inside one append.
        // The writer's own descriptor is kept until then: a write-back error is
        // reported to an fsync through a descriptor that was open when it happened,
        // and may be lost once none is (the inode can leave the cache).
        match old.file() {
            Ok(file) => self
                .unsynced
                .push((old.path().to_path_buf(), Arc::clone(file))),
            Err(e) => {
                tracing::error!(path = %old.path().display(), error = %e, "a sealed segment lost its descriptor before its fsync");
                self.poisoned = Some(format!("sealed segment without a descriptor: {e}"));
            }
        }
        self.segments.push_back(segment);
        self.dir_dirty = true;
        self.dirty = true;
        Ok(())
    }

    /// Deletes the segments every reader is done with.
    fn reclaim(&mut self) {
        let keep = self.oldest_kept();
        if keep == self.next_seq
            && self.writer.end() >= ROLL_WHEN_EMPTY_BYTES
            && self.writer.end() > FILE_HEADER_BYTES
        {
            if let Err(e) = self.roll() {
                tracing::warn!(error = %e, "could not start a new segment for an empty queue");
            }
        }
        while self.segments.len() > 1 && self.segments[1].first_seq <= keep {
            let Some(seg) = self.segments.pop_front() else {
                break;
            };
            if self.floor_loc.is_some_and(|l| l.seg == seg.first_seq) {
                self.floor_loc = None;
            }
            self.unsynced.retain(|(path, _)| *path != seg.path);
            if let Err(e) = fs::remove_file(&seg.path) {
                tracing::warn!(path = %seg.path.display(), error = %e, "could not delete a consumed segment");
            }
            // The deletion is made durable by the queue's next fsync.
            self.dir_dirty = true;
        }
    }

    /// Appends a batch, all or nothing: the room for every record is reserved before
    /// the first byte is written, all records but the last carry the "more" bit (so a
    /// crash in the middle is cut on recovery), and a batch never spans segments.
    fn append_records(
        &mut self,
        items: &[&[u8]],
        options: &AppendOptions,
        now: u64,
    ) -> Result<u64> {
        let total: u64 = items
            .iter()
            .map(|d| RECORD_HEADER_BYTES as u64 + d.len() as u64)
            .sum();
        if self.writer.end() + total > self.config.segment_size_bytes
            && self.writer.end() > FILE_HEADER_BYTES
        {
            self.roll()?;
        }
        // Retries a switch of durability whose first attempt failed (see `set_config`):
        // never stage a `periodic` or `synced` append.
        self.apply_staging()?;
        if !self.reserve.as_ref().is_none_or(|r| r.appends_allowed()) {
            return Err(Error::io(
                format!("appending to {}", self.writer.path().display()),
                io::Error::from_raw_os_error(libc::ENOSPC),
            ));
        }
        if let Err(e) = self.writer.reserve(total) {
            return Err(Error::io(
                format!("appending to {}", self.writer.path().display()),
                e,
            ));
        }
        let batch_start = self.writer.end();
        let first = self.next_seq;
        // The writer always writes the last segment.
        let seed = self.segments.back().map_or(0, |s| s.seed);
        let mut bytes = 0u64;
        for (i, data) in items.iter().enumerate() {
            let seq = first + i as u64;
            let more = i + 1 < items.len();
            let mut header = [0u8; RECORD_HEADER_BYTES];
            encode_header(
                &mut header,
                seed,
                seq,
                now,
                options.expires_at_ms,
                options.flags,
                more,
                data,
            );
            if let Err(e) = self.writer.append(&[&header, data]) {
                // Unreachable after `reserve`; were it reached, the records written are
                // past `next_seq` and a crash cuts them (no last record of the batch).
                return Err(Error::io(
                    format!("appending to {}", self.writer.path().display()),
                    e,
                ));
            }
            bytes += data.len() as u64;
        }
        if self.writer.staged_len() > STAGE_BYTES {
            // A batch (or item) larger than the staging buffer was staged whole; write it
            // before the call returns, so a killed process never loses more than one
            // buffer. If that fails the batch never happened.
            if let Err(e) = self.writer.flush_staged() {
                self.writer.unstage_from(batch_start);
                return Err(Error::io(
                    format!("appending to {}", self.writer.path().display()),
                    e,
                ));
            }
        }
        if let Some(last) = self.segments.back_mut() {
            last.end = self.writer.end();
        }
        let count = items.len() as u64;
        self.next_seq += count;
        for r in self.readers.values_mut() {
            r.pending_bytes += bytes;
        }
        self.floor_bytes += bytes;
        self.total_appended += count;
        self.dirty = true;
        self.wrote = true;
        self.mapped = true;
        Ok(first)
    }

    /// Ends the lease of a [`Move`]: confirmed (journaled) when `done`, else released,
    /// so that a later take moves the item again. A lease gone meanwhile (the reader
    /// was flushed or deleted) needs nothing.
    fn finish_move(&mut self, m: &Move, done: bool) {
        let next_seq = self.next_seq;
        let Some((id, seq, loc, len)) = self.readers.get(&m.reader).and_then(|r| {
            let l = r.leases.get(&m.lease).filter(|l| l.moving)?;
            Some((r.id, l.seq, l.loc, l.len))
        }) else {
            return;
        };
        let confirmed = done
            && {
                let rec = JRecord::Confirm {
                    id,
                    from: seq,
                    to: seq + 1,
                };
                match self.journal_append(rec) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::error!(dir = %self.dir().display(), error = %e, "could not confirm a moved item; it stays and is moved again");
                        false
                    }
                }
            };
        let Some(r) = self.readers.get_mut(&m.reader) else {
            return;
        };
        r.leases.remove(&m.lease);
        r.moving = r.moving.saturating_sub(1);
        r.moving_bytes = r.moving_bytes.saturating_sub(len as u64);
        if confirmed {
            r.confirm_mem(seq, seq + 1, len as u64);
        } else {
            // Not woken for: an item that cannot be moved yet would only be met again.
            r.released.insert(seq, (loc, len));
            r.expired = r.expired.saturating_sub(1);
        }
        r.settle(next_seq);
        r.check(next_seq);
    }

    /// Counts `[from, to)` as lost to damage for reader `name`.
    fn lose(&mut self, name: &str, from: u64, to: u64) -> Result<()> {
        let Some(id) = self.readers.get(name).map(|r| r.id) else {
            return Ok(());
        };
        if from >= to {
            return Ok(());
        }
        tracing::error!(dir = %self.dir().display(), reader = name, from, to, "items lost (damaged, or not on disk at a crash) are skipped");
        self.journal_append(JRecord::Confirm { id, from, to })?;
        self.corrupt_records += to - from;
        if let Some(r) = self.readers.get_mut(name) {
            r.confirm_mem(from, to, 0);
        }
        Ok(())
    }

    /// Finds the reader's next item: a released one first, else the one at its cursor.
    /// Moves the cursor over what it must (items confirmed out of order, segment ends,
    /// damage), but consumes nothing.
    fn next_candidate(&mut self, name: &str) -> Result<Option<Candidate>> {
        let not_found = || Error::NotFound {
            what: format!("reader {name:?}"),
        };
        loop {
            let next_seq = self.next_seq;
            let State {
                segments,
                writer,
                readers,
                ..
            } = self;
            let r = readers.get_mut(name).ok_or_else(not_found)?;
            if let Some((&seq, &(loc, len))) = r.released.iter().next() {
                let read = read_at(segments, writer, &mut r.rb, loc)
                    .map_err(io_err(|| "reading a released item".into()))?;
                if let ReadAt::Rec(h, data) = read {
                    if h.seq == seq {
                        return Ok(Some(Candidate {
                            header: h,
                            data,
                            loc,
                            next_cursor: None,
                        }));
                    }
                }
                r.released.remove(&seq);
                r.pending_bytes = r.pending_bytes.saturating_sub(len as u64);
                self.lose(name, seq, seq + 1)?;
                continue;
            }
            if r.cursor_seq >= next_seq {
                return Ok(None);
            }
            let cursor = r.cursor;
            let read = read_at(segments, writer, &mut r.rb, cursor)
                .map_err(io_err(|| format!("reading segment {}", cursor.seg)))?;
            match read {
                ReadAt::Rec(h, data) if h.seq >= r.cursor_seq => {
                    if h.seq > r.cursor_seq {
                        let from = r.cursor_seq;
                        self.lose(name, from, h.seq)?;
                        let r = self.readers.get_mut(name).ok_or_else(not_found)?;
                        r.cursor_seq = h.seq;
                    }
                    let r = self.readers.get_mut(name).ok_or_else(not_found)?;
                    let next = Loc {
                        seg: cursor.seg,
                        off: cursor.off + h.record_bytes(),
                    };
                    // After a reopen the cursor starts at the oldest unconfirmed item;
                    // items confirmed out of order before the restart are skipped here.
                    if h.seq < r.acked_below || r.confirmed.contains(h.seq) {
                        // Counted in the estimate of `pending_bytes` made at open.
                        r.pending_bytes = r.pending_bytes.saturating_sub(h.len as u64);
                        r.cursor = next;
                        r.cursor_seq = h.seq + 1;
                        continue;
                    }
                    return Ok(Some(Candidate {
                        header: h,
                        data,
                        loc: cursor,
                        next_cursor: Some(next),
                    }));
                }
                ReadAt::End => {
                    let i = seg_index(segments, cursor.seg).unwrap_or(0);
                    if i + 1 >= segments.len() {
                        // The cursor is at the end of what was written but behind
                        // next_seq: the items between were lost.
                        let from = r.cursor_seq;
                        self.lose(name, from, next_seq)?;
                        let r = self.readers.get_mut(name).ok_or_else(not_found)?;
                        r.cursor_seq = next_seq;
                        continue;
                    }
                    let first = segments[i + 1].first_seq;
                    r.cursor = Loc {
                        seg: first,
                        off: FILE_HEADER_BYTES,
                    };
                    if first > r.cursor_seq {
                        let from = r.cursor_seq;
                        self.lose(name, from, first)?;
                        let r = self.readers.get_mut(name).ok_or_else(not_found)?;
                        r.cursor_seq = r.cursor_seq.max(first);
                    }
                }
                ReadAt::Rec(..) | ReadAt::Bad => {
                    let i = seg_index(segments, cursor.seg).unwrap_or(0);
                    let seg = &segments[i];
                    let active = i + 1 == segments.len();
                    if active {
                        // The scan below reads the file: staged bytes must be in it.
                        writer
                            .flush_staged()
                            .map_err(io_err(|| format!("writing {}", seg.path.display())))?;
                    }
                    let limit = if active { writer.end() } else { seg.end };
                    let seq_max = if active {
                        next_seq - 1
                    } else {
                        segments[i + 1].first_seq.saturating_sub(1)
                    };
                    let file = seg_file(segments, writer, i)
                        .map_err(io_err(|| format!("opening {}", seg.path.display())))?;
                    let found = segment::resync(
                        file,
                        seg.seed,
                        cursor.off + 1,
                        limit,
                        r.cursor_seq,
                        seq_max,
                    )
                    .map_err(io_err(|| format!("reading segment {}", seg.path.display())))?;
                    tracing::error!(path = %seg.path.display(), offset = cursor.off, "damaged record; skipping to the next valid one");
                    r.rb.clear();
                    // The items skipped are counted by `lose` once the cursor lands.
                    r.cursor.off = match found {
                        Some((at, _)) => at,
                        None => limit,
                    };
                }
                ReadAt::Missing => {
                    // Its segment was deleted because every seq in it is confirmed.
                    r.cursor_seq = r.cursor_seq.max(r.acked_below);
                    let seq = r.cursor_seq;
                    writer
                        .flush_staged()
                        .map_err(io_err(|| format!("writing {}", writer.path().display())))?;
                    let loc = locate_in(segments, writer, next_seq, seq)
                        .map_err(io_err(|| "locating a reader".into()))?;
                    r.cursor = loc;
                    r.rb.clear();
                }
            }
        }
    }

    /// Takes (or leases, peeks, discards, expires) the reader's next item.
    fn take_inner(
        &mut self,
        name: &str,
        purpose: Purpose,
        now: u64,
        moves: &mut Vec<Move>,
    ) -> Result<Option<Taken>> {
        // Expired items at the head are dropped as they are met, but at most
        // `EXPIRED_PER_CALL_MAX` per call, so one call never holds the lock (or the
        // payloads being moved to `expire_to`) for a whole expired backlog.
        let mut expired_budget = EXPIRED_PER_CALL_MAX;
        loop {
            let Some(c) = self.next_candidate(name)? else {
                return Ok(None);
            };
            let expired = is_expired(&c.header, now, &self.config);
            if purpose == Purpose::ExpireHead && !expired {
                // Remember when this head can expire at the earliest, so that an
                // `expire` before then needs no read (see `State::nothing_to_expire`).
                let due_ms = expiry_ms(&c.header, &self.config);
                if let Some(r) = self.readers.get_mut(name) {
                    if c.next_cursor.is_some() && r.released.is_empty() {
                        r.head_expiry = Some((r.cursor_seq, due_ms));
                    }
                }
                return Ok(None);
            }
            let seq = c.header.seq;
            let len = c.header.len as u64;
            let id = match self.readers.get(name) {
                Some(r) => r.id,
                None => {
                    return Err(Error::NotFound {
                        what: format!("reader {name:?}"),
                    })
                }
            };
            let consume = |r: &mut ReaderState| match c.next_cursor {
                Some(next) => {
                    r.cursor = next;
                    r.cursor_seq = seq + 1;
                }
                None => {
                    r.released.remove(&seq);
                }
            };
            if expired {
                let moving = self
                    .config
                    .expire_to
                    .as_deref()
                    .is_some_and(|to| to != self.name);
                if moving {
                    let lease_id = self.next_lease_id;
                    self.next_lease_id += 1;
                    if let Some(r) = self.readers.get_mut(name) {
                        consume(r);
                        r.leases.insert(
                            lease_id,
                            LeaseInfo {
                                seq,
                                loc: c.loc,
                                len: c.header.len,
                                deadline: None,
                                moving: true,
                            },
                        );
                        r.moving += 1;
                        r.moving_bytes += len;
                        r.expired += 1;
                    }
                    moves.push(Move {
                        reader: name.to_string(),
                        lease: lease_id,
                        item: c.item(),
                    });
                } else {
                    self.journal_append(JRecord::Confirm {
                        id,
                        from: seq,
                        to: seq + 1,
                    })?;
                    if let Some(r) = self.readers.get_mut(name) {
                        consume(r);
                        r.confirm_mem(seq, seq + 1, len);
                        r.expired += 1;
                    }
                }
                if purpose == Purpose::ExpireHead {
                    return Ok(Some(Taken {
                        item: c.item(),
                        lease: None,
                    }));
                }
                expired_budget -= 1;
                if expired_budget == 0 {
                    self.expired_budget_spent = true;
                    return Ok(None);
                }
                continue;
            }
            let lease_timeout = self.config.open_timeout;
            return match purpose {
                Purpose::Peek => Ok(Some(Taken {
                    item: c.into_item(),
                    lease: None,
                })),
                Purpose::Take | Purpose::Discard | Purpose::ExpireHead => {
                    self.journal_append(JRecord::Confirm {
                        id,
                        from: seq,
                        to: seq + 1,
                    })?;
                    if let Some(r) = self.readers.get_mut(name) {
                        consume(r);
                        r.confirm_mem(seq, seq + 1, len);
                        if purpose == Purpose::Take {
                            r.taken += 1;
                            r.confirmed_total += 1;
                        } else {
                            r.discarded += 1;
                        }
                    }
                    Ok(Some(Taken {
                        item: c.into_item(),
                        lease: None,
                    }))
                }
                Purpose::Lease => {
                    let lease_id = self.next_lease_id;
                    self.next_lease_id += 1;
                    if let Some(r) = self.readers.get_mut(name) {
                        consume(r);
                        r.leases.insert(
                            lease_id,
                            LeaseInfo {
                                seq,
                                loc: c.loc,
                                len: c.header.len,
                                deadline: lease_timeout.and_then(|t| Instant::now().checked_add(t)),
                                moving: false,
                            },
                        );
                        r.taken += 1;
                    }
                    Ok(Some(Taken {
                        item: c.into_item(),
                        lease: Some(LeaseId(lease_id)),
                    }))
                }
            };
        }
    }

    /// [`State::most_behind`], less the items being moved to `expire_to`: what
    /// `max_items` and `max_bytes` are checked against.
    fn room_used(&self) -> (u64, u64) {
        if self.readers.is_empty() {
            return (self.next_seq - self.floor, self.floor_bytes);
        }
        let mut items = 0;
        let mut bytes = 0;
        for r in self.readers.values() {
            let (i, b) = r.room_used(self.next_seq);
            items = items.max(i);
            bytes = bytes.max(b);
        }
        (items, bytes)
    }

    /// The most-behind reader's (items, bytes); the queue's own when it has no reader.
    fn most_behind(&self) -> (u64, u64) {
        if self.readers.is_empty() {
            return (self.next_seq - self.floor, self.floor_bytes);
        }
        let mut items = 0;
        let mut bytes = 0;
        for r in self.readers.values() {
            items = items.max(r.pending_items(self.next_seq));
            bytes = bytes.max(r.pending_bytes);
        }
        (items, bytes)
    }

    /// Drops the oldest item of a queue with no reader (only if it has expired, when
    /// `only_expired`); false when there is none to drop.
    fn advance_floor(&mut self, only_expired: bool, now: u64) -> Result<bool> {
        loop {
            if self.floor >= self.next_seq {
                self.floor_bytes = 0;
                return Ok(false);
            }
            let loc = match self.floor_loc {
                Some(l) => l,
                None => {
                    self.flush_staged()?;
                    locate_in(&self.segments, &self.writer, self.next_seq, self.floor)
                        .map_err(io_err(|| "locating the oldest item".into()))?
                }
            };
            let read = read_at(&self.segments, &self.writer, &mut self.floor_rb, loc)
                .map_err(io_err(|| "reading the oldest item".into()))?;
            match read {
                ReadAt::Rec(h, _) => {
                    let next = Loc {
                        seg: loc.seg,
                        off: loc.off + h.record_bytes(),
                    };
                    if h.seq < self.floor {
                        // Below the floor already (the first segment holds older items).
                        self.floor_loc = Some(next);
                        continue;
                    }
                    if only_expired && !is_expired(&h, now, &self.config) {
                        self.floor_loc = Some(loc);
                        self.floor_head_expiry = Some((self.floor, expiry_ms(&h, &self.config)));
                        return Ok(false);
                    }
                    self.journal_append(JRecord::Floor(h.seq + 1))?;
                    self.floor = h.seq + 1;
                    self.floor_loc = Some(next);
                    self.floor_bytes = self.floor_bytes.saturating_sub(h.len as u64);
                    return Ok(true);
                }
                ReadAt::End => {
                    // Step into the next segment; the floor itself does not move.
                    let i = seg_index(&self.segments, loc.seg).unwrap_or(0);
                    match self.segments.get(i + 1) {
                        Some(next) => {
                            self.floor_loc = Some(Loc {
                                seg: next.first_seq,
                                off: FILE_HEADER_BYTES,
                            })
                        }
                        None => return Ok(false),
                    }
                }
                ReadAt::Bad => {
                    // The scan below reads the file: staged bytes must be in it.
                    self.flush_staged()?;
                    let i = seg_index(&self.segments, loc.seg).unwrap_or(0);
                    let seg = &self.segments[i];
                    let active = i + 1 == self.segments.len();
                    let limit = if active { self.writer.end() } else { seg.end };
                    let seq_max = self.next_seq.saturating_sub(1);
                    let file = seg_file(&self.segments, &self.writer, i)
                        .map_err(io_err(|| format!("opening {}", seg.path.display())))?;
                    let found =
                        segment::resync(file, seg.seed, loc.off + 1, limit, self.floor, seq_max)
                            .map_err(io_err(|| {
                                format!("reading segment {}", seg.path.display())
                            }))?;
                    tracing::error!(path = %seg.path.display(), offset = loc.off, "damaged record; skipping to the next valid one");
                    self.floor_rb.clear();
                    self.floor_loc = Some(Loc {
                        seg: loc.seg,
                        off: found.map_or(limit, |(at, _)| at),
                    });
                }
                ReadAt::Missing => {
                    self.flush_staged()?;
                    let relocated =
                        locate_in(&self.segments, &self.writer, self.next_seq, self.floor)
                            .map_err(io_err(|| "locating the oldest item".into()))?;
                    if Some(relocated) == self.floor_loc {
                        return Ok(false);
                    }
                    self.floor_loc = Some(relocated);
                }
            }
        }
    }

    /// Makes room for `count` items of `bytes` under `max_items`/`max_bytes`.
    fn make_room(&mut self, count: u64, bytes: u64, now: u64, moves: &mut Vec<Move>) -> Result<()> {
        let (max_items, max_bytes) = (self.config.max_items, self.config.max_bytes);
        if max_items == u64::MAX && max_bytes == u64::MAX {
            return Ok(());
        }
        let full = || Error::Full {
            queue: String::new(),
        };
        if count > max_items || bytes > max_bytes {
            return Err(full());
        }
        loop {
            let (items, held) = self.room_used();
            if items + count <= max_items && held + bytes <= max_bytes {
                return Ok(());
            }
            if !self.config.discard_old_when_full {
                return Err(full());
            }
            let mut progress = false;
            if self.readers.is_empty() {
                if self.advance_floor(false, now)? {
                    self.floor_discarded += 1;
                    progress = true;
                }
            } else {
                let behind: Vec<String> = self
                    .readers
                    .iter()
                    .filter(|(_, r)| {
                        let (items, held) = r.room_used(self.next_seq);
                        items + count > max_items || held + bytes > max_bytes
                    })
                    .map(|(n, _)| n.clone())
                    .collect();
                for name in behind {
                    self.expired_budget_spent = false;
                    // Dropping a run of expired items (the budget) makes room too.
                    if self
                        .take_inner(&name, Purpose::Discard, now, moves)?
                        .is_some()
                        || self.expired_budget_spent
                    {
                        progress = true;
                    }
                }
            }
            self.reclaim();
            if !progress {
                return Err(full());
            }
        }
    }

    fn create_reader(&mut self, name: &str) -> Result<()> {
        if self.readers.len() >= READERS_PER_QUEUE_MAX {
            return Err(Error::InvalidArgument(format!(
                "a queue has at most {READERS_PER_QUEUE_MAX} readers; delete one first"
            )));
        }
        let start = self.oldest_kept();
        self.flush_staged()?;
        let cursor = locate_in(&self.segments, &self.writer, self.next_seq, start)
            .map_err(io_err(|| "locating a new reader".into()))?;
        let pending_bytes = match self.readers.values().min_by_key(|r| r.acked_below) {
            Some(r) if r.acked_below == start => r.pending_bytes,
            None if self.hold.is_none() => self.floor_bytes,
            // Starting below every reader (a hold): estimated from the files.
            _ => span_payload_bytes(&self.segments, &self.writer, cursor, self.next_seq - start),
        };
        // The list first: a crash before the journal record leaves a name in the list
        // that the journal does not have, and a readable journal wins.
        self.write_reader_list(Some(name))?;
        let id = self.next_reader_id;
        self.journal_append(JRecord::ReaderCreate {
            id,
            acked_below: start,
            name: name.to_string(),
        })?;
        self.next_reader_id += 1;
        self.readers.insert(
            name.to_string(),
            new_reader(id, start, cursor, pending_bytes),
        );
        Ok(())
    }

    /// At open, once the journal's readers are in: reconciles them with the reader list
    /// (`reader_list.rs`). A readable journal is the truth and the list is rewritten to
    /// match it when it differs. A lost journal's readers are created again from the
    /// list, at the oldest stored item; with the list lost too, the stored items are
    /// held (nothing reclaimed) for the readers nobody can name any more.
    fn recover_reader_list(&mut self, journal_lost: bool, listed: reader_list::Read) -> Result<()> {
        let dir = self.dir().to_path_buf();
        match listed {
            reader_list::Read::Found(list) if journal_lost => {
                self.hold = list.hold;
                for name in &list.names {
                    if !self.readers.contains_key(name) {
                        self.create_reader(name)?;
                    }
                }
                tracing::error!(dir = %dir.display(), readers = ?list.names, "readers recreated from the reader list at the oldest stored item");
            }
            reader_list::Read::Found(list) => {
                self.hold = list.hold;
                let mut known: Vec<&String> = self.readers.keys().collect();
                known.sort();
                let mut listed: Vec<&String> = list.names.iter().collect();
                listed.sort();
                if known != listed {
                    self.write_reader_list(None)?;
                }
            }
            lost if journal_lost => {
                if self.floor < self.next_seq {
                    self.hold = Some(self.floor);
                }
                self.write_reader_list(None)?;
                tracing::error!(dir = %dir.display(), list = ?lost, held_from = ?self.hold, "the reader journal and the reader list are both lost: the stored items are kept for readers nobody can name until the queue is flushed");
            }
            reader_list::Read::Damaged => {
                tracing::warn!(dir = %dir.display(), "the reader list is damaged; it is written again from the reader journal");
                self.write_reader_list(None)?;
            }
            // A new queue, or one made before the list existed.
            reader_list::Read::Missing => self.write_reader_list(None)?,
        }
        if let Some(from) = self.hold {
            tracing::warn!(dir = %dir.display(), held_from = from, "items are held for readers lost with the reader journal; `flush` the queue to release them");
        }
        Ok(())
    }

    fn flush_reader(&mut self, name: &str) -> Result<u64> {
        let next_seq = self.next_seq;
        let tail = locate_in(&self.segments, &self.writer, next_seq, next_seq)
            .map_err(io_err(|| "locating the tail".into()))?;
        let Some((id, acked)) = self.readers.get(name).map(|r| (r.id, r.acked_below)) else {
            return Ok(0);
        };
        if acked < next_seq {
            self.journal_append(JRecord::Confirm {
                id,
                from: acked,
                to: next_seq,
            })?;
        }
        let Some(r) = self.readers.get_mut(name) else {
            return Ok(0);
        };
        let dropped = r.pending_items(next_seq);
        r.acked_below = next_seq;
        r.confirmed.clear();
        r.leases.clear();
        r.moving = 0;
        r.moving_bytes = 0;
        r.released.clear();
        r.cursor_seq = next_seq;
        r.cursor = tail;
        r.pending_bytes = 0;
        r.rb.clear();
        Ok(dropped)
    }
}

/// The files of a new, empty queue in `dir` (created here): a reader journal, an empty
/// reader list and a first segment holding only its header. No fsync (see
/// [`QueueCore::open_or_create`]) and no space reserved ahead: the first append
/// reserves what it needs.
fn write_new_queue(dir: &Path) -> Result<()> {
    let err = |what: &'static str| io_err(move || format!("{what} {}", dir.display()));
    fs::create_dir(dir).map_err(err("creating"))?;
    Journal::write_new(dir).map_err(err("writing the reader journal in"))?;
    reader_list::write(dir, &ReaderList::default()).map_err(err("writing the reader list in"))?;
    let segment = dir.join(segment_file_name(1));
    fs::write(&segment, encode_segment_header(1, new_seed())).map_err(err("writing a segment in"))
}

fn new_reader(id: u32, start: u64, cursor: Loc, pending_bytes: u64) -> ReaderState {
    ReaderState {
        id,
        acked_below: start,
        confirmed: IntervalSet::default(),
        cursor_seq: start,
        cursor,
        leases: BTreeMap::new(),
        released: BTreeMap::new(),
        pending_bytes,
        rb: ReadBuf::default(),
        notify: Arc::new(Notify::new()),
        waiters: Arc::new(AtomicU64::new(0)),
        taken: 0,
        confirmed_total: 0,
        expired: 0,
        discarded: 0,
        moving: 0,
        moving_bytes: 0,
        oldest_enqueued: None,
        head_expiry: None,
    }
}

impl QueueCore {
    /// Opens (creating if needed) the queue stored in `dir`, recovering from a crash:
    /// the last segment is scanned and its torn tail cut (damage with valid records
    /// after it is kept, see `segment::scan`), the reader
    /// journal is replayed, and readers start again at their oldest unconfirmed item
    /// (leases open at the crash are delivered again).
    pub(crate) fn open(
        name: &str,
        dir: &Path,
        config: QueueConfig,
        store: Weak<StoreInner>,
    ) -> Result<Arc<QueueCore>> {
        let ctx = |what: &str| format!("{what} {}", dir.display());
        fs::create_dir_all(dir).map_err(io_err(|| ctx("creating")))?;
        let mut firsts = Vec::new();
        for entry in fs::read_dir(dir).map_err(io_err(|| ctx("listing")))? {
            let entry = entry.map_err(io_err(|| ctx("listing")))?;
            let fname = entry.file_name();
            let Some(fname) = fname.to_str() else {
                continue;
            };
            if let Some(first) = parse_segment_file_name(fname) {
                firsts.push(first);
            } else if fname.ends_with(".tmp") {
                let _ = fs::remove_file(entry.path());
            }
        }
        firsts.sort_unstable();
        // Every descriptor of the queue counts in the store's tally (`file_cell.rs`).
        let tally = store.upgrade().map(|s| Arc::clone(&s.files_budget));
        let opened = Journal::open(dir, firsts.first().copied().unwrap_or(1))
            .map_err(io_err(|| ctx("opening the reader journal in")))?;
        if opened.damaged_tail {
            tracing::warn!(dir = %dir.display(), "reader journal had a damaged tail; it was cut");
        }
        // The journal is created before the first segment, so segments without a
        // usable journal mean it was lost or damaged, not that the queue is new.
        let journal_lost = opened.started_afresh && (opened.unusable > 0 || !firsts.is_empty());
        if journal_lost {
            tracing::error!(dir = %dir.display(), damaged_journals = opened.unusable, segments = firsts.len(), "no usable reader journal: readers start again at the oldest stored item, so confirmed items come again");
        }
        let listed =
            reader_list::read(dir).map_err(io_err(|| ctx("reading the reader list in")))?;
        let jstate = opened.state;

        // Every seq a reader has confirmed must stay retired: after an OS crash the
        // journal can be ahead of the segments, and new items must not reuse those seqs.
        let mut seq_floor = jstate.floor.max(1);
        for r in jstate.readers.values() {
            seq_floor = seq_floor.max(r.acked_below);
            if let Some((_, end)) = r.confirmed.iter().last() {
                seq_floor = seq_floor.max(end);
            }
        }

        let mut segments = VecDeque::new();
        for (i, &first) in firsts.iter().enumerate() {
            let path = dir.join(segment_file_name(first));
            // Only for the header and the size: sealed segments are opened again when
            // a reader reaches them, the last one below as the writer.
            let file = File::open(&path).map_err(io_err(|| ctx("opening segment in")))?;
            let len = file
                .metadata()
                .map_err(io_err(|| ctx("reading segment size in")))?
                .len();
            let mut header = [0u8; FILE_HEADER_BYTES as usize];
            let n = segment::read_full_at(&file, &mut header, 0)
                .map_err(io_err(|| ctx("reading segment in")))?;
            let decoded = segment::decode_segment_header(&header[..n], first);
            let last = i + 1 == firsts.len();
            if !decoded.intact && !last {
                tracing::error!(path = %path.display(), "segment header is damaged; its records are read where their checksums hold");
            }
            segments.push_back(Segment::new(first, decoded.seed, path, len, tally.clone()));
        }

        let mut next_seq;
        let writer;
        match segments.back_mut() {
            Some(last) => {
                let file = File::options()
                    .read(true)
                    .write(true)
                    .open(&last.path)
                    .map_err(io_err(|| ctx("opening segment in")))?;
                let mut header = [0u8; FILE_HEADER_BYTES as usize];
                let n = segment::read_full_at(&file, &mut header, 0)
                    .map_err(io_err(|| ctx("reading segment in")))?;
                let header_ok = segment::decode_segment_header(&header[..n], last.first_seq).intact;
                if !header_ok && last.end > FILE_HEADER_BYTES {
                    // The header is damaged but records may follow: rewrite the header
                    // (the first seq is the file's name, the seed the vote of its
                    // copies) and keep what checks out.
                    tracing::error!(path = %last.path.display(), "segment header is damaged; rewriting it");
                    use std::os::unix::fs::FileExt;
                    file.write_all_at(&encode_segment_header(last.first_seq, last.seed), 0)
                        .map_err(io_err(|| ctx("rewriting a segment header in")))?;
                }
                let (end, scanned_next, zero_tail) = if header_ok || last.end > FILE_HEADER_BYTES {
                    let scan = segment::scan(&file, last.first_seq, last.seed, last.end)
                        .map_err(io_err(|| ctx("scanning segment in")))?;
                    if scan.torn_batch {
                        tracing::warn!(path = %last.path.display(), offset = scan.end, "a batch interrupted by a crash was cut, with everything after it");
                    }
                    if scan.damaged {
                        // Kept, not cut: later records may have been acknowledged.
                        // Readers skip the damaged ones and count them as lost.
                        tracing::error!(path = %last.path.display(), "damaged records in the middle of the last segment; the records after them are kept");
                    }
                    (scan.end, scan.next_seq, scan.zero_tail)
                } else {
                    // Created but never completed: start it again, empty.
                    file.set_len(0)
                        .map_err(io_err(|| ctx("resetting segment in")))?;
                    (0, last.first_seq, true)
                };
                if !zero_tail {
                    // Junk after the data (a torn write): cut, so that nothing of it
                    // can ever be read as records after the next append. Zeroes (the
                    // space reserved ahead, what a clean stop leaves) are kept for the
                    // appends to come.
                    file.set_len(end)
                        .map_err(io_err(|| ctx("cutting the torn tail of a segment in")))?;
                }
                last.end = end;
                let reopened = File::options()
                    .read(true)
                    .write(true)
                    .open(&last.path)
                    .map_err(io_err(|| ctx("opening segment in")))?;
                let mut map = MapFile::new(reopened, &last.path, end, WRITE_WINDOW_BYTES)
                    .map_err(io_err(|| ctx("mapping segment in")))?;
                if end == 0 {
                    last.seed = new_seed();
                    map.append(&[&encode_segment_header(last.first_seq, last.seed)])
                        .map_err(io_err(|| ctx("writing segment header in")))?;
                    last.end = map.end();
                }
                next_seq = scanned_next;
                writer = Some(map);
            }
            None => {
                next_seq = seq_floor;
                writer = None;
            }
        }
        let mut journal = opened.journal;
        journal.set_tally(tally.clone());
        let mut writer = match writer {
            Some(w) => w,
            None => {
                let (segment, map) =
                    create_segment(dir, next_seq, config.segment_size_bytes, tally.clone())?;
                segments.push_back(segment);
                sync_dir(dir).map_err(io_err(|| ctx("syncing")))?;
                map
            }
        };
        writer.set_tally(tally.clone());
        let mut state = State {
            name: name.to_string(),
            config,
            closed: false,
            deleted: false,
            poisoned: None,
            segments,
            writer,
            next_seq,
            floor: 1,
            hold: None,
            floor_oldest: None,
            floor_head_expiry: None,
            tally: tally.clone(),
            reader_list_dirty: false,
            reserve: store.upgrade().map(|s| Arc::clone(&s.reserve)),
            created_unsynced: false,
            floor_bytes: 0,
            floor_loc: None,
            floor_discarded: 0,
            floor_expired: 0,
            floor_rb: ReadBuf::default(),
            readers: Readers::new(),
            next_reader_id: jstate.next_reader_id.max(1),
            next_lease_id: 1,
            journal,
            total_appended: 0,
            corrupt_records: 0,
            dirty: false,
            dir_dirty: false,
            unsynced: Vec::new(),
            last_sync: Instant::now(),
            last_write: Instant::now(),
            wrote: false,
            used: false,
            last_used: Instant::now(),
            expired_budget_spent: false,
            mapped: true,
        };
        if seq_floor > state.next_seq {
            tracing::warn!(dir = %dir.display(), lost_to = seq_floor, "items after {} were lost (OS crash before fsync?); sequence numbers continue after the confirmed ones", state.next_seq);
            if state.writer.end() > FILE_HEADER_BYTES {
                state.next_seq = seq_floor;
                state.roll()?;
            } else {
                // An empty last segment is named after a seq that is now retired.
                let old = state.segments.pop_back();
                state.next_seq = seq_floor;
                let (segment, map) = create_segment(
                    dir,
                    seq_floor,
                    state.config.segment_size_bytes,
                    state.tally.clone(),
                )?;
                state.segments.push_back(segment);
                state.writer = map;
                if let Some(old) = old {
                    let _ = fs::remove_file(&old.path);
                }
                sync_dir(dir).map_err(io_err(|| ctx("syncing")))?;
            }
        }
        next_seq = state.next_seq;
        let oldest_on_disk = state.segments.front().map_or(next_seq, |s| s.first_seq);
        state.floor = jstate.floor.max(oldest_on_disk).min(next_seq);
        let floor_loc = locate_in(&state.segments, &state.writer, next_seq, state.floor)
            .map_err(io_err(|| ctx("locating the oldest item in")))?;
        state.floor_bytes = span_payload_bytes(
            &state.segments,
            &state.writer,
            floor_loc,
            next_seq - state.floor,
        );
        state.floor_loc = Some(floor_loc);
        for (id, rec) in jstate.readers {
            let mut confirmed = rec.confirmed;
            let acked_below = rec.acked_below.max(oldest_on_disk).min(next_seq);
            confirmed.remove_below(acked_below);
            let cursor = locate_in(&state.segments, &state.writer, next_seq, acked_below)
                .map_err(io_err(|| ctx("locating a reader in")))?;
            let items = next_seq - acked_below;
            let bytes = span_payload_bytes(&state.segments, &state.writer, cursor, items);
            let mut r = new_reader(id, acked_below, cursor, bytes);
            r.confirmed = confirmed;
            // The reader journal's confirmations above `acked_below` are skipped by
            // reading, so the cursor starts at the oldest unconfirmed item.
            state.readers.insert(rec.name, r);
        }
        state.recover_reader_list(journal_lost, listed)?;
        // A crash between a confirmation and the deletion of a consumed segment leaves
        // the segment behind; delete it now.
        state.reclaim();
        state.apply_staging()?;
        let core = Arc::new_cyclic(|me| QueueCore {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            store,
            me: me.clone(),
            // The store's list gets every queue it opens; the first tick takes an idle
            // one off it.
            active: AtomicBool::new(false),
            budget: tally,
            state: Mutex::new(state),
            sync: Mutex::new(SyncState::default()),
            wake_gen: AtomicU64::new(0),
            wake_lock: Mutex::new(()),
            wake_cv: Condvar::new(),
            blocking_waiters: AtomicU64::new(0),
        });
        core.mark_active();
        Ok(core)
    }

    /// Opens the queue in `dir`, creating it first when there is none, all or nothing:
    /// its first files are written under a temporary name beside it and renamed into
    /// place whole (see `store.rs`). Nothing is fsync'ed here: a creation is made durable
    /// by the queue's first fsync (see `State::created_unsynced`), under the queue's
    /// durability like the appends that follow it, so a client naming new queues does
    /// not cost an fsync each.
    pub(crate) fn open_or_create(
        name: &str,
        dir: &Path,
        config: QueueConfig,
        store: Weak<StoreInner>,
    ) -> Result<Arc<QueueCore>> {
        if dir.is_dir() {
            return QueueCore::open(name, dir, config, store);
        }
        let parent = dir.parent().unwrap_or(Path::new("."));
        let tmp = parent.join(crate::store::temporary_name(
            crate::store::CREATING_PREFIX,
            name,
        ));
        let made = write_new_queue(&tmp).and_then(|()| {
            fs::rename(&tmp, dir).map_err(io_err(|| format!("creating {}", dir.display())))
        });
        if let Err(e) = made {
            if let Err(cleanup) = fs::remove_dir_all(&tmp) {
                tracing::warn!(path = %tmp.display(), error = %cleanup, "could not remove a half-made queue; the next open removes it");
            }
            return Err(e);
        }
        let core = QueueCore::open(name, dir, config, store)?;
        {
            let mut st = core.state.lock();
            st.created_unsynced = true;
            st.dirty = true;
        }
        Ok(core)
    }

    /// Writes what the segment writer has staged (`buffered`) to the file.
    fn write_staged(&self) -> Result<()> {
        self.state.lock().flush_staged()
    }

    pub(crate) fn config(&self) -> QueueConfig {
        self.state.lock().config.clone()
    }

    pub(crate) fn set_config(&self, config: QueueConfig) {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let mut st = self.state.lock();
        st.config = config;
        // `max_age` may have changed: when the heads expire is not known any more.
        st.floor_head_expiry = None;
        for r in st.readers.values_mut() {
            r.head_expiry = None;
        }
        if let Err(e) = st.apply_staging() {
            // Staging stays on: its bytes are kept and written by a later flush.
            tracing::error!(queue = %self.name, error = %e, "could not write staged appends");
        }
    }

    fn ticket(st: &State, options_sync: bool, data_seq: u64, journal: bool) -> Ticket {
        if options_sync || st.config.durability == Durability::Synced {
            let jpos = if journal { st.journal.written } else { 0 };
            Ticket(Some((data_seq, jpos)))
        } else {
            Ticket(None)
        }
    }

    /// Wakes waiters after items became available for every reader (`count` of them).
    fn wake_all_readers(&self, st: &State, count: u64) {
        for r in st.readers.values() {
            let waiting = r.waiters.load(Ordering::SeqCst);
            for _ in 0..waiting.min(count) {
                r.notify.notify_one();
            }
        }
        self.wake_blocking();
    }

    fn wake_reader(&self, r: &ReaderState) {
        if r.waiters.load(Ordering::SeqCst) > 0 {
            r.notify.notify_one();
        }
        self.wake_blocking();
    }

    fn wake_blocking(&self) {
        self.wake_gen.fetch_add(1, Ordering::SeqCst);
        if self.blocking_waiters.load(Ordering::SeqCst) > 0 {
            let _g = self.wake_lock.lock();
            self.wake_cv.notify_all();
        }
    }

    pub(crate) fn append_batch(
        &self,
        items: &[&[u8]],
        options: AppendOptions,
    ) -> Result<(u64, Ticket)> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        if items.is_empty() {
            return Err(Error::InvalidArgument(
                "an append needs at least one item".into(),
            ));
        }
        let now = now_ms();
        let mut moves = Vec::new();
        let result = {
            let mut st = self.state.lock();
            st.ready()?;
            let max = st.config.max_item_size_bytes.min(RECORD_PAYLOAD_BYTES_MAX);
            let mut bytes = 0u64;
            for data in items {
                if data.len() as u64 > max {
                    return Err(Error::TooLarge {
                        size_bytes: data.len() as u64,
                        size_bytes_max: max,
                    });
                }
                bytes += data.len() as u64;
            }
            match st.make_room(items.len() as u64, bytes, now, &mut moves) {
                Ok(()) => {}
                Err(Error::Full { .. }) => {
                    return Err(Error::Full {
                        queue: self.name.clone(),
                    })
                }
                Err(e) => return Err(e),
            }
            let first = st.append_records(items, &options, now)?;
            self.wake_all_readers(&st, items.len() as u64);
            st.maybe_rotate_journal();
            let last = st.next_seq - 1;
            Ok((
                first,
                Self::ticket(&st, options.sync, last, !moves.is_empty()),
            ))
        };
        self.move_expired(moves);
        result
    }

    /// Blocks until what `ticket` names is on disk. The first caller to find no round
    /// running leads one (fsyncs for everyone); the others park until its end wakes
    /// them (see [`SyncState::take_woken_after_round`]).
    pub(crate) fn wait_durable(&self, ticket: Ticket) -> Result<()> {
        let Some((seq, jpos)) = ticket.0 else {
            return Ok(());
        };
        let mut s = self.sync.lock();
        // This caller's entry in `waiting`, while it has one.
        let mut listed: Option<u64> = None;
        loop {
            if let Some(id) = listed {
                if s.waiting.iter().any(|w| w.id == id) {
                    // A spurious wake-up: still listed, so no round has ended for us.
                    drop(s);
                    std::thread::park();
                    s = self.sync.lock();
                    continue;
                }
                listed = None;
            }
            if s.covers(seq, jpos) {
                return Ok(());
            }
            if s.in_progress {
                let id = s.next_waiter_id;
                s.next_waiter_id += 1;
                s.waiting.push_back(SyncWaiter {
                    id,
                    seq,
                    jpos,
                    thread: std::thread::current(),
                });
                listed = Some(id);
                drop(s);
                // An unpark between the drop and the park is not lost: it makes this
                // park return at once.
                std::thread::park();
                s = self.sync.lock();
                continue;
            }
            s.in_progress = true;
            let synced = (s.data_seq, s.journal);
            // Let callers that are about to append and wait (typically the ones the
            // last round just woke) get in first, while more keep arriving: a round
            // then covers more of them, and fewer rounds (fsyncs, wake-ups) are needed
            // per item. With nobody else runnable this costs one sched_yield.
            for _ in 0..SYNC_GATHER_YIELDS_MAX {
                let before = s.waiting.len();
                drop(s);
                std::thread::yield_now();
                s = self.sync.lock();
                if s.waiting.len() == before {
                    break;
                }
            }
            drop(s);
            let result = self.sync_files(synced);
            s = self.sync.lock();
            s.in_progress = false;
            match result {
                Ok((done_seq, done_journal)) => {
                    s.data_seq = s.data_seq.max(done_seq);
                    s.journal = s.journal.max(done_journal);
                    let woken = s.take_woken_after_round();
                    drop(s);
                    woken.iter().for_each(std::thread::Thread::unpark);
                    s = self.sync.lock();
                }
                Err(e) => {
                    let woken = s.take_all();
                    drop(s);
                    woken.iter().for_each(std::thread::Thread::unpark);
                    return Err(e);
                }
            }
        }
    }

    pub(crate) async fn wait_durable_async(self: &Arc<Self>, ticket: Ticket) -> Result<()> {
        let Some((seq, jpos)) = ticket.0 else {
            return Ok(());
        };
        {
            let s = self.sync.lock();
            if s.covers(seq, jpos) {
                return Ok(());
            }
        }
        let me = Arc::clone(self);
        match tokio::task::spawn_blocking(move || me.wait_durable(ticket)).await {
            Ok(r) => r,
            Err(e) => Err(Error::io(
                "waiting for fsync",
                io::Error::other(e.to_string()),
            )),
        }
    }

    /// fsyncs every file with writes newer than `synced` (data seq, journal position);
    /// returns what is now durable. A synced append costs one fsync, a synced take one.
    fn sync_files(&self, synced: (u64, u64)) -> Result<(u64, u64)> {
        let (files, sealed, dir_dirty, list_dirty, created, seq, jpos) = {
            let mut st = self.state.lock();
            if st.deleted {
                return Ok((u64::MAX, u64::MAX));
            }
            // Not `ready`: an fsync is no use of the queue (it would keep an idle queue
            // from closing its files); the files it needs open as they are used.
            st.check_usable()?;
            // An fsync covers only what the file holds.
            st.flush_staged()?;
            let sealed = std::mem::take(&mut st.unsynced);
            let mut files = Vec::with_capacity(2);
            let (seq, jpos) = (st.next_seq - 1, st.journal.written);
            let created = std::mem::take(&mut st.created_unsynced);
            let file_err = |e| Error::io(format!("syncing {}", self.dir.display()), e);
            if seq > synced.0 || !sealed.is_empty() || created {
                files.push(Arc::clone(st.writer.file().map_err(file_err)?));
            }
            if jpos > synced.1 || created {
                files.push(Arc::clone(st.journal.file().map_err(file_err)?));
            }
            st.dirty = false;
            st.last_sync = Instant::now();
            let dir_dirty = std::mem::take(&mut st.dir_dirty) || created;
            let list_dirty = std::mem::take(&mut st.reader_list_dirty) || created;
            (files, sealed, dir_dirty, list_dirty, created, seq, jpos)
        };
        let result = (|| {
            for f in sealed.iter().map(|(_, f)| f).chain(files.iter()) {
                f.sync_data()?;
                #[cfg(feature = "fault-injection")]
                crate::fault::fsynced(&self.dir);
            }
            if list_dirty {
                reader_list::sync(&self.dir)?;
            }
            if dir_dirty {
                sync_dir(&self.dir)?;
            }
            if created {
                // The queue's own entry, renamed into `queues/` at its creation.
                sync_dir(self.dir.parent().unwrap_or(Path::new(".")))?;
            }
            Ok::<(), io::Error>(())
        })();
        if let Err(e) = result {
            let mut st = self.state.lock();
            tracing::error!(dir = %self.dir.display(), error = %e, "fsync failed; the queue refuses work until the store is reopened");
            st.poisoned = Some(e.to_string());
            return Err(Error::io(format!("fsync in {}", self.dir.display()), e));
        }
        Ok((seq, jpos))
    }

    pub(crate) fn sync_now(&self) -> Result<()> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let (ticket, files_only) = {
            let st = self.state.lock();
            if st.deleted || st.closed {
                return Ok(());
            }
            // A creation or a deleted segment is no data a ticket can name: sync the
            // files and directories directly (group commit would find nothing to do).
            let files_only = st.created_unsynced || st.dir_dirty || st.reader_list_dirty;
            (
                Ticket(Some((st.next_seq - 1, st.journal.written))),
                files_only,
            )
        };
        if files_only {
            let (seq, jpos) = self.sync_files((0, 0))?;
            let mut s = self.sync.lock();
            s.data_seq = s.data_seq.max(seq);
            s.journal = s.journal.max(jpos);
        }
        self.wait_durable(ticket)
    }

    pub(crate) fn ensure_reader(&self, name: &str) -> Result<()> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        // Bound first: a temporary guard in the tail would outlive `_active`.
        let ready = self.state.lock().usable_reader(name);
        ready
    }

    pub(crate) fn has_reader(&self, name: &str) -> bool {
        self.state.lock().readers.contains_key(name)
    }

    pub(crate) fn reader_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.state.lock().readers.keys().cloned().collect();
        names.sort();
        names
    }

    pub(crate) fn delete_reader(&self, name: &str) -> Result<bool> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        validate_reader_name(name)?;
        let mut st = self.state.lock();
        st.ready()?;
        let Some(r) = st.readers.get(name) else {
            return Ok(false);
        };
        let (id, acked, bytes) = (r.id, r.acked_below, r.pending_bytes);
        let last = st.readers.len() == 1;
        if last {
            // With no reader left the queue keeps what this one had not confirmed.
            st.journal_append(JRecord::Floor(acked))?;
        }
        st.journal_append(JRecord::ReaderDelete { id })?;
        if let Some(r) = st.readers.remove(name) {
            r.notify.notify_waiters();
        }
        if let Err(e) = st.write_reader_list(None) {
            // The journal has the deletion; a stale list only matters if the journal is
            // lost too, and then the reader comes back (keeping items, never losing any).
            tracing::warn!(queue = %self.name, error = %e, "could not rewrite the reader list after deleting a reader");
        }
        if last {
            st.floor = acked;
            st.floor_bytes = bytes;
            st.floor_loc = None;
        }
        st.reclaim();
        st.maybe_rotate_journal();
        Ok(true)
    }

    pub(crate) fn flush(&self, reader: Option<&str>) -> Result<u64> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let mut st = self.state.lock();
        st.ready()?;
        let dropped = match reader {
            Some(name) => {
                st.usable_reader(name)?;
                st.flush_reader(name)?
            }
            None => {
                let mut dropped = if st.readers.is_empty() {
                    st.next_seq - st.floor
                } else {
                    0
                };
                let names: Vec<String> = st.readers.keys().cloned().collect();
                for name in names {
                    dropped = dropped.max(st.flush_reader(&name)?);
                }
                let next = st.next_seq;
                if st.floor < next {
                    // Nothing to record when the floor is there already: a flush of an
                    // empty queue writes nothing (and opens no file).
                    st.journal_append(JRecord::Floor(next))?;
                }
                st.floor = next;
                st.floor_bytes = 0;
                st.floor_loc = None;
                if st.hold.is_some() {
                    // A flush of the whole queue is the operator's word that nothing
                    // before it is wanted, by known readers or lost ones.
                    let held = st.hold.take();
                    if let Err(e) = st.write_reader_list(None) {
                        st.hold = held;
                        return Err(e);
                    }
                    tracing::info!(queue = %self.name, "flushed: items are no longer held for readers lost with the reader journal");
                }
                dropped
            }
        };
        st.reclaim();
        st.maybe_rotate_journal();
        Ok(dropped)
    }

    pub(crate) fn expire(&self) -> Result<u64> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let now = now_ms();
        let mut moves = Vec::new();
        let result = (|| {
            let mut st = self.state.lock();
            st.check_usable()?;
            if st.nothing_to_expire(now) {
                // Known without a read: a whole-store `flush_all_expired` over thousands
                // of idle queues opens none of their files.
                return Ok(0);
            }
            st.ready()?;
            let mut count = 0u64;
            if st.readers.is_empty() {
                while st.advance_floor(true, now)? {
                    st.floor_expired += 1;
                    count += 1;
                }
            } else {
                let names: Vec<String> = st.readers.keys().cloned().collect();
                let mut most = 0;
                for name in names {
                    let mut n = 0;
                    while st
                        .take_inner(&name, Purpose::ExpireHead, now, &mut moves)?
                        .is_some()
                    {
                        n += 1;
                    }
                    most = most.max(n);
                }
                count = most;
            }
            st.reclaim();
            st.maybe_rotate_journal();
            Ok(count)
        })();
        self.move_expired(moves);
        result
    }

    /// Appends expired items to the queue's `expire_to` queue, outside our lock, then
    /// ends their leases here (see [`Move`]): confirmed once the target has the item
    /// (or refused it for good), released to be moved again by a later take when the
    /// append failed for a reason that can pass.
    ///
    /// The append is not waited on for durability: an OS crash soon after a move can
    /// lose it (see docs/storage.md); a killed process cannot.
    fn move_expired(&self, moves: Vec<Move>) {
        if moves.is_empty() {
            return;
        }
        let target = self.state.lock().config.expire_to.clone();
        let outcomes: Vec<(Move, bool)> = match target.filter(|t| *t != self.name) {
            // The setting changed since the take: drop them, as a take would now.
            None => moves.into_iter().map(|m| (m, true)).collect(),
            Some(target) => {
                let Some(store) = self.store.upgrade() else {
                    // The store is going away, and these leases with it: a restart
                    // delivers the items again, and moves them then.
                    return;
                };
                match store.queue_for_use(&target) {
                    Ok(q) => moves
                        .into_iter()
                        .map(|m| {
                            let options = AppendOptions {
                                flags: m.item.flags,
                                expires_at_ms: 0,
                                sync: false,
                            };
                            // A `buffered` target writes what it staged before this queue
                            // confirms: the confirmation must not survive a kill that the
                            // moved item would not.
                            let appended = q
                                .append_batch(&[&m.item.data[..]], options)
                                .and_then(|_| q.write_staged());
                            let done = match appended {
                                Ok(()) => true,
                                Err(e) => self.move_failed(&target, &e),
                            };
                            (m, done)
                        })
                        .collect(),
                    Err(e) => {
                        let done = self.move_failed(&target, &e);
                        moves.into_iter().map(|m| (m, done)).collect()
                    }
                }
            }
        };
        #[cfg(feature = "fault-injection")]
        crate::fault::reached(crate::fault::MOVE_APPENDED);
        let mut st = self.state.lock();
        if st.ready().is_err() {
            // Closed or deleted meanwhile: the leases went with it.
            return;
        }
        for (m, done) in &outcomes {
            st.finish_move(m, *done);
        }
        st.reclaim();
        st.maybe_rotate_journal();
    }

    /// Logs a move that failed with `e`; true when the item is to be dropped anyway
    /// (the target refused it: too large, full and refusing, a bad name), false when it
    /// stays in this queue to be moved again later (I/O, disk full, closing).
    fn move_failed(&self, target: &str, e: &Error) -> bool {
        use crate::error::ErrorKind;
        let retry = matches!(
            e.kind(),
            ErrorKind::Io
                | ErrorKind::DiskFull
                | ErrorKind::Closed
                | ErrorKind::NotFound
                | ErrorKind::TooManyQueues
        );
        if retry {
            tracing::warn!(from = %self.name, to = %target, error = %e, "could not move an expired item; it stays here and is moved again later");
        } else {
            tracing::error!(from = %self.name, to = %target, error = %e, "the expire_to queue refused an expired item; it is dropped");
        }
        !retry
    }

    pub(crate) fn take(&self, reader: &str, mode: TakeMode) -> Result<(Option<Taken>, Ticket)> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let purpose = match mode {
            TakeMode::Take => Purpose::Take,
            TakeMode::Lease => Purpose::Lease,
            TakeMode::Peek => Purpose::Peek,
        };
        let now = now_ms();
        let mut wrote_any = false;
        loop {
            let mut moves = Vec::new();
            let result = (|| {
                let mut st = self.state.lock();
                st.usable_reader(reader)?;
                let journal_before = st.journal.written;
                st.expired_budget_spent = false;
                let taken = st.take_inner(reader, purpose, now, &mut moves)?;
                let wrote = st.journal.written != journal_before;
                if wrote {
                    st.reclaim();
                    st.maybe_rotate_journal();
                }
                let next_seq = st.next_seq;
                if let Some(r) = st.readers.get_mut(reader) {
                    r.settle(next_seq);
                    r.check(next_seq);
                }
                let again = taken.is_none() && st.expired_budget_spent;
                let ticket = Self::ticket(&st, false, 0, true);
                Ok::<_, Error>((taken, wrote, again, ticket))
            })();
            self.move_expired(moves);
            let (taken, wrote, again, ticket) = result?;
            wrote_any |= wrote;
            if again {
                // More expired items wait at the head: let others in, then go on.
                continue;
            }
            let ticket = if wrote_any { ticket } else { Ticket(None) };
            return Ok((taken, ticket));
        }
    }

    pub(crate) fn take_batch(&self, reader: &str, count_max: usize) -> Result<(Vec<Item>, Ticket)> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let now = now_ms();
        loop {
            let mut moves = Vec::new();
            let result = (|| {
                let mut st = self.state.lock();
                st.usable_reader(reader)?;
                let mut items = Vec::new();
                st.expired_budget_spent = false;
                while items.len() < count_max {
                    match st.take_inner(reader, Purpose::Take, now, &mut moves) {
                        Ok(Some(t)) => items.push(t.item),
                        Ok(None) => break,
                        Err(e) if items.is_empty() => return Err(e),
                        Err(_) => break,
                    }
                }
                st.reclaim();
                st.maybe_rotate_journal();
                let next_seq = st.next_seq;
                if let Some(r) = st.readers.get_mut(reader) {
                    r.settle(next_seq);
                }
                // Stopped by the expiry budget with nothing to show: go on after
                // letting go of the lock (and of the items being moved).
                let again = items.is_empty() && st.expired_budget_spent;
                Ok((items, again, Self::ticket(&st, false, 0, true)))
            })();
            self.move_expired(moves);
            let (items, again, ticket) = result?;
            if !again {
                return Ok((items, ticket));
            }
        }
    }

    pub(crate) fn wake_gen(&self) -> u64 {
        self.wake_gen.load(Ordering::SeqCst)
    }

    /// Sleeps until something may have become available (`wake_gen` moved from `gen`)
    /// or `deadline`; false on timeout.
    pub(crate) fn wait_blocking(&self, reader: &str, gen: u64, deadline: Instant) -> bool {
        let waiters = self
            .state
            .lock()
            .readers
            .get(reader)
            .map(|r| Arc::clone(&r.waiters));
        let _guard = WaiterGuard(waiters.inspect(|w| {
            w.fetch_add(1, Ordering::SeqCst);
        }));
        self.blocking_waiters.fetch_add(1, Ordering::SeqCst);
        let mut woke = true;
        {
            let mut g = self.wake_lock.lock();
            while self.wake_gen.load(Ordering::SeqCst) == gen {
                if self.wake_cv.wait_until(&mut g, deadline).timed_out() {
                    woke = self.wake_gen.load(Ordering::SeqCst) != gen;
                    break;
                }
            }
        }
        self.blocking_waiters.fetch_sub(1, Ordering::SeqCst);
        woke
    }

    pub(crate) fn reader_notify(&self, reader: &str) -> Result<Arc<Notify>> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let mut st = self.state.lock();
        st.usable_reader(reader)?;
        match st.readers.get(reader) {
            Some(r) => Ok(Arc::clone(&r.notify)),
            None => Err(Error::NotFound {
                what: format!("reader {reader:?}"),
            }),
        }
    }

    pub(crate) fn waiter_guard(&self, reader: &str) -> WaiterGuard {
        let waiters = self
            .state
            .lock()
            .readers
            .get(reader)
            .map(|r| Arc::clone(&r.waiters));
        WaiterGuard(waiters.inspect(|w| {
            w.fetch_add(1, Ordering::SeqCst);
        }))
    }

    pub(crate) fn confirm(&self, reader: &str, lease: LeaseId) -> Result<(bool, Ticket)> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let mut st = self.state.lock();
        st.ready()?;
        let Some(r) = st.readers.get(reader) else {
            return Ok((false, Ticket(None)));
        };
        let id = r.id;
        let Some(info) = r.leases.get(&lease.0).filter(|l| !l.moving) else {
            return Ok((false, Ticket(None)));
        };
        let (seq, len) = (info.seq, info.len as u64);
        st.journal_append(JRecord::Confirm {
            id,
            from: seq,
            to: seq + 1,
        })?;
        let next_seq = st.next_seq;
        if let Some(r) = st.readers.get_mut(reader) {
            r.leases.remove(&lease.0);
            r.confirm_mem(seq, seq + 1, len);
            r.confirmed_total += 1;
            r.settle(next_seq);
            r.check(next_seq);
        }
        st.reclaim();
        st.maybe_rotate_journal();
        Ok((true, Self::ticket(&st, false, 0, true)))
    }

    pub(crate) fn release(&self, reader: &str, lease: LeaseId) -> Result<bool> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let mut st = self.state.lock();
        st.check_usable()?;
        let Some(r) = st.readers.get_mut(reader) else {
            return Ok(false);
        };
        if r.leases.get(&lease.0).is_none_or(|l| l.moving) {
            return Ok(false);
        }
        let Some(info) = r.leases.remove(&lease.0) else {
            return Ok(false);
        };
        r.released.insert(info.seq, (info.loc, info.len));
        if let Some(r) = st.readers.get(reader) {
            self.wake_reader(r);
        }
        Ok(true)
    }

    pub(crate) fn stats(&self) -> QueueStats {
        let st = self.state.lock();
        let now = now_ms();
        // An idle queue's files are closed: its ages were read before they were, and
        // a whole-store `stats` reopens nothing.
        // Every change to what `stats` reports here reads or writes a file (opening it),
        // so while none is open the ages kept at the last close are current.
        let open = st.any_file_open();
        let age_at = |loc: Loc| {
            header_at(&st.segments, &st.writer, loc)
                .map_or(0, |h| now.saturating_sub(h.enqueued_at_ms))
        };
        let mut readers = Vec::with_capacity(st.readers.len());
        for (name, r) in st.readers.iter() {
            let age_ms = if open {
                r.oldest_loc(st.next_seq).map_or(0, age_at)
            } else {
                r.oldest_enqueued.map_or(0, |(_, t)| now.saturating_sub(t))
            };
            readers.push(ReaderStats {
                name: name.clone(),
                items: r.pending_items(st.next_seq),
                bytes: r.pending_bytes,
                taken: r.taken,
                confirmed: r.confirmed_total,
                expired: r.expired,
                discarded: r.discarded,
                open_leases: (r.leases.len() as u64).saturating_sub(r.moving),
                waiters: r.waiters.load(Ordering::SeqCst),
                age_ms,
            });
        }
        readers.sort_by(|a, b| a.name.cmp(&b.name));
        let (items, bytes) = st.most_behind();
        let age_ms = if st.readers.is_empty() {
            if st.floor >= st.next_seq {
                0
            } else if open {
                st.floor_loc.map_or(0, age_at)
            } else {
                st.floor_oldest.map_or(0, |(_, t)| now.saturating_sub(t))
            }
        } else {
            readers.iter().map(|r| r.age_ms).max().unwrap_or(0)
        };
        let disk_bytes = st
            .segments
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if i + 1 == st.segments.len() {
                    st.writer.end()
                } else {
                    s.end
                }
            })
            .sum::<u64>()
            + st.journal.size_bytes();
        QueueStats {
            name: self.name.clone(),
            items,
            bytes,
            total_items: st.total_appended,
            expired: readers.iter().map(|r| r.expired).sum::<u64>() + st.floor_expired,
            discarded: readers.iter().map(|r| r.discarded).sum::<u64>() + st.floor_discarded,
            open_leases: readers.iter().map(|r| r.open_leases).sum(),
            waiters: readers.iter().map(|r| r.waiters).sum(),
            age_ms,
            disk_bytes,
            corrupt_records: st.corrupt_records,
            readers,
        }
    }

    pub(crate) fn iter(&self) -> Result<Iter> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let mut st = self.state.lock();
        st.ready()?;
        // The iterator reads the files, outside the lock.
        st.flush_staged()?;
        let start = st.oldest_kept();
        let loc = locate_in(&st.segments, &st.writer, st.next_seq, start)
            .map_err(io_err(|| "locating the oldest item".into()))?;
        let n = st.segments.len();
        let segments = st
            .segments
            .iter()
            .enumerate()
            .filter(|(_, s)| s.first_seq >= loc.seg)
            .map(|(i, s)| IterSegment {
                first_seq: s.first_seq,
                seed: s.seed,
                path: s.path.clone(),
                file: if i + 1 == n {
                    st.writer.file().ok().cloned()
                } else {
                    s.file_if_open().cloned()
                },
                end: if i + 1 == n { st.writer.end() } else { s.end },
            })
            .collect();
        Ok(Iter::new(
            segments,
            loc.off,
            start,
            st.next_seq,
            now_ms(),
            st.config.max_age,
        ))
    }

    /// Marks the queue deleted (every handle gets `NotFound` from now on) and moves its
    /// directory to `tomb`, for the store to remove. Called under the store's map lock.
    pub(crate) fn retire(&self, tomb: &Path) -> Result<()> {
        let mut st = self.state.lock();
        if let Err(e) = fs::rename(&self.dir, tomb) {
            return Err(Error::io(format!("deleting {}", self.dir.display()), e));
        }
        st.deleted = true;
        // The directory is on its way out: what is staged is dropped with it.
        let end = st.writer.file_end();
        st.writer.unstage_from(end);
        let _ = st.writer.unmap();
        st.journal.unmap();
        for r in st.readers.values() {
            r.notify.notify_waiters();
        }
        drop(st);
        self.wake_blocking();
        Ok(())
    }

    /// Syncs the files; the queue refuses work afterwards. Nothing is cut: the space
    /// reserved ahead of the last segment's data (zeroes) is kept for the next run
    /// to append into, and opening recognises it at a glance (`segment::scan`). Cutting
    /// cost an `ftruncate` per queue, 0.1 s for 458 idle queues at shutdown.
    pub(crate) fn close(&self) -> Result<()> {
        let synced = self.sync_now();
        let mut st = self.state.lock();
        if st.closed || st.deleted {
            return synced;
        }
        st.closed = true;
        for r in st.readers.values() {
            r.notify.notify_waiters();
        }
        drop(st);
        self.wake_blocking();
        synced
    }

    /// Periodic work, from the store's background thread: unmap idle windows, write
    /// staged appends that waited long enough, release timed-out leases, close the
    /// files of a queue idle for [`IDLE_CLOSE`], fsync when the interval has passed.
    /// Returns whether the queue needs more of it later: a queue that is idle, closed
    /// and synced drops off the background thread's list until its next operation
    /// ([`QueueCore::mark_active`]), so thousands of idle queues cost it nothing.
    pub(crate) fn tick(&self, now: Instant) -> bool {
        #[cfg(feature = "fault-injection")]
        crate::fault::ticked(&self.dir);
        let (sync_due, needs) = {
            let mut st = self.state.lock();
            if st.closed || st.deleted {
                return false;
            }
            st.tick_unmap(now, &self.name);
            st.tick_staged(now, &self.name);
            for name in st.tick_leases(now) {
                if let Some(r) = st.readers.get(&name) {
                    self.wake_reader(r);
                }
            }
            let sync_to_close = st.tick_close(now, &self.name);
            let sync_due = sync_to_close
                || match st.config.durability {
                    Durability::Periodic(interval) => {
                        st.dirty && now.duration_since(st.last_sync) >= interval
                    }
                    _ => false,
                };
            (sync_due, st.needs_tick())
        };
        if sync_due {
            if let Err(e) = self.sync_now() {
                tracing::error!(queue = %self.name, error = %e, "periodic fsync failed");
            }
        }
        needs
    }

    /// Puts the queue on the store's list of queues its background thread visits,
    /// unless it is there: called after every operation, since most leave work for
    /// later (an fsync due, a window to unmap, files to close, a lease to time out).
    /// One relaxed load when the queue is on the list already, which is the common
    /// case. (See `tick` for why a load ordered only by the state lock suffices.)
    pub(crate) fn mark_active(&self) {
        if self.active.load(Ordering::Relaxed) {
            return;
        }
        if !self.active.swap(true, Ordering::SeqCst) {
            if let (Some(store), Some(me)) = (self.store.upgrade(), self.me.upgrade()) {
                store.activate(me);
            }
        }
    }

    /// Called by the background thread before it ticks the queue, which it has just
    /// taken off its list: a `mark_active` from now on puts it back. Clearing the flag
    /// before the tick looks at the state (under the state lock, which every operation
    /// takes before its `mark_active`) means no operation can slip between the two
    /// unseen.
    pub(crate) fn clear_active(&self) {
        self.active.store(false, Ordering::SeqCst);
    }

    /// Closes the queue's files now, if open (the store is over its descriptor budget
    /// and this queue was used least recently). True when it closed anything; false
    /// too when the queue is busy right now (which makes it no candidate): this never
    /// waits for a queue's lock, so it can run at the end of any operation.
    pub(crate) fn close_files(&self) -> bool {
        let Some(mut st) = self.state.try_lock() else {
            return false;
        };
        if st.closed || st.deleted {
            return false;
        }
        match st.close_files() {
            Ok(closed) => closed,
            Err(e) => {
                tracing::error!(queue = %self.name, error = %e, "could not close the files of a queue");
                false
            }
        }
    }

    /// When the queue was last used, for the descriptor budget's choice; `None` when it
    /// is busy right now (in use: no candidate). Never waits, see `close_files`.
    pub(crate) fn last_used(&self) -> Option<Instant> {
        // Used since the background thread last looked: as good as now.
        let now = Instant::now();
        self.state
            .try_lock()
            .map(|st| if st.used { now } else { st.last_used })
    }
}
