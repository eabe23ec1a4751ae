//! Opening a queue and recovering it after a crash: the segments listed, the last
//! one scanned and its torn tail cut, the reader journal replayed and reconciled with
//! the reader list, sequence numbers kept past every confirmed one; and creating a
//! queue all or nothing (built beside its final name, then renamed into place).

use std::collections::VecDeque;
use std::fs::{self, File};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::clock::Clock;
use crate::config::{Durability, QueueConfig};
use crate::error::Result;
use crate::file_cell::FilesBudget;
use crate::frame::new_seed;
use crate::journal::{Journal, JournalState};
use crate::mapfile::{sync_dir, MapFile};
use crate::reader_list::{self, ReaderList};
use crate::readers::Readers;
use crate::segment::{
    self, encode_segment_header, parse_segment_file_name, segment_file_name, ReadBuf, Segment,
    FILE_HEADER_BYTES,
};
use crate::space_reserve::SpaceReserve;
use crate::store::StoreInner;

use super::log::{create_segment, SegmentLog, WRITE_WINDOW_BYTES};
use super::queue_core::{QueueCore, StoreLink};
use super::reader_state::new_reader;
use super::state::State;
use super::sync_state::SyncState;
use crate::error::io_err;

/// The files of a new, empty queue in `dir` (created here): a reader journal, an empty
/// reader list and a first segment holding only its header. No fsync (see
/// [`QueueCore::open_or_create`]) and no space reserved ahead: the first append
/// reserves what it needs.
pub(super) fn write_new_queue(dir: &Path) -> Result<()> {
    let err = |what: &'static str| io_err(move || format!("{what} {}", dir.display()));
    fs::create_dir(dir).map_err(err("creating"))?;
    Journal::write_new(dir).map_err(err("writing the reader journal in"))?;
    reader_list::write(dir, &ReaderList::default()).map_err(err("writing the reader list in"))?;
    let segment = dir.join(segment_file_name(1));
    fs::write(&segment, encode_segment_header(1, new_seed())).map_err(err("writing a segment in"))
}

impl State {
    /// The state of a queue just recovered: no readers yet, the floor at 1 (both
    /// placed by [`State::place_floor_and_readers`]).
    fn recovered(
        name: &str,
        config: QueueConfig,
        log: SegmentLog,
        next_seq: u64,
        journal: Journal,
        tally: Option<Arc<FilesBudget>>,
        reserve: Option<Arc<SpaceReserve>>,
    ) -> State {
        let now = Instant::now();
        State {
            name: name.to_string(),
            config,
            clock: Clock::system(),
            closed: false,
            deleted: false,
            poisoned: None,
            log,
            next_seq,
            floor: 1,
            hold: None,
            retired: 0..0,
            floor_oldest: None,
            floor_head_expiry: None,
            tally,
            reader_list_dirty: false,
            reserve,
            created_unsynced: false,
            floor_bytes: 0,
            floor_loc: None,
            floor_discarded: 0,
            floor_expired: 0,
            floor_read_buf: ReadBuf::default(),
            readers: Readers::new(),
            next_reader_id: 1,
            next_lease_id: 1,
            lease_deadlines: false,
            journal,
            total_appended: 0,
            corrupt_records: 0,
            dirty: false,
            dir_dirty: false,
            unsynced: Vec::new(),
            last_sync: now,
            last_write: now,
            wrote: false,
            used: false,
            last_used: now,
            expired_budget_spent: false,
            mapped: true,
        }
    }

    /// The journal has readers past the last item on disk (an OS crash lost items
    /// after they were confirmed): new items continue from `seq_floor`, in a segment
    /// named after it.
    fn retire_lost_seqs(&mut self, seq_floor: u64) -> Result<()> {
        let dir = self.dir().to_path_buf();
        if self.config.durability == Durability::Buffered {
            // A killed process loses what it had staged, and a reader may have taken
            // and confirmed it from the staging buffer already: documented, a warning.
            tracing::warn!(dir = %dir.display(), lost_to = seq_floor, first_lost = self.next_seq, "confirmed items were only staged when the process stopped (buffered): other readers skip them");
        } else {
            tracing::warn!(dir = %dir.display(), lost_to = seq_floor, first_lost = self.next_seq, "confirmed items were lost (an OS crash before their fsync): other readers skip them");
        }
        self.retired = self.next_seq..seq_floor;
        self.next_seq = seq_floor;
        if self.log.writer.end() > FILE_HEADER_BYTES {
            return self.roll();
        }
        // An empty last segment is named after a seq that is now retired.
        let old = self.log.segments.pop_back();
        let (segment, map) = create_segment(
            &dir,
            seq_floor,
            self.config.segment_size_bytes,
            self.tally.clone(),
        )?;
        self.log.segments.push_back(segment);
        self.log.writer = map;
        if let Some(old) = old {
            let _ = fs::remove_file(&old.path);
        }
        sync_dir(&dir).map_err(io_err(|| format!("syncing {}", dir.display())))
    }

    /// Places the floor and the journal's readers on the recovered log: each reader's
    /// cursor at its oldest unconfirmed item (its confirmations above it are skipped by
    /// reading), its pending bytes estimated from the files.
    fn place_floor_and_readers(&mut self, journal_state: JournalState) -> Result<()> {
        let next_seq = self.next_seq;
        let dir = self.dir().to_path_buf();
        let oldest_on_disk = self.log.segments.front().map_or(next_seq, |s| s.first_seq);
        self.floor = journal_state.floor.max(oldest_on_disk).min(next_seq);
        let floor_loc = self.log.locate(next_seq, self.floor).map_err(io_err(|| {
            format!("locating the oldest item in {}", dir.display())
        }))?;
        self.floor_bytes = self
            .log
            .span_payload_bytes(floor_loc, next_seq - self.floor);
        self.floor_loc = Some(floor_loc);
        for (id, mut rec) in journal_state.readers {
            let mut confirmed = rec.confirmed;
            let acked_below = rec.acked_below.max(oldest_on_disk).min(next_seq);
            confirmed.remove_below(acked_below);
            let cursor = self
                .log
                .locate(next_seq, acked_below)
                .map_err(io_err(|| format!("locating a reader in {}", dir.display())))?;
            let bytes = self.log.span_payload_bytes(cursor, next_seq - acked_below);
            let mut r = new_reader(id, acked_below, cursor, bytes);
            r.confirmed = confirmed;
            r.returns = rec.returns.split_off(&acked_below);
            // A count journaled for an item lost with the data (a kill under
            // `buffered`, a power cut) must not pass to the next item given its seq.
            r.returns.retain(|&seq, _| seq < next_seq);
            self.readers.insert(rec.name, r);
        }
        Ok(())
    }

    /// At open, once the journal's readers are in: reconciles them with the reader list
    /// (`reader_list.rs`). A readable journal is the truth and the list is rewritten to
    /// match it when it differs. A lost journal's readers are created again from the
    /// list, at the oldest stored item; with the list lost too, the stored items are
    /// held (nothing reclaimed) for the readers nobody can name any more.
    pub(super) fn recover_reader_list(
        &mut self,
        journal_lost: bool,
        listed: reader_list::Read,
    ) -> Result<()> {
        let dir = self.dir().to_path_buf();
        match listed {
            reader_list::Read::Found(list) if journal_lost => {
                self.hold = list.hold;
                for name in &list.names {
                    if !self.readers.contains_key(name) {
                        self.create_reader(name, false)?;
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
                tracing::error!(dir = %dir.display(), list = ?lost, held_from = ?self.hold, "reader journal and list both lost: items are kept for unknown readers until the queue is flushed");
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
}

impl QueueCore {
    /// Opens (creating if needed) the queue stored in `dir`, recovering from a crash:
    /// the last segment is scanned and its torn tail cut (damage with valid records
    /// after it is kept, see `segment::scan`), the reader journal is replayed, and
    /// readers start again at their oldest unconfirmed item (leases open at the crash
    /// are delivered again). Each step is a function below, in this order.
    pub(crate) fn open(
        name: &str,
        dir: &Path,
        config: QueueConfig,
        store: Weak<StoreInner>,
    ) -> Result<Arc<QueueCore>> {
        fs::create_dir_all(dir).map_err(io_err(|| format!("creating {}", dir.display())))?;
        let firsts = list_segments(dir)?;
        // Every descriptor of the queue counts in the store's tally (`file_cell.rs`).
        let tally = store.upgrade().map(|s| Arc::clone(&s.files_budget));
        let opened =
            Journal::open(dir, firsts.first().copied().unwrap_or(1)).map_err(io_err(|| {
                format!("opening the reader journal in {}", dir.display())
            }))?;
        if opened.damaged_tail {
            tracing::warn!(dir = %dir.display(), "reader journal had a damaged tail; it was cut");
        }
        // The journal is created before the first segment, so segments without a
        // usable journal mean it was lost or damaged, not that the queue is new.
        let journal_lost = opened.started_afresh && (opened.unusable > 0 || !firsts.is_empty());
        if journal_lost {
            tracing::error!(dir = %dir.display(), damaged_journals = opened.unusable, segments = firsts.len(), "no usable reader journal: readers start again at the oldest stored item, so confirmed items come again");
        }
        let listed = reader_list::read(dir).map_err(io_err(|| {
            format!("reading the reader list in {}", dir.display())
        }))?;
        let journal_state = opened.state;
        let seq_floor = retired_below(&journal_state);
        let mut segments = load_segments(dir, &firsts, &tally)?;
        finish_interrupted_roll(&mut segments)?;
        let (writer, next_seq) = match segments.back_mut() {
            Some(last) => recover_last_segment(dir, last)?,
            None => {
                let (segment, map) =
                    create_segment(dir, seq_floor, config.segment_size_bytes, tally.clone())?;
                segments.push_back(segment);
                sync_dir(dir).map_err(io_err(|| format!("syncing {}", dir.display())))?;
                (map, seq_floor)
            }
        };
        let mut journal = opened.journal;
        journal.set_tally(tally.clone());
        let mut writer = writer;
        writer.set_tally(tally.clone());
        let log = SegmentLog { segments, writer };
        let reserve = store.upgrade().map(|s| Arc::clone(&s.reserve));
        let mut state = State::recovered(name, config, log, next_seq, journal, tally, reserve);
        state.clock = store.upgrade().map(|s| s.clock.clone()).unwrap_or_default();
        state.next_reader_id = journal_state.next_reader_id.max(1);
        if seq_floor > state.next_seq {
            state.retire_lost_seqs(seq_floor)?;
        }
        state.place_floor_and_readers(journal_state)?;
        state.recover_reader_list(journal_lost, listed)?;
        // A crash between a confirmation and the deletion of a consumed segment leaves
        // the segment behind; delete it now.
        state.reclaim();
        state.apply_staging()?;
        Ok(QueueCore::new(name, dir, store, state))
    }

    /// The queue's shared parts around its recovered `state`, on the store's list of
    /// active queues (the first tick takes an idle one off it).
    fn new(name: &str, dir: &Path, store: Weak<StoreInner>, state: State) -> Arc<QueueCore> {
        let budget = state.tally.clone();
        let store: Weak<dyn StoreLink> = store;
        let core = Arc::new_cyclic(|me| QueueCore {
            clock: state.clock.clone(),
            name: name.to_string(),
            dir: dir.to_path_buf(),
            store,
            me: me.clone(),
            active: AtomicBool::new(false),
            budget,
            state: Mutex::new(state),
            sync: Mutex::new(SyncState::default()),
            wake_gen: AtomicU64::new(0),
            wake_lock: Mutex::new(()),
            wake_cv: Condvar::new(),
            blocking_waiters: AtomicU64::new(0),
        });
        core.mark_active();
        core
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
            let mut state = core.state.lock();
            state.created_unsynced = true;
            state.dirty = true;
        }
        Ok(core)
    }
}

/// The first seqs of the segment files in `dir`, in order; leftover temporary files
/// are deleted.
fn list_segments(dir: &Path) -> Result<Vec<u64>> {
    let listing = io_err(|| format!("listing {}", dir.display()));
    let mut firsts = Vec::new();
    for entry in fs::read_dir(dir).map_err(listing)? {
        let entry = entry.map_err(io_err(|| format!("listing {}", dir.display())))?;
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
    Ok(firsts)
}

/// The lowest seq new items may take: past every seq a reader has confirmed. After an
/// OS crash the journal can be ahead of the segments, and new items must not reuse
/// those seqs.
fn retired_below(journal_state: &JournalState) -> u64 {
    let mut seq_floor = journal_state.floor.max(1);
    for r in journal_state.readers.values() {
        seq_floor = seq_floor.max(r.acked_below);
        if let Some((_, end)) = r.confirmed.iter().last() {
            seq_floor = seq_floor.max(end);
        }
    }
    seq_floor
}

/// The segments of `dir` with their seeds and sizes, closed: sealed segments are
/// opened again when a reader reaches them, the last one as the writer.
fn load_segments(
    dir: &Path,
    firsts: &[u64],
    tally: &Option<Arc<FilesBudget>>,
) -> Result<VecDeque<Segment>> {
    let ctx = |what: &str| format!("{what} {}", dir.display());
    let mut segments = VecDeque::with_capacity(firsts.len());
    for (i, &first) in firsts.iter().enumerate() {
        let path = dir.join(segment_file_name(first));
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
    Ok(segments)
}

/// Granularity of a segment file's size while it is written (`MapFile` allocates whole
/// pages); a sealed segment is cut to its data, whose end is rarely a page boundary.
const SEGMENT_ALLOCATION_BYTES: u64 = 4096;

/// Completes a roll a killed process left halfway: a roll creates the new segment
/// first and then cuts the sealed one to its data, so a kill between the two leaves
/// the segment before the last one with the unused space reserved ahead of its data.
/// That space reads as zeroes, which a reader would take for a hole an OS crash left
/// (a warning, and a skip to the next segment that loses nothing, since nothing is
/// there). Cut it now, as the roll would have. Only a file whose size is a whole
/// number of pages can be in that state: that check costs nothing, the scan (one
/// segment read) is made only then.
fn finish_interrupted_roll(segments: &mut VecDeque<Segment>) -> Result<()> {
    let n = segments.len();
    if n < 2 {
        return Ok(());
    }
    let seg = &mut segments[n - 2];
    if seg.end <= FILE_HEADER_BYTES || !seg.end.is_multiple_of(SEGMENT_ALLOCATION_BYTES) {
        return Ok(());
    }
    let ctx = |what: &str| format!("{what} {}", seg.path.display());
    let file = File::options()
        .read(true)
        .write(true)
        .open(&seg.path)
        .map_err(io_err(|| ctx("opening")))?;
    let scan = segment::scan(&file, seg.first_seq, seg.seed, seg.end)
        .map_err(io_err(|| ctx("scanning")))?;
    if scan.zero_tail && scan.end < seg.end {
        file.set_len(scan.end)
            .map_err(io_err(|| ctx("cutting the unused tail of")))?;
        tracing::info!(path = %seg.path.display(), from = seg.end, to = scan.end, "a segment sealed when the process stopped was cut to its data (the roll was interrupted)");
        seg.end = scan.end;
    }
    Ok(())
}

/// Recovers the segment being written at the crash: a damaged header is rewritten, the
/// records are scanned, a torn tail is cut, and the writer maps its end. Returns the
/// writer and the seq the next append gets.
fn recover_last_segment(dir: &Path, last: &mut Segment) -> Result<(MapFile, u64)> {
    let ctx = |what: &str| format!("{what} {}", dir.display());
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
        // The header is damaged but records may follow: rewrite the header (the first
        // seq is the file's name, the seed the vote of its copies) and keep what checks
        // out.
        if segment::is_torn_header(&header[..n], last.first_seq) {
            tracing::warn!(path = %last.path.display(), "segment header half-written (a crash while the segment was created, expected after one); rewriting it");
        } else {
            tracing::error!(path = %last.path.display(), "segment header is damaged; rewriting it");
        }
        use std::os::unix::fs::FileExt;
        file.write_all_at(&encode_segment_header(last.first_seq, last.seed), 0)
            .map_err(io_err(|| ctx("rewriting a segment header in")))?;
    }
    let (end, next_seq) = if header_ok || last.end > FILE_HEADER_BYTES {
        scan_last_segment(&file, last, dir)?
    } else {
        // Created but never completed: start it again, empty.
        file.set_len(0)
            .map_err(io_err(|| ctx("resetting segment in")))?;
        (0, last.first_seq)
    };
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
    Ok((map, next_seq))
}

/// Scans the last segment for its valid records: returns where they end and the seq
/// after the last. Junk after them (a torn write) is cut, so that nothing of it can
/// ever be read as records after the next append; zeroes (the space reserved ahead,
/// what a clean stop leaves) are kept for the appends to come.
fn scan_last_segment(file: &File, last: &Segment, dir: &Path) -> Result<(u64, u64)> {
    let ctx = |what: &str| format!("{what} {}", dir.display());
    let scan = segment::scan(file, last.first_seq, last.seed, last.end)
        .map_err(io_err(|| ctx("scanning segment in")))?;
    if scan.torn_batch {
        tracing::warn!(path = %last.path.display(), offset = scan.end, "a batch interrupted by a crash was cut, with everything after it");
    }
    if scan.damaged {
        // Kept, not cut: later records may have been acknowledged. Readers skip the
        // damaged ones and count them as lost.
        tracing::error!(path = %last.path.display(), "damaged records in the middle of the last segment; the records after them are kept");
    }
    if !scan.zero_tail {
        file.set_len(scan.end)
            .map_err(io_err(|| ctx("cutting the torn tail of a segment in")))?;
    }
    Ok((scan.end, scan.next_seq))
}
