//! The segment log of one queue: the segment files in order, the last one written
//! through the writer's mapping. Reading a record at a position (from the mapping when
//! it is there, else through a read-ahead buffer), finding where a sequence number
//! lies, creating segments and estimating the payload bytes of a span.

use std::collections::VecDeque;
use std::fs::{self, File};
use std::io;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::file_cell::FilesBudget;
use crate::frame::{decode_header, new_seed, verify, RecordHeader, RECORD_HEADER_BYTES};
use crate::mapfile::MapFile;
use crate::segment::{
    self, encode_segment_header, segment_file_name, Found, Loc, ReadBuf, Segment,
    FILE_HEADER_BYTES, READ_AHEAD_BYTES,
};

use super::cursor::{self, ReadAt, Step, Walk};

/// Mapping window of the segment being written: bounds the RSS the writer adds.
pub(super) const WRITE_WINDOW_BYTES: u64 = 256 * 1024;
// Windows are mapped at page offsets and grow in whole pages.
const _: () = assert!(WRITE_WINDOW_BYTES.is_multiple_of(4096));

/// The segment files of a queue, oldest first; the last one is written through
/// `writer`, a mapping window over its end.
pub(super) struct SegmentLog {
    pub(super) segments: VecDeque<Segment>,
    pub(super) writer: MapFile,
}

impl SegmentLog {
    /// The index of the segment that starts at `first_seq`.
    pub(super) fn index(&self, first_seq: u64) -> Option<usize> {
        let i = self.segments.partition_point(|s| s.first_seq < first_seq);
        (i < self.segments.len() && self.segments[i].first_seq == first_seq).then_some(i)
    }

    fn is_last(&self, i: usize) -> bool {
        i + 1 == self.segments.len()
    }

    /// Where the valid data of segment `i` ends (for the last, what the writer wrote,
    /// staged bytes included).
    pub(super) fn data_end(&self, i: usize) -> u64 {
        if self.is_last(i) {
            self.writer.end()
        } else {
            self.segments[i].end
        }
    }

    /// The descriptor to read segment `i` through: the writer's for the segment being
    /// written, else the segment's own (opened on first use).
    pub(super) fn file(&self, i: usize) -> io::Result<&Arc<File>> {
        if self.is_last(i) {
            self.writer.file()
        } else {
            self.segments[i].file()
        }
    }

    /// Writes what the writer has staged (`buffered` durability) to the file: before
    /// anything reads the last segment through the file rather than through the
    /// writer (scans, iteration, fsync).
    pub(super) fn flush_staged(&mut self) -> Result<()> {
        self.writer
            .flush_staged()
            .map_err(|e| Error::io(format!("writing {}", self.writer.path().display()), e))
    }

    /// Reads the record at `loc`: from the writer's mapping when it is there (no
    /// system call), else through the read-ahead buffer `read_buf`.
    pub(super) fn read_at(&self, read_buf: &mut ReadBuf, loc: Loc) -> io::Result<ReadAt> {
        let Some(i) = self.index(loc.segment_first_seq) else {
            return Ok(ReadAt::Missing);
        };
        let seg = &self.segments[i];
        let active = self.is_last(i);
        if loc.off >= self.data_end(i) {
            return Ok(ReadAt::End);
        }
        // Reads of the file stop where the file's data does: past it the active
        // segment's bytes are staged in memory (served by `writer.mapped` below).
        let file_limit = if active {
            self.writer.file_end()
        } else {
            seg.end
        };
        if active {
            if let Some(hb) = self.writer.mapped(loc.off, RECORD_HEADER_BYTES as u64) {
                let Some(h) = decode_header(hb) else {
                    return Ok(ReadAt::Bad);
                };
                if let Some(rec) = self.writer.mapped(loc.off, h.record_bytes()) {
                    if !verify(&h, rec, seg.seed) {
                        return Ok(ReadAt::Bad);
                    }
                    return Ok(ReadAt::Rec(h, payload_of(rec)));
                }
            }
        }
        let found = segment::read_record(
            read_buf,
            self.file(i)?,
            seg.first_seq,
            seg.seed,
            loc.off,
            file_limit,
            READ_AHEAD_BYTES,
        )?;
        Ok(found_to_read_at(found))
    }

    /// Reads only the header of the record at `loc`.
    pub(super) fn header_at(&self, loc: Loc) -> Option<RecordHeader> {
        let i = self.index(loc.segment_first_seq)?;
        if self.is_last(i) {
            if let Some(b) = self.writer.mapped(loc.off, RECORD_HEADER_BYTES as u64) {
                return decode_header(b);
            }
        }
        let mut buf = [0u8; RECORD_HEADER_BYTES];
        segment::read_full_at(self.file(i).ok()?, &mut buf, loc.off).ok()?;
        decode_header(&buf)
    }

    /// Where the first record with seq ≥ `seq` starts (the tail when there is none);
    /// `next_seq` is the seq the next append gets.
    pub(super) fn locate(&self, next_seq: u64, seq: u64) -> io::Result<Loc> {
        let Some(last) = self.segments.back() else {
            return Ok(Loc {
                segment_first_seq: next_seq,
                off: FILE_HEADER_BYTES,
            });
        };
        if seq >= next_seq {
            return Ok(Loc {
                segment_first_seq: last.first_seq,
                off: self.writer.end(),
            });
        }
        let i = self
            .segments
            .partition_point(|s| s.first_seq <= seq)
            .saturating_sub(1);
        let seg = &self.segments[i];
        let off = segment::locate(
            self.file(i)?,
            seg.first_seq,
            seg.seed,
            self.data_end(i),
            seq,
        )?;
        Ok(Loc {
            segment_first_seq: seg.first_seq,
            off,
        })
    }

    /// Payload bytes from `loc` to the tail, estimated from file sizes: exact unless
    /// records in that span were confirmed out of order or lost to damage.
    pub(super) fn span_payload_bytes(&self, loc: Loc, items: u64) -> u64 {
        let mut bytes = 0u64;
        for (i, seg) in self.segments.iter().enumerate() {
            if seg.first_seq < loc.segment_first_seq {
                continue;
            }
            let start = if seg.first_seq == loc.segment_first_seq {
                loc.off
            } else {
                FILE_HEADER_BYTES
            };
            bytes += self.data_end(i).saturating_sub(start);
        }
        bytes.saturating_sub(items * RECORD_HEADER_BYTES as u64)
    }

    /// The bytes of every segment file, as far as their data goes.
    pub(super) fn disk_bytes(&self) -> u64 {
        (0..self.segments.len()).map(|i| self.data_end(i)).sum()
    }

    /// One step of a cursor over the live log (see [`cursor::step`]); `next_seq` is
    /// the seq the next append gets.
    pub(super) fn step(
        &mut self,
        next_seq: u64,
        at: &mut Loc,
        read_buf: &mut ReadBuf,
        seq_min: u64,
    ) -> Result<Step> {
        let mut live = Live {
            log: self,
            next_seq,
        };
        cursor::step(&mut live, at, read_buf, seq_min)
    }
}

/// The live log as a cursor walks it: under the queue's lock, with `next_seq`.
struct Live<'a> {
    log: &'a mut SegmentLog,
    next_seq: u64,
}

impl Walk for Live<'_> {
    fn read(&mut self, read_buf: &mut ReadBuf, at: Loc) -> Result<ReadAt> {
        self.log
            .read_at(read_buf, at)
            .map_err(|e| Error::io(format!("reading segment {}", at.segment_first_seq), e))
    }

    fn next_segment(&self, at: Loc) -> Option<Loc> {
        let i = self.log.index(at.segment_first_seq)?;
        let next = self.log.segments.get(i + 1)?;
        Some(Loc {
            segment_first_seq: next.first_seq,
            off: FILE_HEADER_BYTES,
        })
    }

    fn resync(&mut self, at: Loc, seq_min: u64) -> Result<Loc> {
        let Some(i) = self.log.index(at.segment_first_seq) else {
            return Ok(at);
        };
        if self.log.is_last(i) {
            // The scan reads the file: staged bytes must be in it.
            self.log.flush_staged()?;
        }
        let log = &*self.log;
        let seg = &log.segments[i];
        let limit = log.data_end(i);
        let seq_max = match log.segments.get(i + 1) {
            Some(next) => next.first_seq.saturating_sub(1),
            None => self.next_seq.saturating_sub(1),
        };
        let err = |e| Error::io(format!("reading segment {}", seg.path.display()), e);
        let file = log.file(i).map_err(err)?;
        let found =
            segment::resync(file, seg.seed, at.off + 1, limit, seq_min, seq_max).map_err(err)?;
        tracing::error!(path = %seg.path.display(), offset = at.off, "damaged record; skipping to the next valid one");
        Ok(Loc {
            segment_first_seq: at.segment_first_seq,
            off: found.map_or(limit, |(off, _)| off),
        })
    }

    fn is_crash_hole(&mut self, at: Loc, in_batch: bool) -> Result<bool> {
        let Some(i) = self.log.index(at.segment_first_seq) else {
            return Ok(false);
        };
        if self.log.is_last(i) {
            self.log.flush_staged()?;
        }
        let log = &*self.log;
        let seg = &log.segments[i];
        let err = |e| Error::io(format!("reading segment {}", seg.path.display()), e);
        let file = log.file(i).map_err(err)?;
        let hole = segment::is_crash_hole(file, seg.seed, at.off, log.data_end(i), in_batch)
            .map_err(err)?;
        if hole && !log.is_last(i) {
            // Expected after an OS crash, not damage: a warning (see docs/storage.md).
            tracing::warn!(path = %seg.path.display(), offset = at.off, "a page an OS crash kept from the disk; the rest of this segment was never fsync'ed and is skipped");
        }
        Ok(hole)
    }

    fn relocate(&mut self, _at: Loc, seq_min: u64) -> Result<Option<Loc>> {
        // The segment was deleted: every seq in it is confirmed.
        self.log.flush_staged()?;
        let loc = self
            .log
            .locate(self.next_seq, seq_min)
            .map_err(|e| Error::io("locating a position in a queue", e))?;
        Ok(Some(loc))
    }
}

/// The payload of a whole record, copied out of the mapping or the read buffer.
pub(crate) fn payload_of(record: &[u8]) -> Bytes {
    Bytes::copy_from_slice(&record[RECORD_HEADER_BYTES..])
}

/// A segment read's outcome as a [`ReadAt`], the payload copied.
pub(crate) fn found_to_read_at(found: Found<'_>) -> ReadAt {
    match found {
        Found::Record(h, rec) => ReadAt::Rec(h, payload_of(rec)),
        Found::End => ReadAt::End,
        Found::Bad => ReadAt::Bad,
    }
}

/// Creates the segment file starting at `first_seq` (replacing any file of that name)
/// with its header written, and the writer for it.
pub(super) fn create_segment(
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
