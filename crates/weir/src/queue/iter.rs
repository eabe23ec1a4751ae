//! Iteration over every kept item of a queue, in order, without consuming (popout's
//! iterator).
//!
//! The iterator takes a snapshot of the segment list when it is made and reads the
//! files itself, never holding the queue's lock: through the queue's descriptors where
//! they were open (kept open by the iterator, so those segments stay readable if
//! deleted meanwhile), else opening each segment when it gets there (one deleted
//! before that had been consumed by every reader: it is skipped). Items appended after
//! it was made are not included.

use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::item::Item;
use crate::segment::{self, Loc, ReadBuf, FILE_HEADER_BYTES, SCAN_CHUNK_BYTES};

use super::cursor::ReadAt;
use super::cursor::{self, Step, Walk};
use super::expire::is_expired;
use super::log::found_to_read_at;

/// Iterator over a queue's kept items; see [`crate::Queue::iter`]. Expired items are
/// skipped; damaged records are skipped (with an error logged).
pub struct Iter {
    snapshot: Snapshot,
    /// Where the next record is read.
    at: Loc,
    /// Next seq expected; items below it are not kept any more.
    seq: u64,
    now_ms: u64,
    max_age: Option<Duration>,
    read_buf: ReadBuf,
    failed: bool,
}

/// The segments from the first one needed, as they were when the iterator was made.
struct Snapshot {
    segments: Vec<IterSegment>,
    /// Seq at which iteration stops (the queue's next seq when it was made).
    stop: u64,
}

/// A segment as an iterator sees it: a snapshot taken under the queue's lock.
pub(crate) struct IterSegment {
    pub first_seq: u64,
    pub seed: u32,
    pub path: PathBuf,
    /// Opened when the iterator gets there, unless the queue had it open.
    pub file: Option<Arc<File>>,
    /// End of the valid data when the snapshot was taken.
    pub end: u64,
}

impl Iter {
    /// Iterates from `off` in the first of `segments`, the items with seqs from
    /// `start` up to `stop`.
    pub(crate) fn new(
        segments: Vec<IterSegment>,
        off: u64,
        start: u64,
        stop: u64,
        now_ms: u64,
        max_age: Option<Duration>,
    ) -> Iter {
        let at = Loc {
            segment_first_seq: segments.first().map_or(stop, |s| s.first_seq),
            off,
        };
        Iter {
            snapshot: Snapshot { segments, stop },
            at,
            seq: start,
            now_ms,
            max_age,
            read_buf: ReadBuf::default(),
            failed: false,
        }
    }
}

impl Iterator for Iter {
    type Item = Result<Item>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.failed && self.seq < self.snapshot.stop {
            let step = cursor::step(
                &mut self.snapshot,
                &mut self.at,
                &mut self.read_buf,
                self.seq,
            );
            let (header, data, next) = match step {
                Ok(Step::Record {
                    header, data, next, ..
                }) => (header, data, next),
                Ok(Step::End) => return None,
                Err(e) => {
                    self.failed = true;
                    return Some(Err(e));
                }
            };
            self.at = next;
            self.seq = header.seq + 1;
            if header.seq >= self.snapshot.stop {
                return None;
            }
            if is_expired(&header, self.now_ms, self.max_age) {
                continue;
            }
            return Some(Ok(crate::frame::item(&header, data)));
        }
        None
    }
}

impl Snapshot {
    fn index(&self, first_seq: u64) -> Option<usize> {
        let i = self.segments.partition_point(|s| s.first_seq < first_seq);
        (i < self.segments.len() && self.segments[i].first_seq == first_seq).then_some(i)
    }

    /// Segment `i`'s descriptor, opened on first use; `None` when the file is gone
    /// (consumed by every reader and deleted since the snapshot).
    fn file(&mut self, i: usize) -> Result<Option<Arc<File>>> {
        let seg = &mut self.segments[i];
        if let Some(file) = &seg.file {
            return Ok(Some(Arc::clone(file)));
        }
        match File::open(&seg.path) {
            Ok(file) => Ok(Some(Arc::clone(seg.file.insert(Arc::new(file))))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(failed(e)),
        }
    }
}

fn failed(e: io::Error) -> Error {
    Error::io("iterating a queue", e)
}

impl Walk for Snapshot {
    fn read(&mut self, read_buf: &mut ReadBuf, at: Loc) -> Result<ReadAt> {
        let Some(i) = self.index(at.segment_first_seq) else {
            return Ok(ReadAt::Missing);
        };
        let Some(file) = self.file(i)? else {
            return Ok(ReadAt::Missing);
        };
        let seg = &self.segments[i];
        let found = segment::read_record(
            read_buf,
            &file,
            seg.first_seq,
            seg.seed,
            at.off,
            seg.end,
            SCAN_CHUNK_BYTES,
        )
        .map_err(failed)?;
        Ok(found_to_read_at(found))
    }

    fn next_segment(&self, at: Loc) -> Option<Loc> {
        let i = self
            .segments
            .partition_point(|s| s.first_seq <= at.segment_first_seq);
        self.segments.get(i).map(|s| Loc {
            segment_first_seq: s.first_seq,
            off: FILE_HEADER_BYTES,
        })
    }

    fn resync(&mut self, at: Loc, seq_min: u64) -> Result<Loc> {
        let i = self.index(at.segment_first_seq);
        let file = match i {
            Some(i) => self.file(i)?,
            None => None,
        };
        let (Some(i), Some(file)) = (i, file) else {
            return Ok(Loc {
                segment_first_seq: at.segment_first_seq,
                off: at.off + 1,
            });
        };
        let seg = &self.segments[i];
        let seq_max = self.stop.saturating_sub(1);
        let found = segment::resync(&file, seg.seed, at.off + 1, seg.end, seq_min, seq_max)
            .map_err(failed)?;
        tracing::error!(
            segment = seg.first_seq,
            offset = at.off,
            "damaged record skipped while iterating"
        );
        Ok(Loc {
            segment_first_seq: at.segment_first_seq,
            off: found.map_or(seg.end.max(at.off + 1), |(off, _)| off),
        })
    }

    fn is_crash_hole(&mut self, at: Loc, in_batch: bool) -> Result<bool> {
        let Some(i) = self.index(at.segment_first_seq) else {
            return Ok(false);
        };
        let Some(file) = self.file(i)? else {
            return Ok(false);
        };
        let seg = &self.segments[i];
        segment::is_crash_hole(&file, seg.seed, at.off, seg.end, in_batch).map_err(failed)
    }

    fn relocate(&mut self, at: Loc, _seq_min: u64) -> Result<Option<Loc>> {
        // Deleted since the snapshot: every item in it was consumed by every reader.
        Ok(self.next_segment(at))
    }
}
