//! `reader-names`: which readers a queue has, kept apart from the reader journal.
//!
//! The journal (`journal.rs`) is where readers' positions live, and it is the truth
//! while it is readable. But if it is lost or damaged, the queue would not know which
//! readers exist, and a queue that does not know a reader reclaims the segments that
//! reader still needs as soon as the readers it does know are done: a fanout reader
//! coming back after such a restart would find nothing. So the set of reader names is
//! written a second time, to this small file, whenever it changes. When the journal is
//! unusable, the readers named here are created again at the oldest stored item
//! (confirmed items come again; nothing is lost). When both are unusable while the
//! queue holds items, the store cannot account for its readers at all: the file then
//! records a *hold*, the oldest seq kept for readers nobody knows, and the queue
//! reclaims nothing from there on until the whole queue is flushed or deleted.
//!
//! Layout: a 32-byte file header (magic `WEIRRDN1`, the hold seq or 0, CRC), one small
//! frame per reader (tag 1, then the name; the default reader's name is empty), and an
//! end frame (tag 2, then the count of names as u32), so a truncated file is never taken
//! for a shorter list. Written to a `.tmp` file and renamed over the old one, so a killed
//! process leaves the old list or the new one. It is not fsync'ed inline (a reader is
//! created by a plain read, on the hot path): the queue's next fsync covers it and its
//! directory, under the queue's durability, like the journal record of the same change.

use std::fs::{self, File};
use std::io;
use std::path::Path;

use crate::frame::{decode_small_frame, encode_small_frame};
use crate::name::validate_reader_name;
use crate::readers::READERS_PER_QUEUE_MAX;
use crate::segment::{decode_file_header, encode_file_header, FILE_HEADER_BYTES};

/// The file's name in the queue's directory: not `readers.*`, so that a clean-up of
/// the journal's files by pattern leaves it.
pub(crate) const FILE_NAME: &str = "reader-names";
const TMP_NAME: &str = "reader-names.tmp";
const MAGIC: &[u8; 8] = b"WEIRRDN1";
const TAG_NAME: u8 = 1;
const TAG_END: u8 = 2;
/// Largest frame body: a tag and a 100-byte name.
const BODY_BYTES_MAX: usize = 1 + crate::name::NAME_LENGTH_MAX;
/// The largest file a valid list can be: bounds what is read of a damaged one.
const FILE_BYTES_MAX: u64 =
    FILE_HEADER_BYTES + (READERS_PER_QUEUE_MAX as u64 + 1) * (8 + BODY_BYTES_MAX as u64);

/// What the file says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ReaderList {
    pub names: Vec<String>,
    /// Oldest seq kept for readers the store could not account for (see the module
    /// docs); `None` when every reader is known.
    pub hold: Option<u64>,
}

/// What reading the file found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Read {
    Found(ReaderList),
    /// No file (a queue made before the list existed, or the file was removed).
    Missing,
    /// A file that does not parse whole.
    Damaged,
}

fn encode(list: &ReaderList) -> Vec<u8> {
    let mut out = encode_file_header(MAGIC, list.hold.unwrap_or(0)).to_vec();
    let mut body = Vec::with_capacity(BODY_BYTES_MAX);
    for name in &list.names {
        body.clear();
        body.push(TAG_NAME);
        body.extend_from_slice(name.as_bytes());
        encode_small_frame(&mut out, &body);
    }
    body.clear();
    body.push(TAG_END);
    body.extend_from_slice(&(list.names.len() as u32).to_le_bytes());
    encode_small_frame(&mut out, &body);
    out
}

fn decode(bytes: &[u8]) -> Option<ReaderList> {
    let header = bytes.get(..FILE_HEADER_BYTES as usize)?;
    let hold = decode_file_header(MAGIC, header)?;
    let mut pos = FILE_HEADER_BYTES as usize;
    let mut names = Vec::new();
    loop {
        let (body, used) = decode_small_frame(&bytes[pos..], BODY_BYTES_MAX)?;
        pos += used;
        match body.split_first()? {
            (&TAG_NAME, name) => {
                let name = std::str::from_utf8(name).ok()?;
                validate_reader_name(name).ok()?;
                if names.len() >= READERS_PER_QUEUE_MAX {
                    return None;
                }
                names.push(name.to_string());
            }
            (&TAG_END, count) => {
                let count = u32::from_le_bytes(count.try_into().ok()?);
                if count as usize != names.len() || pos != bytes.len() {
                    return None;
                }
                let hold = (hold != 0).then_some(hold);
                return Some(ReaderList { names, hold });
            }
            _ => return None,
        }
    }
}

/// Reads the list of the queue in `dir`.
pub(crate) fn read(dir: &Path) -> io::Result<Read> {
    let path = dir.join(FILE_NAME);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Read::Missing),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    if len > FILE_BYTES_MAX {
        return Ok(Read::Damaged);
    }
    let mut bytes = vec![0u8; len as usize];
    let n = crate::segment::read_full_at(&file, &mut bytes, 0)?;
    bytes.truncate(n);
    Ok(match decode(&bytes) {
        Some(list) => Read::Found(list),
        None => Read::Damaged,
    })
}

/// Replaces the list of the queue in `dir` (see the module docs for what is durable
/// when).
pub(crate) fn write(dir: &Path, list: &ReaderList) -> io::Result<()> {
    assert!(list.names.len() <= READERS_PER_QUEUE_MAX);
    let tmp = dir.join(TMP_NAME);
    fs::write(&tmp, encode(list))?;
    fs::rename(&tmp, dir.join(FILE_NAME))
}

/// fdatasyncs the list (its directory is the caller's to sync).
pub(crate) fn sync(dir: &Path) -> io::Result<()> {
    match File::open(dir.join(FILE_NAME)) {
        Ok(f) => crate::mapfile::sync_file(&f),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(names: &[&str], hold: Option<u64>) -> ReaderList {
        ReaderList {
            names: names.iter().map(|n| n.to_string()).collect(),
            hold,
        }
    }

    #[test]
    fn round_trip_and_every_truncation_is_refused() {
        for l in [
            list(&[], None),
            list(&["", "fan", "audit_2"], None),
            list(&["x"], Some(17)),
        ] {
            let bytes = encode(&l);
            assert_eq!(decode(&bytes), Some(l.clone()));
            for cut in 0..bytes.len() {
                assert_eq!(decode(&bytes[..cut]), None, "cut at {cut} of {l:?}");
            }
            for bit in 0..bytes.len() * 8 {
                let mut bad = bytes.clone();
                bad[bit / 8] ^= 1 << (bit % 8);
                assert_ne!(decode(&bad), Some(l.clone()), "bit {bit} of {l:?}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert_eq!(decode(&longer), None, "junk after the end");
        }
    }

    #[test]
    fn files_missing_damaged_and_replaced() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        assert_eq!(read(dir.path())?, Read::Missing);
        write(dir.path(), &list(&["a"], None))?;
        write(dir.path(), &list(&["a", "b"], None))?;
        assert_eq!(read(dir.path())?, Read::Found(list(&["a", "b"], None)));
        assert!(!dir.path().join(TMP_NAME).exists());
        sync(dir.path())?;
        fs::write(dir.path().join(FILE_NAME), b"WEIRRDN1 garbage")?;
        assert_eq!(read(dir.path())?, Read::Damaged);
        fs::write(
            dir.path().join(FILE_NAME),
            vec![0u8; FILE_BYTES_MAX as usize + 1],
        )?;
        assert_eq!(read(dir.path())?, Read::Damaged);
        Ok(())
    }
}
