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

/// Mapping window of the segment being written: bounds the RSS the writer adds.
pub(super) const WRITE_WINDOW_BYTES: u64 = 256 * 1024;

/// Reads the record at `loc`, from the writer's mapping when it is there (no system
/// call), else through the read-ahead buffer. `Ok(None)` at the end of valid data.
/// `Err(Ok(()))`-like damage is reported as `ReadAt::Bad`.
pub(super) enum ReadAt {
    Rec(RecordHeader, Bytes),
    End,
    Bad,
    /// The segment is gone (deleted): the position must be looked up again.
    Missing,
}

pub(super) fn seg_index(segments: &VecDeque<Segment>, first_seq: u64) -> Option<usize> {
    let i = segments.partition_point(|s| s.first_seq < first_seq);
    (i < segments.len() && segments[i].first_seq == first_seq).then_some(i)
}

pub(super) fn read_at(
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
pub(super) fn seg_file<'a>(
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

/// Where the first record with seq ≥ `seq` starts (the tail when there is none).
pub(super) fn locate_in(
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
pub(super) fn span_payload_bytes(
    segments: &VecDeque<Segment>,
    writer: &MapFile,
    loc: Loc,
    items: u64,
) -> u64 {
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
pub(super) fn header_at(
    segments: &VecDeque<Segment>,
    writer: &MapFile,
    loc: Loc,
) -> Option<RecordHeader> {
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
