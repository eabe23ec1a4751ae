//! Record framing: how one item is laid out in a segment file.
//!
//! ```text
//! offset  size  field
//!      0     4  payload length (u32 LE)
//!      4     4  CRC32C of bytes 8 .. 40+length, seeded with the segment's seed
//!      8     8  seq (u64 LE)
//!     16     8  enqueued_at_ms
//!     24     8  expires_at_ms (0 = never)
//!     32     4  flags
//!     36     4  bits: bit 0 = more records of the same batch follow;
//!               bit 1 = the payload starts with a job extension; others zero
//!     40     n  payload
//! ```
//!
//! A job extension ([`JOB_EXTENSION_BYTES`]: id u64, priority u32, ttr in seconds
//! u32, due time in Unix ms u64, little-endian) carries what the work-queue features keep with an item: its
//! id, which stays the same when the item moves between a queue's lanes, and its
//! priority and time-to-run. It counts in the payload's length and CRC like the data
//! after it; items appended without one (every item of the memcache door and of a
//! plain library append) have none and pay nothing for it. A weir older than the
//! extension reads such a record as damage: downgrading is not supported.
//!
//! A batch is written as consecutive records, all but the last with the "more" bit, so
//! recovery can cut a batch that a crash interrupted: batches are all or nothing.
//!
//! The CRC covers every header field after it and the payload, so a torn write, a bit
//! flip or a run of zeroes (a preallocated tail) never parses as a record. The seq inside
//! each record lets a reader tell a stale or misplaced record from the one it expects.
//!
//! Why a seed: after damage, recovery looks for the next valid record byte by byte, and
//! a payload is client data. Without a seed a client could store an item whose payload
//! *is* a CRC-valid record (any seq, any flags) and, once a bit flip sends recovery
//! looking, have it accepted in place of real records. Every segment gets a random
//! 32-bit seed in its header, and every record's CRC starts from it
//! (`crc32c_append(seed, ..)`, as if a secret prefix came first): a client never sees
//! the seed, so a frame it crafts verifies with probability 2^-32. Segments written
//! before seeds existed carry 0, which is the plain CRC32C.

/// Bytes of a record header.
pub(crate) const RECORD_HEADER_BYTES: usize = 40;

/// Largest payload the format can describe; the queue's `max_item_size_bytes` is the
/// limit in force, this only bounds what a scan believes of a length field.
pub(crate) const RECORD_PAYLOAD_BYTES_MAX: u64 = 1 << 30;

/// The decoded header of one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecordHeader {
    pub len: u32,
    pub crc: u32,
    pub seq: u64,
    pub enqueued_at_ms: u64,
    pub expires_at_ms: u64,
    pub flags: u32,
    /// More records of the same batch follow this one.
    pub more: bool,
    /// The payload starts with a job extension ([`JOB_EXTENSION_BYTES`]).
    pub job: bool,
}

/// Bit of the header's last word: more records of the same batch follow.
const BIT_MORE: u32 = 1;
/// Bit of the header's last word: the payload starts with a job extension.
const BIT_JOB: u32 = 2;

/// Bytes of a job extension at the start of a payload.
pub(crate) const JOB_EXTENSION_BYTES: usize = 24;

/// Encodes a job extension.
pub(crate) fn encode_job(job: &weir_types::JobMeta) -> [u8; JOB_EXTENSION_BYTES] {
    let mut out = [0u8; JOB_EXTENSION_BYTES];
    out[0..8].copy_from_slice(&job.id.to_le_bytes());
    out[8..12].copy_from_slice(&job.priority.to_le_bytes());
    out[12..16].copy_from_slice(&job.ttr_s.to_le_bytes());
    out[16..24].copy_from_slice(&job.due_ms.to_le_bytes());
    out
}

/// The item a record holds: its header's fields, and its payload split into the job
/// extension (when the header says there is one) and the data, without a copy.
pub(crate) fn item(header: &RecordHeader, payload: bytes::Bytes) -> weir_types::Item {
    let (job, data) = match header.job.then(|| decode_job(&payload)).flatten() {
        Some(job) => (Some(job), payload.slice(JOB_EXTENSION_BYTES..)),
        None => (None, payload),
    };
    weir_types::Item {
        seq: header.seq,
        data,
        flags: header.flags,
        enqueued_at_ms: header.enqueued_at_ms,
        expires_at_ms: header.expires_at_ms,
        job,
    }
}

/// Decodes the job extension at the start of `payload`; `None` when it is shorter.
pub(crate) fn decode_job(payload: &[u8]) -> Option<weir_types::JobMeta> {
    let ext = payload.get(..JOB_EXTENSION_BYTES)?;
    let u32_at = |i: usize| u32::from_le_bytes([ext[i], ext[i + 1], ext[i + 2], ext[i + 3]]);
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&ext[i..i + 8]);
        u64::from_le_bytes(b)
    };
    Some(weir_types::JobMeta {
        id: u64_at(0),
        priority: u32_at(8),
        ttr_s: u32_at(12),
        due_ms: u64_at(16),
    })
}

impl RecordHeader {
    /// Total bytes of the record, header included.
    pub fn record_bytes(&self) -> u64 {
        RECORD_HEADER_BYTES as u64 + self.len as u64
    }
}

/// Encodes a header (with its CRC over the payload, the concatenation of `payload`,
/// seeded with the segment's `seed`) into `out`. With `job`, the payload's first
/// part is a job extension.
#[allow(clippy::too_many_arguments)]
pub(crate) fn encode_header(
    out: &mut [u8; RECORD_HEADER_BYTES],
    seed: u32,
    seq: u64,
    enqueued_at_ms: u64,
    expires_at_ms: u64,
    flags: u32,
    more: bool,
    job: bool,
    payload: &[&[u8]],
) {
    let len: usize = payload.iter().map(|p| p.len()).sum();
    assert!(len as u64 <= RECORD_PAYLOAD_BYTES_MAX);
    assert!(seq > 0 && seq <= SEQ_MAX, "seq {seq} out of range");
    assert!(
        !job || payload
            .first()
            .is_some_and(|p| p.len() == JOB_EXTENSION_BYTES),
        "a job record starts with its extension"
    );
    let bits = if more { BIT_MORE } else { 0 } | if job { BIT_JOB } else { 0 };
    out[0..4].copy_from_slice(&(len as u32).to_le_bytes());
    out[8..16].copy_from_slice(&seq.to_le_bytes());
    out[16..24].copy_from_slice(&enqueued_at_ms.to_le_bytes());
    out[24..32].copy_from_slice(&expires_at_ms.to_le_bytes());
    out[32..36].copy_from_slice(&flags.to_le_bytes());
    out[36..40].copy_from_slice(&bits.to_le_bytes());
    let mut crc = crc32c::crc32c_append(seed, &out[8..]);
    for part in payload {
        crc = crc32c::crc32c_append(crc, part);
    }
    out[4..8].copy_from_slice(&crc.to_le_bytes());
    debug_assert!(decode_header(&out[..])
        .is_some_and(|h| h.len as usize == len && h.seq == seq && h.crc == crc && h.job == job));
}

/// Decodes a header; `None` when `bytes` is too short or the length is implausible.
/// The CRC is not checked here (it needs the payload): see [`verify`].
pub(crate) fn decode_header(bytes: &[u8]) -> Option<RecordHeader> {
    if bytes.len() < RECORD_HEADER_BYTES {
        return None;
    }
    let u32_at =
        |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[i..i + 8]);
        u64::from_le_bytes(b)
    };
    let header = RecordHeader {
        len: u32_at(0),
        crc: u32_at(4),
        seq: u64_at(8),
        enqueued_at_ms: u64_at(16),
        expires_at_ms: u64_at(24),
        flags: u32_at(32),
        more: u32_at(36) & BIT_MORE != 0,
        job: u32_at(36) & BIT_JOB != 0,
    };
    if header.len as u64 > RECORD_PAYLOAD_BYTES_MAX
        || header.seq == 0
        || header.seq > SEQ_MAX
        || u32_at(36) & !(BIT_MORE | BIT_JOB) != 0
        || (header.job && (header.len as usize) < JOB_EXTENSION_BYTES)
    {
        return None;
    }
    Some(header)
}

/// Whether `record` (header and payload, exactly) carries a valid CRC for a segment
/// whose seed is `seed`.
pub(crate) fn verify(header: &RecordHeader, record: &[u8], seed: u32) -> bool {
    if record.len() as u64 != header.record_bytes() {
        return false;
    }
    crc32c::crc32c_append(seed, &record[8..]) == header.crc
}

/// A fresh random record seed for a new segment: never 0, which marks a segment
/// written before seeds existed.
pub(crate) fn new_seed() -> u32 {
    loop {
        let mut bytes = [0u8; 4];
        // SAFETY: getrandom writes at most `bytes.len()` bytes into the live buffer.
        let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
        let seed = if n == bytes.len() as isize {
            u32::from_le_bytes(bytes)
        } else {
            fallback_seed()
        };
        if seed != 0 {
            return seed;
        }
    }
}

/// Without getrandom (a seccomp filter, an old kernel): the clock, the pid and a
/// counter, mixed. Not secret from someone who can read the clock, but never a value a
/// client chose.
fn fallback_seed() -> u32 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mixed = nanos
        ^ u64::from(std::process::id()).rotate_left(32)
        ^ COUNTER.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    crc32c::crc32c(&mixed.to_le_bytes())
}

/// Largest seq a record may carry: far beyond any real queue (2^62 items), and far
/// enough from `u64::MAX` that no arithmetic on seqs can overflow.
pub(crate) const SEQ_MAX: u64 = 1 << 62;

/// A small framed record of the reader journal: length, CRC, then the body.
pub(crate) const SMALL_FRAME_HEADER_BYTES: usize = 8;

/// Appends a framed `body` to `out`.
pub(crate) fn encode_small_frame(out: &mut Vec<u8>, body: &[u8]) {
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
    out.extend_from_slice(body);
}

/// Decodes one framed body at the start of `bytes`; returns it and the frame's size.
pub(crate) fn decode_small_frame(bytes: &[u8], body_bytes_max: usize) -> Option<(&[u8], usize)> {
    if bytes.len() < SMALL_FRAME_HEADER_BYTES {
        return None;
    }
    let len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    let crc = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    if len == 0 || len > body_bytes_max || bytes.len() < SMALL_FRAME_HEADER_BYTES + len {
        return None;
    }
    let body = &bytes[SMALL_FRAME_HEADER_BYTES..SMALL_FRAME_HEADER_BYTES + len];
    if crc32c::crc32c(body) != crc {
        return None;
    }
    Some((body, SMALL_FRAME_HEADER_BYTES + len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let payload = b"hello";
        let mut h = [0u8; RECORD_HEADER_BYTES];
        let seed = 0x1234_5678;
        encode_header(&mut h, seed, 7, 100, 0, 42, true, false, &[payload]);
        let mut rec = h.to_vec();
        rec.extend_from_slice(payload);
        let d = decode_header(&rec).unwrap();
        assert_eq!(
            (d.len, d.seq, d.enqueued_at_ms, d.flags, d.more),
            (5, 7, 100, 42, true)
        );
        assert!(verify(&d, &rec, seed));
        for bit in 0..rec.len() * 8 {
            let mut bad = rec.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            let ok = decode_header(&bad)
                .map(|d| verify(&d, &bad, seed))
                .unwrap_or(false);
            assert!(!ok, "bit {bit} flip went unnoticed");
        }
        assert!(decode_header(&[0u8; RECORD_HEADER_BYTES]).is_none());
    }

    #[test]
    fn a_record_made_without_the_seed_does_not_verify() {
        // What a client could put in a payload: a frame that is valid unseeded, or
        // under a seed of its own choosing.
        let payload = b"forged";
        for guess in [0u32, 1, 0xdead_beef] {
            let mut h = [0u8; RECORD_HEADER_BYTES];
            encode_header(&mut h, guess, 3, 100, 0, 0, false, false, &[payload]);
            let mut rec = h.to_vec();
            rec.extend_from_slice(payload);
            let d = decode_header(&rec).unwrap();
            assert!(verify(&d, &rec, guess));
            assert!(!verify(&d, &rec, 0x5eed_5eed), "guess {guess:#x} verified");
        }
        // Legacy segments (seed 0) are plain CRC32C.
        let mut h = [0u8; RECORD_HEADER_BYTES];
        encode_header(&mut h, 0, 1, 1, 0, 0, false, false, &[b"x"]);
        let mut rec = h.to_vec();
        rec.push(b'x');
        assert_eq!(crc32c::crc32c(&rec[8..]), decode_header(&rec).unwrap().crc);
    }

    #[test]
    fn a_job_extension_round_trips_and_is_covered_by_the_crc() {
        let job = weir_types::JobMeta {
            id: 0x0102_0304_0506_0708,
            priority: 7,
            ttr_s: 60,
            due_ms: 1_700_000_000_123,
        };
        let ext = encode_job(&job);
        let mut h = [0u8; RECORD_HEADER_BYTES];
        encode_header(&mut h, 9, 4, 1, 0, 3, false, true, &[&ext, b"data"]);
        let mut rec = h.to_vec();
        rec.extend_from_slice(&ext);
        rec.extend_from_slice(b"data");
        let d = decode_header(&rec).unwrap();
        assert!(d.job && !d.more && d.len == 28);
        assert!(verify(&d, &rec, 9));
        assert_eq!(decode_job(&rec[RECORD_HEADER_BYTES..]), Some(job));
        // The extension's bytes are under the CRC.
        let mut bad = rec.clone();
        bad[RECORD_HEADER_BYTES + 9] ^= 1;
        assert!(!verify(&d, &bad, 9));
        // A job bit on a payload shorter than an extension never decodes; nor does
        // an unknown bit.
        let mut short = [0u8; RECORD_HEADER_BYTES];
        encode_header(&mut short, 9, 4, 1, 0, 3, false, false, &[b"tiny"]);
        short[36] |= 2;
        assert!(decode_header(&short).is_none());
        let mut unknown = h;
        unknown[36] |= 4;
        assert!(decode_header(&unknown).is_none());
        assert_eq!(decode_job(b"short"), None);
    }

    #[test]
    fn seeds_are_nonzero_and_differ() {
        let seeds: std::collections::HashSet<u32> = (0..64).map(|_| new_seed()).collect();
        assert!(!seeds.contains(&0));
        assert!(seeds.len() > 60, "{} distinct seeds of 64", seeds.len());
        assert_ne!(fallback_seed(), fallback_seed());
    }

    #[test]
    fn small_frames() {
        let mut out = Vec::new();
        encode_small_frame(&mut out, b"abc");
        assert_eq!(decode_small_frame(&out, 16), Some((&b"abc"[..], 11)));
        out[9] ^= 1;
        assert_eq!(decode_small_frame(&out, 16), None);
        assert_eq!(decode_small_frame(&[0u8; 16], 16), None);
    }
}
