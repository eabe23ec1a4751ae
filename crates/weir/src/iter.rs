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
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::frame::RECORD_HEADER_BYTES;
use crate::item::Item;
use crate::segment::{self, Found, ReadBuf, FILE_HEADER_BYTES, SCAN_CHUNK_BYTES};

/// Iterator over a queue's kept items; see [`crate::Queue::iter`]. Expired items are
/// skipped; damaged records are skipped (with an error logged).
pub struct Iter {
    /// The segments from the first one needed.
    segments: Vec<IterSegment>,
    index: usize,
    off: u64,
    /// Next seq expected; items below it are not kept any more.
    seq: u64,
    /// Seq at which iteration stops (the queue's next seq when it was made).
    stop: u64,
    now_ms: u64,
    max_age: Option<Duration>,
    rb: ReadBuf,
    failed: bool,
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
    pub(crate) fn new(
        segments: Vec<IterSegment>,
        off: u64,
        start: u64,
        stop: u64,
        now_ms: u64,
        max_age: Option<Duration>,
    ) -> Iter {
        Iter {
            segments,
            index: 0,
            off,
            seq: start,
            stop,
            now_ms,
            max_age,
            rb: ReadBuf::default(),
            failed: false,
        }
    }
}

impl Iterator for Iter {
    type Item = Result<Item>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        while self.seq < self.stop {
            let seg = self.segments.get_mut(self.index)?;
            let (first, seed, end) = (seg.first_seq, seg.seed, seg.end);
            let file = match &seg.file {
                Some(file) => Arc::clone(file),
                None => match File::open(&seg.path) {
                    Ok(file) => Arc::clone(seg.file.insert(Arc::new(file))),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        // Consumed by every reader and deleted since the snapshot.
                        self.index += 1;
                        self.off = FILE_HEADER_BYTES;
                        continue;
                    }
                    Err(e) => {
                        self.failed = true;
                        return Some(Err(Error::io("iterating a queue", e)));
                    }
                },
            };
            let found = match segment::read_record(
                &mut self.rb,
                &file,
                first,
                seed,
                self.off,
                end,
                SCAN_CHUNK_BYTES,
            ) {
                Ok(f) => f,
                Err(e) => {
                    self.failed = true;
                    return Some(Err(Error::io("iterating a queue", e)));
                }
            };
            match found {
                Found::Record(h, rec) if h.seq >= self.seq => {
                    self.off += h.record_bytes();
                    self.seq = h.seq + 1;
                    if h.seq >= self.stop {
                        return None;
                    }
                    let expired = (h.expires_at_ms != 0 && h.expires_at_ms <= self.now_ms)
                        || self.max_age.is_some_and(|a| {
                            h.enqueued_at_ms.saturating_add(a.as_millis() as u64) <= self.now_ms
                        });
                    if expired {
                        continue;
                    }
                    return Some(Ok(Item {
                        seq: h.seq,
                        data: Bytes::copy_from_slice(&rec[RECORD_HEADER_BYTES..]),
                        flags: h.flags,
                        enqueued_at_ms: h.enqueued_at_ms,
                        expires_at_ms: h.expires_at_ms,
                    }));
                }
                Found::Record(h, _) => {
                    // Below the start: the first segment holds confirmed items too.
                    self.off += h.record_bytes();
                }
                Found::End => {
                    self.index += 1;
                    self.off = FILE_HEADER_BYTES;
                }
                Found::Bad => {
                    let seq_max = self.stop.saturating_sub(1);
                    match segment::resync(&file, seed, self.off + 1, end, self.seq, seq_max) {
                        Ok(Some((at, _))) => {
                            tracing::error!(
                                segment = first,
                                offset = self.off,
                                "damaged record skipped while iterating"
                            );
                            self.rb.clear();
                            self.off = at;
                        }
                        Ok(None) => {
                            tracing::error!(
                                segment = first,
                                offset = self.off,
                                "damaged tail skipped while iterating"
                            );
                            self.index += 1;
                            self.off = FILE_HEADER_BYTES;
                        }
                        Err(e) => {
                            self.failed = true;
                            return Some(Err(Error::io("iterating a queue", e)));
                        }
                    }
                }
            }
        }
        None
    }
}
