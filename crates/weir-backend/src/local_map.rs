//! The embedded engine's [`crate::SharedMap`]: a small key-value map in a file of the
//! data directory, `DATA_DIR/maps/<name>.map`, for a front door's own metadata (the
//! event bus's tokens, topics and subscriptions).
//!
//! It answers as the cluster's map does (`jetstream/map.rs`): compare-and-set writes
//! against a key's revision, revisions that only grow within a map, deletes that
//! never remove a newer value. One process holds the data directory (it is locked),
//! so this process is the file's only writer.
//!
//! # The file
//!
//! An 8-byte magic (`weirmap1`), then records, each framed as
//! `len: u32 LE | crc: u32 LE | body` with `crc` the CRC32C of `body` (`len` bytes):
//!
//! - put: `1 | revision: u64 LE | key_len: u16 LE | key | value`
//! - delete: `2 | revision: u64 LE | key_len: u16 LE | key`
//! - floor: `3 | revision: u64 LE` (the highest revision given so far; written first
//!   in a compacted file, so that revisions never go back)
//!
//! Every write appends its record and `fdatasync`s the file before it answers; the
//! whole map is also kept in memory (it is small: the bus's limits bound it), replayed
//! from the file at open. A write costs one record, whatever the map holds.
//!
//! When the records of replaced and deleted values pass [`COMPACT_FACTOR`] times the
//! live ones (and [`COMPACT_MIN_BYTES`]), the live entries are written to a new file,
//! fsync'ed, renamed over the old one, and the directory fsync'ed.
//!
//! A kill mid-append leaves a torn last record (short, or with a bad CRC, or zeros up
//! to the end): it was never acknowledged, and is cut off at open. A bad record with
//! good ones after it is damage, not a torn write: the open fails with an error naming
//! the file and the offset, rather than dropping what follows.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use bytes::Bytes;

use crate::error::{Error, Kind, Result};
use crate::map_entry::{valid_key, valid_map_name, Entry, Expect, KEY_BYTES_MAX, VALUE_BYTES_MAX};

/// Compaction starts when dead records take this many times the live ones' bytes...
pub const COMPACT_FACTOR: u64 = 2;
/// ... and at least this many bytes.
pub const COMPACT_MIN_BYTES: u64 = 64 * 1024;

const MAGIC: &[u8; 8] = b"weirmap1";
const FRAME: usize = 8;
const PUT: u8 = 1;
const DELETE: u8 = 2;
const FLOOR: u8 = 3;
/// A record's largest body: a put of the longest key and value.
const BODY_BYTES_MAX: usize = 1 + 8 + 2 + KEY_BYTES_MAX + VALUE_BYTES_MAX;
/// The largest file read at open: far above what compaction lets it reach.
const FILE_BYTES_MAX: u64 = 1 << 30;

/// A map of this process's data directory; cheap to clone (one state per file).
#[derive(Clone)]
pub struct LocalMap {
    state: Arc<Mutex<State>>,
}

struct State {
    path: PathBuf,
    file: File,
    entries: BTreeMap<String, (Bytes, u64)>,
    /// The highest revision given (a put's or a delete's).
    revision: u64,
    /// The file's length: where the next record goes.
    len: u64,
    /// The bytes of the records of the live entries.
    live: u64,
    /// A failed write left bytes that could not be cut off, or a compaction's
    /// rename could not be made durable: nothing more is written.
    broken: bool,
    /// Dead bytes below which no compaction is tried: raised after one fails, so that
    /// a lasting cause (a full disk) does not rewrite the whole map at every write.
    compact_from: u64,
}

/// The maps open in this process, by path: two handles on one file share one state.
static OPEN: OnceLock<Mutex<HashMap<PathBuf, Weak<Mutex<State>>>>> = OnceLock::new();

impl LocalMap {
    /// Opens map `name` (`[a-z0-9_]{1,32}`, as in the cluster) of data directory
    /// `data_dir`, creating it empty. Blocking: file work.
    pub fn open(data_dir: &Path, name: &str) -> Result<LocalMap> {
        if !valid_map_name(name) {
            return Err(Error::new(
                Kind::InvalidName,
                format!("map name {name:?}: 1 to 32 of [a-z0-9_]"),
            ));
        }
        let dir = data_dir.join("maps");
        let path = dir.join(format!("{name}.map"));
        let open = OPEN.get_or_init(Mutex::default);
        let mut open = open.lock().map_err(|_| poisoned(&path))?;
        open.retain(|_, weak| weak.strong_count() > 0);
        if let Some(state) = open.get(&path).and_then(Weak::upgrade) {
            return Ok(LocalMap { state });
        }
        let state = Arc::new(Mutex::new(State::open(&dir, path.clone())?));
        open.insert(path, Arc::downgrade(&state));
        Ok(LocalMap { state })
    }

    /// The key's value.
    pub fn get(&self, key: &str) -> Result<Option<Entry>> {
        check_key(key)?;
        let state = self.lock()?;
        Ok(state.entries.get(key).map(|(value, revision)| Entry {
            key: key.to_owned(),
            value: value.clone(),
            revision: *revision,
        }))
    }

    /// Every key and value, in the order they were last written (as the cluster's).
    pub fn list(&self) -> Result<Vec<Entry>> {
        let state = self.lock()?;
        let mut entries: Vec<Entry> = state
            .entries
            .iter()
            .map(|(key, (value, revision))| Entry {
                key: key.clone(),
                value: value.clone(),
                revision: *revision,
            })
            .collect();
        entries.sort_by_key(|e| e.revision);
        Ok(entries)
    }

    /// Writes `value` under `key` if the key is as `expect` says, durably; answers
    /// the new revision, or [`Kind::Conflict`] (unless the key holds this very value:
    /// then its revision, as the cluster's map answers a retried write). Blocking.
    pub fn put(&self, key: &str, value: Bytes, expect: Expect) -> Result<u64> {
        check_key(key)?;
        if value.len() > VALUE_BYTES_MAX {
            return Err(Error::new(
                Kind::TooLarge,
                format!(
                    "a map value of {} bytes (at most {VALUE_BYTES_MAX})",
                    value.len()
                ),
            ));
        }
        let mut state = self.lock()?;
        let current = state.entries.get(key);
        let matches = match (expect, current) {
            (Expect::Absent, None) => true,
            (Expect::Revision(r), Some((_, now))) => *now == r,
            _ => false,
        };
        if !matches {
            return match current {
                Some((now, revision)) if *now == value => Ok(*revision),
                _ => Err(conflict(key)),
            };
        }
        let revision = state.revision + 1;
        let record = frame(&put_body(revision, key, &value));
        state.append(&record)?;
        state.revision = revision;
        if let Some((old, _)) = state.entries.insert(key.to_owned(), (value, revision)) {
            state.live -= put_len(key, &old);
        }
        state.live += record.len() as u64;
        state.compact_if_due();
        Ok(revision)
    }

    /// Removes `key` if its value is at `revision` or older (a newer value stays:
    /// then [`Kind::Conflict`]), durably; false when it had no value. Blocking.
    pub fn delete(&self, key: &str, revision: u64) -> Result<bool> {
        check_key(key)?;
        let mut state = self.lock()?;
        let Some((old, now)) = state.entries.get(key) else {
            return Ok(false);
        };
        if *now > revision {
            return Err(conflict(key));
        }
        let old_len = put_len(key, old);
        let next = state.revision + 1;
        let mut body = vec![DELETE];
        body.extend_from_slice(&next.to_le_bytes());
        push_key(&mut body, key);
        state.append(&frame(&body))?;
        state.revision = next;
        state.entries.remove(key);
        state.live -= old_len;
        state.compact_if_due();
        Ok(true)
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, State>> {
        self.state
            .lock()
            .map_err(|_| Error::new(Kind::Other, "a map's lock was poisoned"))
    }
}

impl State {
    /// Reads the file (creating it), replays its records, cuts off a torn tail.
    fn open(dir: &Path, path: PathBuf) -> Result<State> {
        if !dir.is_dir() {
            fs::create_dir_all(dir).map_err(|e| io_error("creating", dir, e))?;
            // The new directory's entry in its parent (the data directory) is made
            // durable too, or the map could vanish whole with a power cut.
            if let Some(parent) = dir.parent() {
                sync_dir(parent)?;
            }
        }
        let temp = temp_path(&path);
        match fs::remove_file(&temp) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(io_error("removing", &temp, e))
            }
            _ => {}
        }
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io_error("opening", &path, e))?;
        let bytes = read_whole(&mut file, &path)?;
        let mut state = State {
            path,
            file,
            entries: BTreeMap::new(),
            revision: 0,
            len: 0,
            live: 0,
            broken: false,
            compact_from: COMPACT_MIN_BYTES,
        };
        if bytes.len() < MAGIC.len() && MAGIC.starts_with(&bytes) {
            // New, or a creation cut before its magic was written whole.
            state.truncate(0)?;
            state.append(MAGIC)?;
            sync_dir(dir)?;
            return Ok(state);
        }
        if !bytes.starts_with(MAGIC) {
            return Err(damaged(
                &state.path,
                0,
                "it does not start with weir's map magic",
            ));
        }
        let end = state.replay(&bytes)?;
        if end < bytes.len() {
            // A torn last record: never acknowledged.
            state.truncate(end as u64)?;
        }
        state.len = end as u64;
        Ok(state)
    }

    /// Applies the records of `bytes` (past the magic); answers where the valid
    /// records end (before a torn tail).
    fn replay(&mut self, bytes: &[u8]) -> Result<usize> {
        let mut at = MAGIC.len();
        while at < bytes.len() {
            let rest = &bytes[at..];
            if rest.iter().all(|b| *b == 0) || rest.len() < FRAME {
                return Ok(at);
            }
            let len = u32_at(rest, 0) as usize;
            let crc = u32_at(rest, 4);
            if len > BODY_BYTES_MAX {
                return Err(damaged(&self.path, at, "a record longer than any write"));
            }
            let Some(body) = rest.get(FRAME..FRAME + len) else {
                return Ok(at);
            };
            if crc32c::crc32c(body) != crc {
                if FRAME + len == rest.len() {
                    return Ok(at);
                }
                return Err(damaged(
                    &self.path,
                    at,
                    "a record's checksum does not match",
                ));
            }
            self.apply(body)
                .ok_or_else(|| damaged(&self.path, at, "a record of an unknown form"))?;
            at += FRAME + len;
        }
        Ok(at)
    }

    /// Applies one record's body; `None` when it is not a valid record.
    fn apply(&mut self, body: &[u8]) -> Option<()> {
        let kind = *body.first()?;
        let revision = u64::from_le_bytes(body.get(1..9)?.try_into().ok()?);
        self.revision = self.revision.max(revision);
        if kind == FLOOR {
            return (body.len() == 9).then_some(());
        }
        let key_len = u16::from_le_bytes(body.get(9..11)?.try_into().ok()?) as usize;
        let key = std::str::from_utf8(body.get(11..11 + key_len)?).ok()?;
        if !valid_key(key) {
            return None;
        }
        let old = match kind {
            PUT => {
                let value = Bytes::copy_from_slice(&body[11 + key_len..]);
                self.live += (FRAME + body.len()) as u64;
                self.entries.insert(key.to_owned(), (value, revision))
            }
            DELETE if body.len() == 11 + key_len => self.entries.remove(key),
            _ => return None,
        };
        if let Some((old, _)) = old {
            self.live -= put_len(key, &old);
        }
        Some(())
    }

    /// Appends `bytes` and `fdatasync`s; on failure cuts the file back to where it
    /// was, or, if that fails too, refuses every later write.
    fn append(&mut self, bytes: &[u8]) -> Result<()> {
        if self.broken {
            return Err(Error::new(
                Kind::Io,
                format!(
                    "{}: an earlier write failed and could not be undone; restart to recover",
                    self.path.display()
                ),
            ));
        }
        let written = self
            .file
            .write_all(bytes)
            .and_then(|()| self.file.sync_data());
        if let Err(e) = written {
            if self
                .file
                .set_len(self.len)
                .and_then(|()| self.file.sync_data())
                .is_err()
            {
                self.broken = true;
            }
            return Err(io_error("writing", &self.path, e));
        }
        self.len += bytes.len() as u64;
        Ok(())
    }

    fn truncate(&mut self, len: u64) -> Result<()> {
        self.file
            .set_len(len)
            .and_then(|()| self.file.sync_all())
            .map_err(|e| io_error("truncating", &self.path, e))?;
        self.len = len;
        Ok(())
    }

    /// Compacts when dead records pass [`COMPACT_FACTOR`] times the live ones. A
    /// failure before the rename leaves the old file whole, and the next attempt
    /// waits for [`COMPACT_MIN_BYTES`] more dead bytes.
    fn compact_if_due(&mut self) {
        let dead = self.len - MAGIC.len() as u64 - self.live;
        if dead < self.compact_from || dead <= self.live * COMPACT_FACTOR {
            return;
        }
        match self.compact() {
            Ok(()) => self.compact_from = COMPACT_MIN_BYTES,
            Err(e) => {
                self.compact_from = dead.saturating_add(COMPACT_MIN_BYTES);
                tracing::warn!(map = %self.path.display(), error = %e, "could not compact a map");
            }
        }
    }

    /// Writes the live entries to a new file and renames it over this one.
    fn compact(&mut self) -> Result<()> {
        let temp = temp_path(&self.path);
        let mut out = Vec::with_capacity(MAGIC.len() + self.live as usize + 32);
        out.extend_from_slice(MAGIC);
        let mut floor = vec![FLOOR];
        floor.extend_from_slice(&self.revision.to_le_bytes());
        out.extend_from_slice(&frame(&floor));
        let mut by_revision: Vec<(&String, &(Bytes, u64))> = self.entries.iter().collect();
        by_revision.sort_by_key(|(_, (_, r))| *r);
        for (key, (value, revision)) in by_revision {
            out.extend_from_slice(&frame(&put_body(*revision, key, value)));
        }
        // The new file's descriptor is the one written to after the rename: it
        // follows the file, so nothing is opened again once the rename is made.
        let _ = fs::remove_file(&temp);
        let written = (|| {
            let mut f = OpenOptions::new()
                .read(true)
                .append(true)
                .create_new(true)
                .mode(0o600)
                .open(&temp)?;
            f.write_all(&out)?;
            f.sync_all()?;
            fs::rename(&temp, &self.path)?;
            Ok::<File, std::io::Error>(f)
        })();
        let file = match written {
            Ok(file) => file,
            Err(e) => {
                let _ = fs::remove_file(&temp);
                return Err(io_error("compacting", &self.path, e));
            }
        };
        // Renamed: the old file is gone, every later record goes to the new one.
        self.file = file;
        self.len = out.len() as u64;
        let Some(dir) = self.path.parent() else {
            return Ok(());
        };
        if let Err(e) = sync_dir(dir) {
            // Until the directory is synced, a crash may bring the old file back,
            // without what is written from now on: write nothing more.
            self.broken = true;
            return Err(e);
        }
        Ok(())
    }
}

fn put_body(revision: u64, key: &str, value: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(11 + key.len() + value.len());
    body.push(PUT);
    body.extend_from_slice(&revision.to_le_bytes());
    push_key(&mut body, key);
    body.extend_from_slice(value);
    body
}

/// The bytes of a put record of `key` and `value`, frame included.
fn put_len(key: &str, value: &[u8]) -> u64 {
    (FRAME + 11 + key.len() + value.len()) as u64
}

fn push_key(body: &mut Vec<u8>, key: &str) {
    // A valid key is at most KEY_BYTES_MAX (200) bytes.
    body.extend_from_slice(&(key.len() as u16).to_le_bytes());
    body.extend_from_slice(key.as_bytes());
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME + body.len());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
    out.extend_from_slice(body);
    out
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(b)
}

fn read_whole(file: &mut File, path: &Path) -> Result<Vec<u8>> {
    let len = file
        .metadata()
        .map_err(|e| io_error("reading", path, e))?
        .len();
    if len > FILE_BYTES_MAX {
        return Err(damaged(path, 0, "it is larger than any map"));
    }
    // Grown as it is read, not reserved from the length a damaged file may claim.
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| io_error("reading", path, e))?;
    Ok(bytes)
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error("syncing", dir, e))
}

fn temp_path(path: &Path) -> PathBuf {
    path.with_extension("map.tmp")
}

fn check_key(key: &str) -> Result<()> {
    if valid_key(key) {
        Ok(())
    } else {
        Err(Error::new(
            Kind::InvalidArgument,
            format!("map key {key:?}: 1 to {KEY_BYTES_MAX} of [A-Za-z0-9_=-]"),
        ))
    }
}

fn conflict(key: &str) -> Error {
    Error::new(
        Kind::Conflict,
        format!("{key}: another writer changed it first"),
    )
}

fn damaged(path: &Path, at: usize, why: &str) -> Error {
    Error::new(
        Kind::Other,
        format!(
            "the map file {} is damaged at byte {at}: {why} (restore it from a backup, or move it away to start with an empty map)",
            path.display()
        ),
    )
}

fn poisoned(path: &Path) -> Error {
    Error::new(
        Kind::Other,
        format!("{}: the open maps' lock was poisoned", path.display()),
    )
}

fn io_error(doing: &str, path: &Path, e: io::Error) -> Error {
    Error::Engine(weir::Error::from_io(
        format!("{doing} {}", path.display()),
        e,
    ))
}
