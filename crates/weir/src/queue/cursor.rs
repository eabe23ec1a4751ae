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

use super::log::ReadAt;

/// Segments a cursor walks.
pub(crate) trait Walk {
    /// Reads the record at `at`.
    fn read(&mut self, rb: &mut ReadBuf, at: Loc) -> Result<ReadAt>;
    /// Where the segment after the one `at` is in starts; `None` after the last.
    fn next_segment(&self, at: Loc) -> Option<Loc>;
    /// Where reading resumes after the damaged record at `at`: the next valid record
    /// of the segment with a seq from `seq_min` on, or the end of the segment.
    fn resync(&mut self, at: Loc, seq_min: u64) -> Result<Loc>;
    /// Where the first record with a seq from `seq_min` on is, now that the segment of
    /// `at` is gone; `None` when there is nothing after it.
    fn relocate(&mut self, at: Loc, seq_min: u64) -> Result<Option<Loc>>;
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
    rb: &mut ReadBuf,
    seq_min: u64,
) -> Result<Step> {
    loop {
        match walk.read(rb, *at)? {
            ReadAt::Rec(header, data) => {
                let next = Loc {
                    seg: at.seg,
                    off: at.off + header.record_bytes(),
                };
                debug_assert!(next.off > at.off);
                if header.seq < seq_min {
                    *at = next;
                    continue;
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
                let resumed = walk.resync(*at, seq_min)?;
                assert!(
                    resumed.seg == at.seg && resumed.off > at.off,
                    "a resync moves forward in its segment"
                );
                rb.clear();
                *at = resumed;
            }
            ReadAt::Missing => {
                rb.clear();
                match walk.relocate(*at, seq_min)? {
                    Some(loc) if loc != *at => *at = loc,
                    _ => return Ok(Step::End),
                }
            }
        }
    }
}
