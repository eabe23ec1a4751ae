//! Job ids: unique in the store, never reused, the same after a restart.
//!
//! A counter handed out from blocks: `DIR/job-ids` holds the first value of the next
//! block not yet handed out (8 bytes little-endian and their CRC32C). Taking a new
//! block rewrites the file (a temporary file, fsync'ed, renamed, the directory
//! fsync'ed) before any id of the block is handed out; after a crash the counter
//! starts at the next block, so a block's unused ids are skipped, never reused.
//! One fsync per [`BLOCK`] ids.
//!
//! An id is the counter shifted left by 16 bits, with 16 bits of the tube's name hash
//! below ([`id_for`]): finding a job by its id then looks at one tube, not all of
//! them. 2^47 counter values last 44 years at 100,000 jobs a second.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::mapfile::{sync_dir, sync_file};

/// Ids handed out per write of the counter's file.
const BLOCK: u64 = 1 << 16;
/// The counter's bound: ids are `counter << 16`, and bit 63 marks a plain item's id
/// (`tube.rs`, `plain_id`), so the counter stays below 2^47.
const COUNTER_MAX: u64 = (1 << 47) - 1;
const FILE: &str = "job-ids";

/// The store's job id counter.
pub(crate) struct JobIds {
    dir: PathBuf,
    state: Mutex<Block>,
}

struct Block {
    next: u64,
    end: u64,
}

/// The id of the job numbered `counter` in the tube whose name is `tube`.
pub(crate) fn id_for(counter: u64, tube: &str) -> u64 {
    (counter << 16) | u64::from(tube_hash(tube))
}

/// The 16 bits of a tube's name an id carries.
pub(crate) fn tube_hash(tube: &str) -> u16 {
    (crc32c::crc32c(tube.as_bytes()) & 0xFFFF) as u16
}

/// Whether `id` can belong to the tube `tube` (its low bits match the name's hash).
pub(crate) fn may_be_in(id: u64, tube: &str) -> bool {
    (id & 0xFFFF) as u16 == tube_hash(tube)
}

impl JobIds {
    /// The counter of the store in `dir`: where its file says, or 1 for a new one. A
    /// damaged file is an error (ids could otherwise be handed out twice).
    pub fn open(dir: &Path) -> io::Result<JobIds> {
        let next = match fs::read(dir.join(FILE)) {
            Ok(bytes) => decode(&bytes).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{} is damaged: job ids cannot be handed out safely",
                        dir.join(FILE).display()
                    ),
                )
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => 1,
            Err(e) => return Err(e),
        };
        Ok(JobIds {
            dir: dir.to_path_buf(),
            state: Mutex::new(Block { next, end: next }),
        })
    }

    /// The next counter value.
    pub fn next(&self) -> io::Result<u64> {
        let mut block = self.state.lock();
        if block.next == block.end {
            let end = block.next.saturating_add(BLOCK).min(COUNTER_MAX + 1);
            if end == block.next {
                return Err(io::Error::other("the store has handed out every job id"));
            }
            self.persist(end)?;
            block.end = end;
        }
        let counter = block.next;
        block.next += 1;
        debug_assert!(counter <= COUNTER_MAX && block.next <= block.end);
        Ok(counter)
    }

    /// The next counter value when the current block has one; `None` when taking it
    /// would write the counter's file first (a caller on an event loop then leaves
    /// the job to [`JobIds::next`] off the loop).
    pub fn next_in_block(&self) -> Option<u64> {
        let mut block = self.state.lock();
        if block.next == block.end {
            return None;
        }
        let counter = block.next;
        block.next += 1;
        debug_assert!(counter <= COUNTER_MAX && block.next <= block.end);
        Some(counter)
    }

    fn persist(&self, end: u64) -> io::Result<()> {
        let path = self.dir.join(FILE);
        let tmp = self.dir.join(format!("{FILE}.tmp"));
        fs::write(&tmp, encode(end))?;
        sync_file(&fs::File::open(&tmp)?)?;
        fs::rename(&tmp, &path)?;
        sync_dir(&self.dir)
    }
}

fn encode(value: u64) -> [u8; 12] {
    let mut out = [0u8; 12];
    out[..8].copy_from_slice(&value.to_le_bytes());
    let crc = crc32c::crc32c(&out[..8]);
    out[8..].copy_from_slice(&crc.to_le_bytes());
    out
}

fn decode(bytes: &[u8]) -> Option<u64> {
    let value: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
    let crc: [u8; 4] = bytes.get(8..12)?.try_into().ok()?;
    (bytes.len() == 12 && crc32c::crc32c(&value) == u32::from_le_bytes(crc))
        .then(|| u64::from_le_bytes(value))
        .filter(|v| (1..=COUNTER_MAX + 1).contains(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_never_repeat_across_reopens_and_skip_the_rest_of_a_block() {
        let dir = tempfile::tempdir().unwrap();
        let ids = JobIds::open(dir.path()).unwrap();
        let first: Vec<u64> = (0..3).map(|_| ids.next().unwrap()).collect();
        assert_eq!(first, vec![1, 2, 3]);
        drop(ids);
        let again = JobIds::open(dir.path()).unwrap();
        assert_eq!(
            again.next().unwrap(),
            1 + BLOCK,
            "the unused rest of the block is skipped"
        );
    }

    #[test]
    fn a_damaged_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        JobIds::open(dir.path()).unwrap().next().unwrap();
        let path = dir.path().join(FILE);
        let mut bytes = fs::read(&path).unwrap();
        bytes[0] ^= 1;
        fs::write(&path, &bytes).unwrap();
        assert!(JobIds::open(dir.path()).is_err());
        fs::write(&path, b"short").unwrap();
        assert!(JobIds::open(dir.path()).is_err());
    }

    #[test]
    fn an_id_names_its_tube() {
        let id = id_for(42, "emails");
        assert_eq!(id >> 16, 42);
        assert!(may_be_in(id, "emails"));
        assert_eq!(
            may_be_in(id, "other"),
            tube_hash("other") == tube_hash("emails")
        );
    }
}
