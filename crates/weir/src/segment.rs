//! Segment files: the queue's items, in order, as CRC-framed records.
//!
//! A segment is named after the seq of its first record (`00000000000000000001.seg`)
//! and starts with a 32-byte header (magic, first seq, the record seed three times,
//! CRC). Records follow back to back (see `frame.rs`, which says why records carry a
//! seed). Only the last segment of a queue is written; when it passes the
//! queue's `segment_size_bytes` it is sealed (cut to its exact length) and a new one is
//! started. Space is reclaimed by deleting whole segments that every reader is done with.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::file_cell::{FileCell, FilesBudget};

use crate::frame::{decode_header, verify, RecordHeader, RECORD_HEADER_BYTES, SEQ_MAX};

pub(crate) const FILE_HEADER_BYTES: u64 = 32;
pub(crate) const SEGMENT_MAGIC: &[u8; 8] = b"WEIRSEG1";
pub(crate) const JOURNAL_MAGIC: &[u8; 8] = b"WEIRJRN1";

/// How much a reader reads ahead from a segment in one pread.
pub(crate) const READ_AHEAD_BYTES: usize = 64 * 1024;
/// How much a scan (open, resync, iteration) reads at once.
pub(crate) const SCAN_CHUNK_BYTES: usize = 1024 * 1024;

/// A file header: magic, a u64 (first seq of a segment, generation of a journal), CRC.
pub(crate) fn encode_file_header(magic: &[u8; 8], value: u64) -> [u8; FILE_HEADER_BYTES as usize] {
    let mut h = [0u8; FILE_HEADER_BYTES as usize];
    h[0..8].copy_from_slice(magic);
    h[8..16].copy_from_slice(&value.to_le_bytes());
    let crc = crc32c::crc32c(&h[0..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

/// A segment's header: magic, first seq, then the record seed three times, so that a
/// damaged header still yields its seed (by a bitwise vote of the copies): without the
/// seed no record of the segment can be verified.
pub(crate) fn encode_segment_header(first_seq: u64, seed: u32) -> [u8; FILE_HEADER_BYTES as usize] {
    let mut h = [0u8; FILE_HEADER_BYTES as usize];
    h[0..8].copy_from_slice(SEGMENT_MAGIC);
    h[8..16].copy_from_slice(&first_seq.to_le_bytes());
    for copy in 0..3 {
        h[16 + 4 * copy..20 + 4 * copy].copy_from_slice(&seed.to_le_bytes());
    }
    let crc = crc32c::crc32c(&h[0..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Whether a damaged header is what a crash while writing it leaves, rather than
/// damage: the bytes that were written are the start of the header this segment
/// would have (its name's first seq, the seed of its first copy), the rest zero
/// (bytes past the end of a short file count as zero).
pub(crate) fn is_torn_header(bytes: &[u8], first_seq: u64) -> bool {
    let mut header = [0u8; FILE_HEADER_BYTES as usize];
    let n = bytes.len().min(header.len());
    header[..n].copy_from_slice(&bytes[..n]);
    let seed = u32::from_le_bytes([header[16], header[17], header[18], header[19]]);
    let expected = encode_segment_header(first_seq, seed);
    let written = header
        .iter()
        .zip(&expected)
        .take_while(|(a, b)| a == b)
        .count();
    header[written..].iter().all(|&b| b == 0)
}

/// What a segment's header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentHeader {
    /// The header is whole and names `first_seq`.
    pub intact: bool,
    /// The record seed: from an intact header, else the bitwise majority of its three
    /// copies (0, the legacy "no seed", when the header bytes are missing).
    pub seed: u32,
}

/// Decodes the header of the segment named `first_seq` from the bytes read at its
/// start (fewer than a header when the file is shorter).
pub(crate) fn decode_segment_header(bytes: &[u8], first_seq: u64) -> SegmentHeader {
    if bytes.len() < FILE_HEADER_BYTES as usize {
        return SegmentHeader {
            intact: false,
            seed: 0,
        };
    }
    let copy = |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    let (a, b, c) = (copy(16), copy(20), copy(24));
    let intact = decode_file_header(SEGMENT_MAGIC, bytes) == Some(first_seq);
    let seed = if intact {
        a
    } else {
        (a & b) | (a & c) | (b & c)
    };
    SegmentHeader { intact, seed }
}

/// The u64 of a valid file header with `magic`, or `None`.
pub(crate) fn decode_file_header(magic: &[u8; 8], bytes: &[u8]) -> Option<u64> {
    if bytes.len() < FILE_HEADER_BYTES as usize || &bytes[0..8] != magic {
        return None;
    }
    let crc = u32::from_le_bytes([bytes[28], bytes[29], bytes[30], bytes[31]]);
    if crc32c::crc32c(&bytes[0..28]) != crc {
        return None;
    }
    let mut v = [0u8; 8];
    v.copy_from_slice(&bytes[8..16]);
    Some(u64::from_le_bytes(v))
}

pub(crate) fn segment_file_name(first_seq: u64) -> String {
    format!("{first_seq:020}.seg")
}

pub(crate) fn parse_segment_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".seg")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&s| s > 0)
}

/// One segment file as the queue knows it.
pub(crate) struct Segment {
    pub first_seq: u64,
    /// The seed of its records' checksums (see `frame.rs`).
    pub seed: u32,
    pub path: PathBuf,
    /// Opened when first read, closed when no reader needs it (see
    /// [`Segment::close_file`]): a deep backlog of sealed segments holds no descriptor
    /// until a reader reaches it. The segment being written is read through the
    /// writer's descriptor instead.
    file: FileCell,
    /// End of the valid data. For the active segment it follows the writer.
    pub end: u64,
}

impl Segment {
    pub fn new(
        first_seq: u64,
        seed: u32,
        path: PathBuf,
        end: u64,
        tally: Option<Arc<FilesBudget>>,
    ) -> Segment {
        Segment {
            first_seq,
            seed,
            // Read-only: only the writer writes.
            file: FileCell::closed(&path, false, tally),
            path,
            end,
        }
    }

    /// The segment's file, opened on first use.
    pub fn file(&self) -> io::Result<&Arc<File>> {
        self.file.get()
    }

    /// The descriptor, if one is open now.
    pub fn file_if_open(&self) -> Option<&Arc<File>> {
        self.file.get_if_open()
    }

    pub fn is_open(&self) -> bool {
        self.file.is_open()
    }

    /// Closes the descriptor, if one is open; the next read opens it again. Returns
    /// whether one was open.
    pub fn close_file(&mut self) -> bool {
        self.file.close()
    }
}

/// Where a record starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Loc {
    /// First seq of the segment (its name).
    pub segment_first_seq: u64,
    pub off: u64,
}

/// A read-ahead buffer over one segment at a time: sequential reads cost one pread per
/// `READ_AHEAD_BYTES`, not one per record.
#[derive(Default)]
pub(crate) struct ReadBuf {
    segment_first_seq: u64,
    start: u64,
    data: Vec<u8>,
    /// The batch around the cursor was found whole up to here (segment, offset of the
    /// record after its last): its records are delivered without looking again.
    batch_whole_until: Option<(u64, u64)>,
}

impl ReadBuf {
    /// The bytes `[off, off+len)` of segment `seg`, reading ahead up to `limit` (the
    /// segment's valid end). `Ok(None)` when the range passes `limit` or the file ends.
    pub fn get(
        &mut self,
        file: &File,
        seg: u64,
        off: u64,
        len: u64,
        limit: u64,
        ahead: usize,
    ) -> io::Result<Option<&[u8]>> {
        if off + len > limit {
            return Ok(None);
        }
        let have = self.segment_first_seq == seg
            && !self.data.is_empty()
            && off >= self.start
            && off + len <= self.start + self.data.len() as u64;
        if !have {
            let want = (len as usize).max(ahead).min((limit - off) as usize);
            if self.data.capacity() > 4 * ahead.max(len as usize) {
                self.data = Vec::new(); // give back a buffer grown for one huge item
            }
            self.data.resize(want, 0);
            let mut filled = 0;
            while filled < want {
                match file.read_at(&mut self.data[filled..], off + filled as u64) {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        self.data.clear();
                        return Err(e);
                    }
                }
            }
            self.data.truncate(filled);
            self.segment_first_seq = seg;
            self.start = off;
            if (filled as u64) < len {
                return Ok(None);
            }
        }
        let s = (off - self.start) as usize;
        Ok(Some(&self.data[s..s + len as usize]))
    }

    /// Forgets what it holds (after the segment it covers changed under it).
    pub fn clear(&mut self) {
        self.data.clear();
        self.batch_whole_until = None;
    }

    /// Whether the record at `at` belongs to a batch already found whole.
    pub fn batch_known_whole(&self, at: Loc) -> bool {
        self.batch_whole_until
            .is_some_and(|(seg, end)| seg == at.segment_first_seq && at.off < end)
    }

    /// Records that the batch ending before `end` is whole.
    pub fn mark_batch_whole(&mut self, end: Loc) {
        self.batch_whole_until = Some((end.segment_first_seq, end.off));
    }
}

/// What lies at a position of a segment.
pub(crate) enum Found<'a> {
    /// A valid record: header and the whole record bytes.
    Record(RecordHeader, &'a [u8]),
    /// The valid data ends here.
    End,
    /// Bytes that are not a valid record.
    Bad,
}

/// Reads the record at `off` of a segment whose valid data ends at `limit`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn read_record<'a>(
    read_buf: &'a mut ReadBuf,
    file: &File,
    seg: u64,
    seed: u32,
    off: u64,
    limit: u64,
    ahead: usize,
) -> io::Result<Found<'a>> {
    if off >= limit {
        return Ok(Found::End);
    }
    let header = match read_buf.get(file, seg, off, RECORD_HEADER_BYTES as u64, limit, ahead)? {
        None => return Ok(Found::Bad),
        Some(bytes) => match decode_header(bytes) {
            None => return Ok(Found::Bad),
            Some(h) => h,
        },
    };
    match read_buf.get(file, seg, off, header.record_bytes(), limit, ahead)? {
        None => Ok(Found::Bad),
        Some(record) if verify(&header, record, seed) => Ok(Found::Record(header, record)),
        Some(_) => Ok(Found::Bad),
    }
}

/// Finds the next valid record at or after `from` (and before `limit`) whose seq is in
/// `seq_min..=seq_max`: how reading resumes after damage in the middle of a segment.
pub(crate) fn resync(
    file: &File,
    seed: u32,
    from: u64,
    limit: u64,
    seq_min: u64,
    seq_max: u64,
) -> io::Result<Option<(u64, RecordHeader)>> {
    let mut chunk = vec![0u8; SCAN_CHUNK_BYTES + RECORD_HEADER_BYTES];
    let mut record = Vec::new();
    let mut base = from;
    while base < limit {
        let want = ((limit - base) as usize).min(chunk.len());
        let n = read_full_at(file, &mut chunk[..want], base)?;
        if n < RECORD_HEADER_BYTES {
            return Ok(None);
        }
        let last = n - RECORD_HEADER_BYTES;
        for i in 0..=last {
            let Some(h) = decode_header(&chunk[i..i + RECORD_HEADER_BYTES]) else {
                continue;
            };
            let at = base + i as u64;
            if h.seq < seq_min || h.seq > seq_max || at + h.record_bytes() > limit {
                continue;
            }
            record.resize(h.record_bytes() as usize, 0);
            if read_full_at(file, &mut record, at)? == record.len() && verify(&h, &record, seed) {
                return Ok(Some((at, h)));
            }
        }
        base += (last + 1) as u64;
    }
    Ok(None)
}

/// What a scan of a whole segment found.
pub(crate) struct Scan {
    /// End of the last valid record.
    pub end: u64,
    /// Seq after the last valid record (the segment's first seq when it has none).
    pub next_seq: u64,
    /// Records lost to damage found in the middle (a valid record followed them).
    pub damaged: bool,
    /// Records of a batch that a crash interrupted were cut.
    pub torn_batch: bool,
    /// Everything from `end` to the end of the file is zeroes: space reserved ahead
    /// of the data (a clean stop leaves it), nothing to cut.
    pub zero_tail: bool,
}

/// Granularity of the "never reached the disk" test: a sector. A page the kernel had
/// not written back when the OS crashed reads as zeroes (segments are preallocated,
/// and never rewritten), and a write torn by a power cut is torn at sector boundaries.
const SECTOR_BYTES: u64 = 512;

/// Scans a segment from its header to the end of its valid records, stepping over
/// damage when a valid record follows it. Used on the last segment at open.
///
/// Damage followed by nothing valid is a torn tail (the bytes a crash left behind the
/// last record that reached the disk): it is cut, and with it a batch it interrupted,
/// since batches are all or nothing. Damage followed by a valid record with a later
/// seq is damage in the middle (a bad disk): nothing may be cut there, because under
/// `synced` the later records may have been acknowledged; the scan steps over it, and
/// readers skip it (and count it) as they do in sealed segments.
///
/// One exception, inside a batch: after an OS crash the pages of a batch can reach the
/// disk out of order, leaving a hole with valid records after it. Such a hole reads as
/// zeroes, so damage inside a batch that spans a zeroed sector is taken for a crash:
/// the batch is cut with everything after it. Nothing after the hole can have been
/// fsync'ed (an fsync would have written the hole's page too), so this loses nothing
/// acknowledged, and keeps the batch all or nothing.
pub(crate) fn scan(file: &File, first_seq: u64, seed: u32, file_len: u64) -> io::Result<Scan> {
    let mut read_buf = ReadBuf::default();
    let mut off = FILE_HEADER_BYTES;
    let mut next_seq = first_seq;
    let mut end = FILE_HEADER_BYTES.min(file_len);
    let mut damaged = false;
    // Where the batch being read started, while its last record is not seen yet.
    let mut batch: Option<(u64, u64)> = None;
    loop {
        match read_record(
            &mut read_buf,
            file,
            first_seq,
            seed,
            off,
            file_len,
            SCAN_CHUNK_BYTES,
        )? {
            Found::Record(h, _) if h.seq >= next_seq => {
                if h.more && batch.is_none() {
                    batch = Some((off, h.seq));
                } else if !h.more {
                    batch = None;
                }
                off += h.record_bytes();
                next_seq = h.seq + 1;
                end = off;
            }
            Found::End => break,
            Found::Record(..) | Found::Bad => {
                if is_zero(file, off, file_len)? {
                    // The space reserved ahead of the data: nothing follows.
                    break;
                }
                let Some((at, _)) = resync(file, seed, off + 1, file_len, next_seq, SEQ_MAX)?
                else {
                    // Nothing valid follows: a torn tail.
                    break;
                };
                if head_is_zero(file, off, at)?
                    || (batch.is_some() && has_zero_sector(file, off, at)?)
                {
                    // A hole a crash left (see above and `head_is_zero`): what
                    // follows it was never fsync'ed; it is cut, batch and all.
                    break;
                }
                // Damage in the middle. A batch it hit is not cut: its records that
                // check out are kept like any others.
                damaged = true;
                batch = None;
                read_buf.clear();
                off = at;
            }
        }
    }
    let torn_batch = batch.is_some();
    if let Some((batch_off, batch_seq)) = batch {
        end = batch_off;
        next_seq = batch_seq;
    }
    let zero_tail = !torn_batch && is_zero(file, end, file_len)?;
    debug_assert!(end <= file_len.max(FILE_HEADER_BYTES) && next_seq >= first_seq);
    Ok(Scan {
        end,
        next_seq,
        damaged,
        torn_batch,
        zero_tail,
    })
}

/// Whether every byte is zero. Whole 64-byte blocks are OR-folded, which the compiler
/// turns into vector instructions, where a byte-by-byte search with an early exit is
/// not: every queue's open checks its last segment's reserved tail (256 KiB for a
/// fresh one), and a restart with 1,000 queues spent a tenth of its time here.
fn all_zero(bytes: &[u8]) -> bool {
    let mut blocks = bytes.chunks_exact(64);
    for block in &mut blocks {
        if block.iter().fold(0u8, |acc, &b| acc | b) != 0 {
            return false;
        }
    }
    blocks.remainder().iter().all(|&b| b == 0)
}

/// Whether bytes `[from, to)` of the file are all zeroes (or missing).
fn is_zero(file: &File, from: u64, to: u64) -> io::Result<bool> {
    let mut chunk = vec![0u8; SCAN_CHUNK_BYTES.min(to.saturating_sub(from) as usize)];
    let mut at = from;
    while at < to {
        let want = ((to - at) as usize).min(chunk.len());
        let n = read_full_at(file, &mut chunk[..want], at)?;
        if !all_zero(&chunk[..n]) {
            return Ok(false);
        }
        if n < want {
            return Ok(true);
        }
        at += n as u64;
    }
    Ok(true)
}

/// Whether an aligned sector that ends by `to` and holds `from` or follows it reads as
/// zeroes. The sector holding `from` counts: a hole can start before the first damaged
/// record (whose header is never all zeroes when it is intact).
fn has_zero_sector(file: &File, from: u64, to: u64) -> io::Result<bool> {
    let mut base = from / SECTOR_BYTES * SECTOR_BYTES;
    let chunk_bytes = (SCAN_CHUNK_BYTES as u64 / SECTOR_BYTES) * SECTOR_BYTES;
    let mut chunk = Vec::new();
    while base + SECTOR_BYTES <= to {
        let want = ((to - base) / SECTOR_BYTES * SECTOR_BYTES).min(chunk_bytes);
        chunk.resize(want as usize, 0);
        let n = read_full_at(file, &mut chunk, base)?;
        let whole = n as u64 / SECTOR_BYTES * SECTOR_BYTES;
        if chunk[..whole as usize]
            .chunks_exact(SECTOR_BYTES as usize)
            .any(|sector| sector.iter().all(|&b| b == 0))
        {
            return Ok(true);
        }
        if whole < want {
            return Ok(false); // the file ends here
        }
        base += want;
    }
    Ok(false)
}

/// Whether the damage at `from` is a hole a crash left, looking up to the next valid
/// record (or `limit`): the damaged record reads as zeroes from its start (see
/// [`head_is_zero`]), or, when `in_batch`, an aligned sector up to the next valid
/// record does (see [`scan`]).
pub(crate) fn is_crash_hole(
    file: &File,
    seed: u32,
    from: u64,
    limit: u64,
    in_batch: bool,
) -> io::Result<bool> {
    let to = resync(file, seed, from + 1, limit, 0, SEQ_MAX)?.map_or(limit, |(off, _)| off);
    Ok(head_is_zero(file, from, to)? || (in_batch && has_zero_sector(file, from, to)?))
}

/// Bytes of a damaged record's start that must read as zeroes for it to be taken for
/// a page a crash kept from the disk: its length and CRC fields. An intact header
/// never has both zero (a CRC of 0 over a whole record is a 2^-32 chance).
const ZERO_HEAD_BYTES_MIN: u64 = 8;

/// Whether the record at `from` reads as zeroes from its first byte to the end of its
/// sector (at least [`ZERO_HEAD_BYTES_MIN`] bytes, and not past `to`, the next valid
/// record). That is what a page that never reached the disk leaves where the record
/// began: the page reads as it was on disk before, zeroes past the data there. A bit
/// flip cannot do it. Nothing after such a hole was fsync'ed (an fsync would have
/// written the hole's page too), so cutting it loses nothing acknowledged under
/// `synced`.
fn head_is_zero(file: &File, from: u64, to: u64) -> io::Result<bool> {
    let sector_end = (from / SECTOR_BYTES + 1) * SECTOR_BYTES;
    let head_end = sector_end.max(from + ZERO_HEAD_BYTES_MIN).min(to);
    if head_end < from + ZERO_HEAD_BYTES_MIN {
        return Ok(false);
    }
    let mut head = vec![0u8; (head_end - from) as usize];
    let n = read_full_at(file, &mut head, from)?;
    Ok(n == head.len() && head.iter().all(|&b| b == 0))
}

/// Finds where the first record with seq ≥ `target` starts, reading (and checking)
/// records from the segment's start. Returns the end of valid data when every record
/// is below `target`.
pub(crate) fn locate(file: &File, seg: u64, seed: u32, limit: u64, target: u64) -> io::Result<u64> {
    Ok(locate_first(file, seg, seed, limit, |h| h.seq >= target)?.0)
}

/// Finds the first valid record whose header satisfies `wanted`, reading (and
/// checking) records from the segment's start: where it starts and its seq, or the end
/// of valid data and `None` when no record does.
pub(crate) fn locate_first(
    file: &File,
    seg: u64,
    seed: u32,
    limit: u64,
    wanted: impl Fn(&RecordHeader) -> bool,
) -> io::Result<(u64, Option<u64>)> {
    let mut read_buf = ReadBuf::default();
    let mut off = FILE_HEADER_BYTES;
    let mut expect = seg;
    loop {
        match read_record(&mut read_buf, file, seg, seed, off, limit, SCAN_CHUNK_BYTES)? {
            Found::End => return Ok((limit, None)),
            Found::Record(h, _) if h.seq >= expect => {
                if wanted(&h) {
                    return Ok((off, Some(h.seq)));
                }
                expect = h.seq + 1;
                off += h.record_bytes();
            }
            Found::Record(..) | Found::Bad => {
                match resync(file, seed, off + 1, limit, expect, SEQ_MAX)? {
                    Some((at, h)) => {
                        if wanted(&h) {
                            return Ok((at, Some(h.seq)));
                        }
                        read_buf.clear();
                        off = at;
                    }
                    None => return Ok((limit, None)),
                }
            }
        }
    }
}

/// Reads as much of `buf` as the file has at `off`.
pub(crate) fn read_full_at(file: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], off + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_zero_sees_one_set_byte_anywhere() {
        for len in [0usize, 1, 63, 64, 65, 200, 4096] {
            let mut bytes = vec![0u8; len];
            assert!(all_zero(&bytes), "len {len}");
            for at in 0..len {
                bytes[at] = 0x80;
                assert!(!all_zero(&bytes), "len {len}, byte {at}");
                bytes[at] = 0;
            }
        }
    }

    #[test]
    fn a_header_cut_short_by_a_crash_is_told_from_damage() {
        let first_seq = 42;
        let whole = encode_segment_header(first_seq, 0xdead_beef);
        for cut in 0..whole.len() {
            let mut torn = [0u8; FILE_HEADER_BYTES as usize];
            torn[..cut].copy_from_slice(&whole[..cut]);
            assert!(is_torn_header(&torn, first_seq), "cut at {cut}");
            assert!(
                is_torn_header(&whole[..cut], first_seq),
                "short file of {cut}"
            );
        }
        let mut flipped = whole;
        flipped[10] ^= 1;
        assert!(!is_torn_header(&flipped, first_seq));
        let mut junk = whole;
        junk[30] = 0;
        junk[31] = 0x55;
        assert!(!is_torn_header(&junk, first_seq));
        // Another segment's header is damage, not a tear.
        assert!(!is_torn_header(&encode_segment_header(7, 1), first_seq));
    }
}
