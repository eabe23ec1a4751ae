//! The one walk over a log: a cursor that steps from record to record, over segment
//! ends, damaged records and deleted segments, written once for every reader of
//! records (a reader's next item, a queue's floor, an iterator).
//!
//! What is walked is a [`Walk`]: the live log under the queue's lock
//! (`log.rs`), or the snapshot an iterator reads without it (`iter.rs`). Each says how
//! to read a record, where the next segment starts, how to resume after damage and
//! where to go when a segment is gone; [`step`] decides when to do which.

use bytes::Bytes;

use crate::error::Result;
use crate::frame::RecordHeader;
use crate::segment::{Loc, ReadBuf};

/// What reading at a position found.
pub(crate) enum ReadAt {
    /// A whole, intact record and its payload.
    Rec(RecordHeader, Bytes),
    /// The end of the segment's valid data.
    End,
    /// Damage: a record that does not check out.
    Bad,
    /// The segment is gone (deleted): the position must be looked up again.
    Missing,
}

/// Segments a cursor walks.
pub(crate) trait Walk {
    /// Reads the record at `at`.
    fn read(&mut self, read_buf: &mut ReadBuf, at: Loc) -> Result<ReadAt>;
    /// Where the segment after the one `at` is in starts; `None` after the last.
    fn next_segment(&self, at: Loc) -> Option<Loc>;
    /// Where reading resumes after the damaged record at `at`: the next valid record
    /// of the segment with a seq from `seq_min` on, or the end of the segment.
    fn resync(&mut self, at: Loc, seq_min: u64) -> Result<Loc>;
    /// Where the first record with a seq from `seq_min` on is, now that the segment of
    /// `at` is gone; `None` when there is nothing after it.
    fn relocate(&mut self, at: Loc, seq_min: u64) -> Result<Option<Loc>>;
    /// Whether the damage at `at` is a hole a crash left rather than damage (a bit
    /// flip): see `segment::is_crash_hole`; `in_batch` when it broke a batch off.
    fn is_crash_hole(&mut self, at: Loc, in_batch: bool) -> Result<bool>;
}

/// What a step found.
pub(crate) enum Step {
    /// An intact record with a seq from `seq_min` on, at `at`; `next` is where the
    /// record after it starts. The cursor is left at `at`.
    Record {
        header: RecordHeader,
        data: Bytes,
        at: Loc,
        next: Loc,
    },
    /// Nothing is written after the cursor (yet).
    End,
}

/// Moves `at` to the next intact record with a seq from `seq_min` on and returns it:
/// records with a lower seq (a first segment holds items already gone) are stepped
/// over, a segment's end leads to the next segment, a damaged record to the next valid
/// one (the records in between are the caller's to count as lost, from the gap in
/// seqs), a deleted segment to where `seq_min` is now.
pub(crate) fn step<W: Walk + ?Sized>(
    walk: &mut W,
    at: &mut Loc,
    read_buf: &mut ReadBuf,
    seq_min: u64,
) -> Result<Step> {
    loop {
        match walk.read(read_buf, *at)? {
            ReadAt::Rec(header, data) => {
                let next = Loc {
                    segment_first_seq: at.segment_first_seq,
                    off: at.off + header.record_bytes(),
                };
                debug_assert!(next.off > at.off);
                if header.seq < seq_min {
                    *at = next;
                    continue;
                }
                if header.more && !read_buf.batch_known_whole(*at) {
                    if let Some(start) = check_batch(walk, read_buf, next, header.seq)? {
                        *at = start;
                        continue;
                    }
                }
                return Ok(Step::Record {
                    header,
                    data,
                    at: *at,
                    next,
                });
            }
            ReadAt::End => match walk.next_segment(*at) {
                Some(start) => *at = start,
                None => return Ok(Step::End),
            },
            ReadAt::Bad => {
                // A hole a crash left in a segment sealed before its fsync: the rest
                // of the segment was never fsync'ed either, and may hold part of a
                // batch whose start the hole took. Skipped whole (the caller counts
                // the seqs as lost).
                if let Some(start) = past_crash_hole(walk, read_buf, *at, false)? {
                    *at = start;
                    continue;
                }
                let resumed = walk.resync(*at, seq_min)?;
                assert!(
                    resumed.segment_first_seq == at.segment_first_seq && resumed.off > at.off,
                    "a resync moves forward in its segment"
                );
                read_buf.clear();
                *at = resumed;
            }
            ReadAt::Missing => {
                read_buf.clear();
                match walk.relocate(*at, seq_min)? {
                    Some(loc) if loc != *at => *at = loc,
                    _ => return Ok(Step::End),
                }
            }
        }
    }
}

/// Checks that the batch of record `seq` ends intact (`next` is the record after
/// it). `Some(position)` to read from instead when it does not and
/// the break is a crash's: a power cut kept part of the batch in a segment sealed
/// before its fsync, and nothing from the break to the segment's end was fsync'ed (an
/// fsync would have written the hole too), so none of it was acknowledged under
/// `synced`; skipping it keeps the batch all or none. A damaged record inside a batch
/// (a bit flip) loses that record only, as anywhere else: `None`, deliver.
fn check_batch<W: Walk + ?Sized>(
    walk: &mut W,
    read_buf: &mut ReadBuf,
    next: Loc,
    seq: u64,
) -> Result<Option<Loc>> {
    match batch_end(walk, read_buf, next, seq + 1)? {
        Ok(end) => {
            read_buf.mark_batch_whole(end);
            Ok(None)
        }
        Err(cut_at) => past_crash_hole(walk, read_buf, cut_at, true),
    }
}

/// Where reading goes on when the damage at `at` is a hole a crash left and a segment
/// follows: the next segment's start. `None` otherwise (damage, or the last segment,
/// whose holes recovery has cut already).
fn past_crash_hole<W: Walk + ?Sized>(
    walk: &mut W,
    read_buf: &mut ReadBuf,
    at: Loc,
    in_batch: bool,
) -> Result<Option<Loc>> {
    if !walk.is_crash_hole(at, in_batch)? {
        return Ok(None);
    }
    let next = walk.next_segment(at);
    if next.is_some() {
        read_buf.clear();
    }
    Ok(next)
}

/// Where the batch whose record `seq` starts at `at` ends: `Ok` with the position
/// after its last record (the first without the "more" bit), or `Err` with where it
/// breaks off (a damaged record, a gap in seqs, the end of the segment). Batches never
/// span segments.
fn batch_end<W: Walk + ?Sized>(
    walk: &mut W,
    read_buf: &mut ReadBuf,
    mut at: Loc,
    mut seq: u64,
) -> Result<std::result::Result<Loc, Loc>> {
    loop {
        match walk.read(read_buf, at)? {
            ReadAt::Rec(header, _) if header.seq == seq => {
                at.off += header.record_bytes();
                if !header.more {
                    return Ok(Ok(at));
                }
                seq += 1;
            }
            _ => return Ok(Err(at)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::error::Error;
    use crate::frame::RECORD_HEADER_BYTES;
    use crate::segment::FILE_HEADER_BYTES;

    use super::*;

    /// What a scripted segment holds at an offset.
    #[derive(Clone, Copy)]
    enum Slot {
        Rec(u64),
        Bad,
    }

    /// Segments as maps from offset to slot; a segment absent from `gone` is there.
    #[derive(Default)]
    struct Script {
        segments: BTreeMap<u64, BTreeMap<u64, Slot>>,
        gone: Vec<u64>,
        /// Where a resync lands, by the damaged position.
        resync_to: BTreeMap<(u64, u64), u64>,
        /// Where a lost segment's readers go.
        relocate_to: Option<Loc>,
    }

    fn header(seq: u64) -> RecordHeader {
        RecordHeader {
            len: 10,
            crc: 0,
            seq,
            enqueued_at_ms: 0,
            expires_at_ms: 0,
            flags: 0,
            more: false,
            job: false,
        }
    }

    const RECORD: u64 = RECORD_HEADER_BYTES as u64 + 10;

    impl Script {
        /// A segment starting at `first` with records of `seqs` (or damage) in order.
        fn segment(mut self, first: u64, slots: &[Slot]) -> Script {
            let mut at = FILE_HEADER_BYTES;
            let map = self.segments.entry(first).or_default();
            for slot in slots {
                map.insert(at, *slot);
                at += RECORD;
            }
            self
        }
    }

    impl Walk for Script {
        fn is_crash_hole(&mut self, _at: Loc, _in_batch: bool) -> Result<bool> {
            Ok(false)
        }

        fn read(&mut self, _rb: &mut ReadBuf, at: Loc) -> Result<ReadAt> {
            if self.gone.contains(&at.segment_first_seq) {
                return Ok(ReadAt::Missing);
            }
            let Some(seg) = self.segments.get(&at.segment_first_seq) else {
                return Err(Error::InvalidArgument(format!(
                    "no segment {}",
                    at.segment_first_seq
                )));
            };
            Ok(match seg.get(&at.off) {
                Some(Slot::Rec(seq)) => {
                    ReadAt::Rec(header(*seq), Bytes::from_static(b"0123456789"))
                }
                Some(Slot::Bad) => ReadAt::Bad,
                None => ReadAt::End,
            })
        }

        fn next_segment(&self, at: Loc) -> Option<Loc> {
            let (&first, _) = self.segments.range(at.segment_first_seq + 1..).next()?;
            Some(Loc {
                segment_first_seq: first,
                off: FILE_HEADER_BYTES,
            })
        }

        fn resync(&mut self, at: Loc, _seq_min: u64) -> Result<Loc> {
            let off = self
                .resync_to
                .get(&(at.segment_first_seq, at.off))
                .copied()
                .unwrap_or(u64::MAX);
            Ok(Loc {
                segment_first_seq: at.segment_first_seq,
                off,
            })
        }

        fn relocate(&mut self, _at: Loc, _seq_min: u64) -> Result<Option<Loc>> {
            Ok(self.relocate_to)
        }
    }

    fn start(segment_first_seq: u64) -> Loc {
        Loc {
            segment_first_seq,
            off: FILE_HEADER_BYTES,
        }
    }

    /// Steps until the end; the seqs met.
    fn walk_all(script: &mut Script, mut at: Loc, seq_min: u64) -> Vec<u64> {
        let mut read_buf = ReadBuf::default();
        let mut seqs = Vec::new();
        let mut seq_min = seq_min;
        loop {
            match step(script, &mut at, &mut read_buf, seq_min).unwrap() {
                Step::Record { header, next, .. } => {
                    seqs.push(header.seq);
                    seq_min = header.seq + 1;
                    at = next;
                }
                Step::End => return seqs,
            }
        }
    }

    #[test]
    fn a_cursor_crosses_segment_ends() {
        let mut s = Script::default()
            .segment(1, &[Slot::Rec(1), Slot::Rec(2)])
            .segment(3, &[Slot::Rec(3)]);
        assert_eq!(walk_all(&mut s, start(1), 1), [1, 2, 3]);
    }

    #[test]
    fn records_below_the_seq_wanted_are_stepped_over() {
        let mut s = Script::default().segment(1, &[Slot::Rec(1), Slot::Rec(2), Slot::Rec(3)]);
        assert_eq!(walk_all(&mut s, start(1), 3), [3]);
    }

    #[test]
    fn a_damaged_record_resumes_where_resync_finds_the_next_valid_one() {
        let mut s =
            Script::default().segment(1, &[Slot::Rec(1), Slot::Bad, Slot::Rec(3), Slot::Rec(4)]);
        let bad = FILE_HEADER_BYTES + RECORD;
        s.resync_to.insert((1, bad), bad + RECORD);
        // 2 is lost: the caller sees the gap between 1 and 3.
        assert_eq!(walk_all(&mut s, start(1), 1), [1, 3, 4]);
    }

    #[test]
    fn damage_with_nothing_valid_after_it_ends_its_segment() {
        let mut s = Script::default()
            .segment(1, &[Slot::Rec(1), Slot::Bad])
            .segment(5, &[Slot::Rec(5)]);
        // No resync target: it lands past the segment's end.
        assert_eq!(walk_all(&mut s, start(1), 1), [1, 5]);
    }

    #[test]
    fn a_deleted_segment_sends_the_cursor_where_its_seq_is_now() {
        let mut s = Script::default()
            .segment(1, &[Slot::Rec(1)])
            .segment(2, &[Slot::Rec(2), Slot::Rec(3)]);
        s.gone.push(1);
        s.relocate_to = Some(start(2));
        assert_eq!(walk_all(&mut s, start(1), 2), [2, 3]);
    }

    #[test]
    fn a_deleted_segment_with_nowhere_to_go_is_the_end() {
        let mut s = Script::default().segment(1, &[Slot::Rec(1)]);
        s.gone.push(1);
        assert!(walk_all(&mut s, start(1), 1).is_empty());
        // Relocated to where it already is: also the end, not a loop.
        s.relocate_to = Some(start(1));
        assert!(walk_all(&mut s, start(1), 1).is_empty());
    }

    #[test]
    fn a_step_leaves_the_cursor_at_the_record_it_returns() {
        let mut s = Script::default().segment(1, &[Slot::Rec(7), Slot::Rec(8)]);
        let mut at = start(1);
        let mut read_buf = ReadBuf::default();
        let Step::Record {
            at: found, next, ..
        } = step(&mut s, &mut at, &mut read_buf, 7).unwrap()
        else {
            panic!("a record");
        };
        assert_eq!((at, found), (start(1), start(1)));
        assert_eq!(next.off, FILE_HEADER_BYTES + RECORD);
    }

    #[test]
    fn a_read_error_is_returned() {
        let mut s = Script::default();
        let mut at = start(9);
        let mut read_buf = ReadBuf::default();
        assert!(step(&mut s, &mut at, &mut read_buf, 1).is_err());
    }
}
