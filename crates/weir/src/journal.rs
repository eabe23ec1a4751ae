//! The reader-state journal: where each reader of a queue stands, durably.
//!
//! One file per queue, `readers.GEN` (GEN = 20-digit generation). It starts with a
//! 32-byte header and a snapshot of the whole state, closed by a `SnapshotEnd` record;
//! changes follow as small CRC-framed records (a confirmation is 29 bytes). The file is
//! written through a mapping like a segment, so a confirmation costs no system call and
//! survives a killed process.
//!
//! When the file passes `rotate_bytes`, the next generation is written with a fresh
//! snapshot, fsync'ed, and only then is the old one removed; on open the newest file
//! with a complete snapshot wins. A torn or corrupt tail ends the replay there. Replay
//! streams the file through a fixed buffer: what it allocates never depends on the
//! file's size, which the disk controls.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::frame::{decode_small_frame, encode_small_frame, SEQ_MAX, SMALL_FRAME_HEADER_BYTES};
use crate::intervals::IntervalSet;
use crate::mapfile::{sync_dir, sync_file, MapFile};
use crate::segment::{
    decode_file_header, encode_file_header, read_full_at, FILE_HEADER_BYTES, JOURNAL_MAGIC,
};

/// Journal size that triggers a new generation.
const ROTATE_BYTES_MIN: u64 = 4 * 1024 * 1024;
/// Mapping window of the journal.
const WINDOW_BYTES: u64 = 64 * 1024;
/// Largest record body (a reader create with a 100-byte name is ~120 bytes).
const BODY_BYTES_MAX: usize = 1024;
// A record, framed, fits in one window many times over; a new generation starts
// only after many windows; windows are mapped at page offsets.
const _: () = assert!(((SMALL_FRAME_HEADER_BYTES + BODY_BYTES_MAX) as u64) * 16 <= WINDOW_BYTES);
const _: () = assert!(ROTATE_BYTES_MIN >= 16 * WINDOW_BYTES);
const _: () = assert!(WINDOW_BYTES.is_multiple_of(4096));

/// One journal record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum JournalRecord {
    /// The oldest seq kept when the queue has no reader.
    Floor(u64),
    /// A reader came into being (or is restated by a snapshot).
    ReaderCreate {
        id: u32,
        acked_below: u64,
        name: String,
    },
    ReaderDelete {
        id: u32,
    },
    /// The reader is done with every seq in `[from, to)`.
    Confirm {
        id: u32,
        from: u64,
        to: u64,
    },
    /// Closes a snapshot; carries the next reader id to hand out.
    SnapshotEnd {
        next_reader_id: u32,
    },
    /// The item `seq` has come back to the reader unconfirmed (released, or its lease
    /// timed out) `count` times in all: what its delivery count and `max_deliveries`
    /// go by. Absolute, so a replay applies it once however often it is restated.
    Returns {
        id: u32,
        seq: u64,
        count: u32,
    },
}

impl JournalRecord {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            JournalRecord::Floor(seq) => {
                out.push(1);
                out.extend_from_slice(&seq.to_le_bytes());
            }
            JournalRecord::ReaderCreate {
                id,
                acked_below,
                name,
            } => {
                out.push(2);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&acked_below.to_le_bytes());
                out.push(name.len() as u8);
                out.extend_from_slice(name.as_bytes());
            }
            JournalRecord::ReaderDelete { id } => {
                out.push(3);
                out.extend_from_slice(&id.to_le_bytes());
            }
            JournalRecord::Confirm { id, from, to } => {
                out.push(4);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&from.to_le_bytes());
                out.extend_from_slice(&to.to_le_bytes());
            }
            JournalRecord::SnapshotEnd { next_reader_id } => {
                out.push(5);
                out.extend_from_slice(&next_reader_id.to_le_bytes());
            }
            JournalRecord::Returns { id, seq, count } => {
                out.push(6);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&seq.to_le_bytes());
                out.extend_from_slice(&count.to_le_bytes());
            }
        }
    }

    fn decode(body: &[u8]) -> Option<JournalRecord> {
        let u32_at = |i: usize| -> Option<u32> {
            Some(u32::from_le_bytes(body.get(i..i + 4)?.try_into().ok()?))
        };
        let u64_at = |i: usize| -> Option<u64> {
            Some(u64::from_le_bytes(body.get(i..i + 8)?.try_into().ok()?))
        };
        let rec = match *body.first()? {
            1 if body.len() == 9 => JournalRecord::Floor(u64_at(1)?.min(SEQ_MAX)),
            2 => {
                let len = *body.get(13)? as usize;
                if body.len() != 14 + len {
                    return None;
                }
                let name = std::str::from_utf8(&body[14..]).ok()?.to_string();
                crate::name::validate_reader_name(&name).ok()?;
                JournalRecord::ReaderCreate {
                    id: u32_at(1)?,
                    acked_below: u64_at(5)?,
                    name,
                }
            }
            3 if body.len() == 5 => JournalRecord::ReaderDelete { id: u32_at(1)? },
            4 if body.len() == 21 => {
                let (from, to) = (u64_at(5)?, u64_at(13)?);
                if from >= to || to > SEQ_MAX {
                    return None;
                }
                JournalRecord::Confirm {
                    id: u32_at(1)?,
                    from,
                    to,
                }
            }
            5 if body.len() == 5 => JournalRecord::SnapshotEnd {
                next_reader_id: u32_at(1)?,
            },
            6 if body.len() == 17 => {
                let seq = u64_at(5)?;
                if seq > SEQ_MAX {
                    return None;
                }
                JournalRecord::Returns {
                    id: u32_at(1)?,
                    seq,
                    count: u32_at(13)?,
                }
            }
            _ => return None,
        };
        Some(rec)
    }
}

/// A reader's durable state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ReaderRecord {
    pub name: String,
    /// Every seq below this is confirmed.
    pub acked_below: u64,
    /// Seqs at or above `acked_below` confirmed out of order.
    pub confirmed: IntervalSet,
    /// Unconfirmed items that came back unconfirmed, and how many times.
    pub returns: BTreeMap<u64, u32>,
}

impl ReaderRecord {
    /// Applies a confirmation of `[from, to)`.
    pub fn confirm(&mut self, from: u64, to: u64) {
        let from = from.max(self.acked_below);
        if from < to {
            self.confirmed.insert(from, to);
        }
        while let Some(end) = self.confirmed.take_range_at(self.acked_below) {
            self.acked_below = end;
        }
        prune_returns(
            &mut self.returns,
            self.acked_below,
            &self.confirmed,
            from,
            to,
        );
    }
}

/// Drops the return counts of items no longer pending: below `acked_below`, or in
/// `[from, to)` just confirmed. Costs nothing when no item ever came back.
pub(crate) fn prune_returns(
    returns: &mut BTreeMap<u64, u32>,
    acked_below: u64,
    confirmed: &IntervalSet,
    from: u64,
    to: u64,
) {
    if returns.is_empty() {
        return;
    }
    *returns = returns.split_off(&acked_below);
    if from < to {
        let done: Vec<u64> = returns.range(from..to).map(|(&s, _)| s).collect();
        for seq in done {
            returns.remove(&seq);
        }
    }
    debug_assert!(returns.keys().all(|&s| !confirmed.contains(s)));
}

/// The state a journal describes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct JournalState {
    pub floor: u64,
    pub readers: BTreeMap<u32, ReaderRecord>,
    pub next_reader_id: u32,
}

impl JournalState {
    fn apply(&mut self, rec: &JournalRecord) {
        match rec {
            JournalRecord::Floor(seq) => self.floor = self.floor.max(*seq),
            JournalRecord::ReaderCreate {
                id,
                acked_below,
                name,
            } => {
                self.readers.insert(
                    *id,
                    ReaderRecord {
                        name: name.clone(),
                        acked_below: *acked_below,
                        confirmed: IntervalSet::default(),
                        returns: BTreeMap::new(),
                    },
                );
                self.next_reader_id = self.next_reader_id.max(id.saturating_add(1));
            }
            JournalRecord::ReaderDelete { id } => {
                self.readers.remove(id);
            }
            JournalRecord::Confirm { id, from, to } => {
                if let Some(r) = self.readers.get_mut(id) {
                    r.confirm(*from, *to);
                }
            }
            JournalRecord::SnapshotEnd { next_reader_id } => {
                self.next_reader_id = self.next_reader_id.max(*next_reader_id);
            }
            JournalRecord::Returns { id, seq, count } => {
                if let Some(r) = self.readers.get_mut(id) {
                    if *seq >= r.acked_below && !r.confirmed.contains(*seq) {
                        r.returns.insert(*seq, *count);
                    }
                }
            }
        }
    }

    /// The records that restate this state from nothing.
    pub fn snapshot(&self) -> Vec<JournalRecord> {
        let mut out = vec![JournalRecord::Floor(self.floor)];
        for (&id, r) in &self.readers {
            out.push(JournalRecord::ReaderCreate {
                id,
                acked_below: r.acked_below,
                name: r.name.clone(),
            });
            for (from, to) in r.confirmed.iter() {
                out.push(JournalRecord::Confirm { id, from, to });
            }
            for (&seq, &count) in &r.returns {
                out.push(JournalRecord::Returns { id, seq, count });
            }
        }
        out.push(JournalRecord::SnapshotEnd {
            next_reader_id: self.next_reader_id,
        });
        out
    }
}

pub(crate) struct Journal {
    dir: PathBuf,
    gen: u64,
    map: MapFile,
    /// Bytes appended over the life of this handle, across generations: the position
    /// group commit waits for.
    pub written: u64,
    rotate_bytes: u64,
    scratch: Vec<u8>,
    /// The file was replaced since the last sync: its directory needs an fsync too.
    pub rotated: bool,
}

/// What opening a journal found.
pub(crate) struct Opened {
    pub journal: Journal,
    pub state: JournalState,
    /// Bytes of damage found after the last valid record (a torn tail, or worse).
    pub damaged_tail: bool,
    /// No usable generation was found (none there, or every one damaged): the journal
    /// was started afresh, with no readers.
    pub started_afresh: bool,
    /// Generations found without a complete snapshot (removed once a newer one is
    /// written, like every older generation).
    pub unusable: usize,
}

fn file_name(gen: u64) -> String {
    format!("readers.{gen:020}")
}

fn parse_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("readers.")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())?
}

impl Journal {
    /// Opens the newest complete journal in `dir`, or starts one from `default_floor`.
    pub fn open(dir: &Path, default_floor: u64) -> io::Result<Opened> {
        let mut gens: Vec<u64> = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            if let Some(gen) = entry.file_name().to_str().and_then(parse_file_name) {
                gens.push(gen);
            }
        }
        gens.sort_unstable_by(|a, b| b.cmp(a));
        for (i, &gen) in gens.iter().enumerate() {
            let path = dir.join(file_name(gen));
            let Some((state, end, damaged_tail)) = load(&path, gen)? else {
                tracing::warn!(path = %path.display(), "reader journal has no complete snapshot; trying an older one");
                continue;
            };
            let file = File::options().read(true).write(true).open(&path)?;
            // Cut a torn or damaged tail, so the next record is not appended after junk.
            file.set_len(end)?;
            let map = MapFile::new(file, &path, end, WINDOW_BYTES)?;
            for &old in &gens[i + 1..] {
                let _ = fs::remove_file(dir.join(file_name(old)));
            }
            let journal = Journal {
                dir: dir.to_path_buf(),
                gen,
                map,
                written: 0,
                rotate_bytes: ROTATE_BYTES_MIN,
                scratch: Vec::with_capacity(64),
                rotated: false,
            };
            return Ok(Opened {
                journal,
                state,
                damaged_tail,
                started_afresh: false,
                unusable: i,
            });
        }
        // Whether that is an error depends on whether the queue has data: the caller
        // logs it.
        let state = JournalState {
            floor: default_floor,
            readers: BTreeMap::new(),
            next_reader_id: 1,
        };
        let gen = gens.first().map_or(1, |g| g + 1);
        let journal = Journal::create(dir, gen, &state.snapshot())?;
        Ok(Opened {
            journal,
            state,
            damaged_tail: false,
            started_afresh: true,
            unusable: gens.len(),
        })
    }

    /// Writes the first generation of a new queue's journal (no readers) into `dir`,
    /// without an fsync: only for a directory that is itself being created, whose
    /// creation is made durable later as a whole.
    pub fn write_new(dir: &Path) -> io::Result<()> {
        let state = JournalState {
            floor: 1,
            readers: BTreeMap::new(),
            next_reader_id: 1,
        };
        let mut bytes = encode_file_header(JOURNAL_MAGIC, 1).to_vec();
        let mut body = Vec::new();
        for rec in state.snapshot() {
            body.clear();
            rec.encode(&mut body);
            encode_small_frame(&mut bytes, &body);
        }
        fs::write(dir.join(file_name(1)), &bytes)
    }

    /// Writes generation `gen` holding `snapshot`, fsyncs it and its directory.
    fn create(dir: &Path, gen: u64, snapshot: &[JournalRecord]) -> io::Result<Journal> {
        let path = dir.join(file_name(gen));
        let tmp = dir.join(format!("{}.tmp", file_name(gen)));
        let mut bytes = encode_file_header(JOURNAL_MAGIC, gen).to_vec();
        let mut body = Vec::new();
        for rec in snapshot {
            body.clear();
            rec.encode(&mut body);
            encode_small_frame(&mut bytes, &body);
        }
        fs::write(&tmp, &bytes)?;
        sync_file(&File::open(&tmp)?)?;
        fs::rename(&tmp, &path)?;
        sync_dir(dir)?;
        let file = File::options().read(true).write(true).open(&path)?;
        let map = MapFile::new(file, &path, bytes.len() as u64, WINDOW_BYTES)?;
        Ok(Journal {
            dir: dir.to_path_buf(),
            gen,
            map,
            written: 0,
            rotate_bytes: ROTATE_BYTES_MIN.max(4 * bytes.len() as u64),
            scratch: Vec::with_capacity(64),
            rotated: true,
        })
    }

    /// Appends one record. On error nothing was written.
    pub fn append(&mut self, rec: &JournalRecord) -> io::Result<()> {
        let mut body = [0u8; 160];
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        rec.encode(&mut scratch);
        let n = scratch.len();
        debug_assert!(n <= BODY_BYTES_MAX);
        let mut frame = Vec::new();
        let bytes: &[u8] = if n + 8 <= body.len() {
            body[0..4].copy_from_slice(&(n as u32).to_le_bytes());
            body[4..8].copy_from_slice(&crc32c::crc32c(&scratch).to_le_bytes());
            body[8..8 + n].copy_from_slice(&scratch);
            &body[..8 + n]
        } else {
            encode_small_frame(&mut frame, &scratch);
            &frame
        };
        let result = self.map.append(&[bytes]);
        self.scratch = scratch;
        result?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    pub fn needs_rotation(&self) -> bool {
        self.map.end() >= self.rotate_bytes
    }

    /// Starts the next generation from `state`; the old file goes only once the new one
    /// is safely on disk. On error the current file stays in use.
    pub fn rotate(&mut self, state: &JournalState) -> io::Result<()> {
        let mut next = Journal::create(&self.dir, self.gen + 1, &state.snapshot())?;
        next.set_tally(self.map.tally());
        let old = std::mem::replace(
            self,
            Journal {
                written: self.written,
                ..next
            },
        );
        let _ = fs::remove_file(old.map.path());
        self.rotated = true;
        Ok(())
    }

    pub fn file(&self) -> io::Result<&Arc<File>> {
        self.map.file()
    }

    /// Closes the descriptor (an idle queue's); the next use opens it again.
    pub fn close(&mut self) -> io::Result<()> {
        self.map.close()
    }

    /// Counts the descriptor in the store's tally (see `file_cell.rs`).
    pub fn set_tally(&mut self, tally: Option<Arc<crate::file_cell::FilesBudget>>) {
        self.map.set_tally(tally);
    }

    pub fn is_open(&self) -> bool {
        self.map.is_open()
    }

    pub fn size_bytes(&self) -> u64 {
        self.map.end()
    }

    /// Drops the mapping (frees its RSS); the next append maps again. The journal
    /// never stages, so this cannot fail.
    pub fn unmap(&mut self) {
        if let Err(e) = self.map.unmap() {
            debug_assert!(false, "a journal had staged bytes: {e}");
        }
    }
}

/// How much of a journal file replay reads at once. Replay streams the file through a
/// buffer of this size (plus one record), so its memory never depends on the file's
/// size, which the disk controls.
const LOAD_CHUNK_BYTES: usize = 1024 * 1024;
/// Largest frame: the framing header and the largest body.
const FRAME_BYTES_MAX: usize = SMALL_FRAME_HEADER_BYTES + BODY_BYTES_MAX;

/// Replays a journal file: `None` when it has no complete snapshot. Also returns the
/// end of the last valid record and whether junk followed it.
fn load(path: &Path, gen: u64) -> io::Result<Option<(JournalState, u64, bool)>> {
    let file = File::open(path)?;
    let file_len = file.metadata()?.len();
    let mut header = [0u8; FILE_HEADER_BYTES as usize];
    let n = read_full_at(&file, &mut header, 0)?;
    if decode_file_header(JOURNAL_MAGIC, &header[..n]) != Some(gen) {
        return Ok(None);
    }
    let mut state = JournalState {
        floor: 1,
        readers: BTreeMap::new(),
        next_reader_id: 1,
    };
    let mut snapshot_done = false;
    // `buf` holds the file's bytes from `buf_at` on; `pos` is the next record in it.
    let mut buf: Vec<u8> = Vec::with_capacity(LOAD_CHUNK_BYTES + FRAME_BYTES_MAX);
    let mut buf_at = FILE_HEADER_BYTES;
    let mut pos = 0usize;
    let mut eof = false;
    loop {
        if buf.len() - pos < FRAME_BYTES_MAX && !eof {
            buf.drain(..pos);
            buf_at += pos as u64;
            pos = 0;
            let read_at = buf_at + buf.len() as u64;
            eof = !fill(&file, file_len, &mut buf, read_at)?;
        }
        let Some((body, used)) = decode_small_frame(&buf[pos..], BODY_BYTES_MAX) else {
            break;
        };
        let Some(rec) = JournalRecord::decode(body) else {
            break;
        };
        if matches!(rec, JournalRecord::SnapshotEnd { .. }) {
            snapshot_done = true;
        }
        state.apply(&rec);
        pos += used;
    }
    if !snapshot_done {
        return Ok(None);
    }
    let end = buf_at + pos as u64;
    // A crash leaves the rest of the mapping window as zeroes; anything else after the
    // last valid record is damage. A healthy tail is shorter than one window, so one
    // more chunk is looked at, and a tail longer than that is damage whatever it holds.
    let mut damaged = buf[pos..].iter().any(|&b| b != 0);
    if !damaged && !eof {
        let next_at = buf_at + buf.len() as u64;
        buf.clear();
        let more = fill(&file, file_len, &mut buf, next_at)?;
        damaged = more || buf.iter().any(|&b| b != 0);
    }
    debug_assert!(end >= FILE_HEADER_BYTES && end <= file_len.max(FILE_HEADER_BYTES));
    Ok(Some((state, end, damaged)))
}

/// Appends to `buf` up to [`LOAD_CHUNK_BYTES`] of the file from `at`; false when that
/// reached the end of the file (`file_len` long).
fn fill(file: &File, file_len: u64, buf: &mut Vec<u8>, at: u64) -> io::Result<bool> {
    let want = file_len.saturating_sub(at).min(LOAD_CHUNK_BYTES as u64) as usize;
    let old_len = buf.len();
    buf.resize(old_len + want, 0);
    let n = read_full_at(file, &mut buf[old_len..], at)?;
    buf.truncate(old_len + n);
    Ok(n == want && at + (want as u64) < file_len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        for rec in [
            JournalRecord::Floor(9),
            JournalRecord::ReaderCreate {
                id: 3,
                acked_below: 17,
                name: "abc".into(),
            },
            JournalRecord::ReaderCreate {
                id: 0,
                acked_below: 1,
                name: String::new(),
            },
            JournalRecord::ReaderDelete { id: 3 },
            JournalRecord::Confirm {
                id: 3,
                from: 4,
                to: 9,
            },
            JournalRecord::SnapshotEnd { next_reader_id: 4 },
            JournalRecord::Returns {
                id: 3,
                seq: 12,
                count: 2,
            },
        ] {
            let mut b = Vec::new();
            rec.encode(&mut b);
            assert_eq!(JournalRecord::decode(&b), Some(rec));
        }
    }

    #[test]
    fn return_counts_replay_restate_and_go_with_the_confirmation() {
        let dir = tempfile::tempdir().unwrap();
        let mut opened = Journal::open(dir.path(), 1).unwrap();
        let records = [
            JournalRecord::ReaderCreate {
                id: 1,
                acked_below: 1,
                name: "r".into(),
            },
            JournalRecord::Returns {
                id: 1,
                seq: 2,
                count: 1,
            },
            JournalRecord::Returns {
                id: 1,
                seq: 3,
                count: 1,
            },
            JournalRecord::Returns {
                id: 1,
                seq: 2,
                count: 2,
            },
            // Confirmed: its count goes.
            JournalRecord::Confirm {
                id: 1,
                from: 3,
                to: 4,
            },
            // Below the reader's position, or of no reader: ignored.
            JournalRecord::Confirm {
                id: 1,
                from: 1,
                to: 2,
            },
            JournalRecord::Returns {
                id: 1,
                seq: 1,
                count: 5,
            },
            JournalRecord::Returns {
                id: 9,
                seq: 2,
                count: 5,
            },
        ];
        for rec in &records {
            opened.journal.append(rec).unwrap();
        }
        drop(opened);
        let again = Journal::open(dir.path(), 1).unwrap();
        let r = &again.state.readers[&1];
        assert_eq!(r.returns, BTreeMap::from([(2, 2)]));
        // A new generation restates them.
        let mut journal = again.journal;
        journal.rotate(&again.state).unwrap();
        drop(journal);
        let rotated = Journal::open(dir.path(), 1).unwrap();
        assert_eq!(rotated.state.readers[&1].returns, BTreeMap::from([(2, 2)]));
        // Confirming 2 moves acked_below past it: gone.
        let mut state = rotated.state.clone();
        state.apply(&JournalRecord::Confirm {
            id: 1,
            from: 2,
            to: 3,
        });
        assert!(state.readers[&1].returns.is_empty());
    }

    #[test]
    fn replay_streams_a_journal_larger_than_one_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let mut opened = Journal::open(dir.path(), 1).unwrap();
        let mut state = opened.state.clone();
        let create = JournalRecord::ReaderCreate {
            id: 1,
            acked_below: 1,
            name: "r".into(),
        };
        opened.journal.append(&create).unwrap();
        state.apply(&create);
        // Confirmations of 29 bytes, every other one out of order, and floors of 17:
        // frames straddle every chunk boundary somewhere.
        let mut seq = 1;
        while opened.journal.size_bytes() < 3 * LOAD_CHUNK_BYTES as u64 + 1000 {
            for rec in [
                JournalRecord::Confirm {
                    id: 1,
                    from: seq + 1,
                    to: seq + 2,
                },
                JournalRecord::Confirm {
                    id: 1,
                    from: seq,
                    to: seq + 1,
                },
                JournalRecord::Floor(seq),
            ] {
                opened.journal.append(&rec).unwrap();
                state.apply(&rec);
            }
            seq += 2;
        }
        drop(opened);
        let again = Journal::open(dir.path(), 1).unwrap();
        assert!(!again.damaged_tail, "a crash-like zero tail is not damage");
        assert_eq!(again.state, state);
        assert_eq!(again.state.readers[&1].acked_below, seq);
    }

    #[test]
    fn replay_of_a_huge_file_reads_no_more_than_its_records() {
        // A file whose size says 64 GiB (sparse): replay must not allocate for it.
        let dir = tempfile::tempdir().unwrap();
        let mut opened = Journal::open(dir.path(), 1).unwrap();
        let create = JournalRecord::ReaderCreate {
            id: 1,
            acked_below: 5,
            name: "r".into(),
        };
        opened.journal.append(&create).unwrap();
        let path = opened.journal.map.path().to_path_buf();
        let end = opened.journal.size_bytes();
        drop(opened);
        let file = File::options().write(true).open(&path).unwrap();
        file.set_len(1 << 36).unwrap();
        drop(file);
        let again = Journal::open(dir.path(), 1).unwrap();
        assert!(again.damaged_tail, "a tail longer than a window is damage");
        assert_eq!(again.state.readers[&1].acked_below, 5);
        assert_eq!(
            fs::metadata(&path).unwrap().len(),
            end,
            "cut after the last record"
        );
    }

    #[test]
    fn junk_after_the_last_record_is_damage_and_cut() {
        let dir = tempfile::tempdir().unwrap();
        let opened = Journal::open(dir.path(), 1).unwrap();
        let path = opened.journal.map.path().to_path_buf();
        let end = opened.journal.size_bytes();
        drop(opened);
        let mut bytes = fs::read(&path).unwrap();
        bytes.truncate(end as usize);
        bytes.extend_from_slice(&[0, 0, 0, 7, 1, 2, 3]);
        fs::write(&path, &bytes).unwrap();
        let again = Journal::open(dir.path(), 1).unwrap();
        assert!(again.damaged_tail);
        assert_eq!(fs::metadata(&path).unwrap().len(), end);
    }

    #[test]
    fn replays_after_reopen_and_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let mut opened = Journal::open(dir.path(), 1).unwrap();
        let mut state = opened.state.clone();
        let mut recs = vec![
            JournalRecord::ReaderCreate {
                id: 1,
                acked_below: 1,
                name: "r".into(),
            },
            JournalRecord::Confirm {
                id: 1,
                from: 1,
                to: 2,
            },
            JournalRecord::Confirm {
                id: 1,
                from: 3,
                to: 4,
            },
        ];
        for r in &recs {
            opened.journal.append(r).unwrap();
            state.apply(r);
        }
        opened.journal.rotate(&state).unwrap();
        recs = vec![JournalRecord::Confirm {
            id: 1,
            from: 2,
            to: 3,
        }];
        for r in &recs {
            opened.journal.append(r).unwrap();
            state.apply(r);
        }
        drop(opened);
        let again = Journal::open(dir.path(), 1).unwrap();
        assert_eq!(again.state.readers[&1].acked_below, 4);
        assert!(again.state.readers[&1].confirmed.is_empty());
        assert_eq!(again.state, state);
        let files: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(files.len(), 1, "the old generation is removed");
    }
}
