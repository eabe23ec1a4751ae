//! The power-cut tool: records what each fsync of the engine makes durable (through
//! `weir::fault::observe_syncs`) and builds crash images of a store's directory. Used
//! by `power_cut.rs` and by the model test; how it works is in that file's docs and in
//! docs/architecture.md.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rand::rngs::StdRng;
use rand::Rng;
use weir::fault::{observe_syncs, stop_observing, Synced};

const PAGE_BYTES: usize = 4096;

// --- The power-cut tool -------------------------------------------------------------

/// A file or directory: its inode and its birth time. A deleted file's inode number is
/// reused by the next file created, so the inode alone would give a new file the
/// durable content of a deleted one (a queue deleted and made again under the same
/// name would come back from a cut with the old queue's readers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Id {
    ino: u64,
    born_ns: u128,
}

fn id_of(meta: &fs::Metadata) -> Id {
    let born_ns = meta
        .created()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    Id {
        ino: meta.ino(),
        born_ns,
    }
}

/// A directory entry: what it names and its kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    id: Id,
    is_dir: bool,
}

type Listing = BTreeMap<OsString, Entry>;

/// What the fsyncs so far made durable, by file.
#[derive(Default)]
struct Durable {
    files: HashMap<Id, Vec<u8>>,
    dirs: HashMap<Id, Listing>,
}

/// Records what each fsync under `root` makes durable and takes crash images.
pub struct PowerCut {
    root: PathBuf,
    durable: Mutex<Durable>,
    observer: u64,
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn listing(dir: &Path) -> io::Result<Listing> {
    let mut out = Listing::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let meta = match entry.metadata() {
            Ok(meta) => meta,
            // Removed since the listing was read: not there now.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        out.insert(
            entry.file_name(),
            Entry {
                id: id_of(&meta),
                is_dir: meta.is_dir(),
            },
        );
    }
    Ok(out)
}

fn read_whole(file: &fs::File) -> io::Result<Vec<u8>> {
    let len = file.metadata()?.len() as usize;
    let mut bytes = vec![0u8; len];
    let mut at = 0;
    while at < len {
        match file.read_at(&mut bytes[at..], at as u64)? {
            0 => break,
            n => at += n,
        }
    }
    bytes.truncate(at);
    Ok(bytes)
}

impl PowerCut {
    /// Starts recording the fsyncs of files and directories under `root` (which
    /// exists, empty).
    pub fn install(root: &Path) -> Arc<PowerCut> {
        let root = root.canonicalize().unwrap();
        let cut = Arc::new_cyclic(|me: &std::sync::Weak<PowerCut>| {
            let me = me.clone();
            let observer = observe_syncs(Arc::new(move |what| {
                if let Some(cut) = me.upgrade() {
                    cut.record(what);
                }
            }));
            PowerCut {
                root: root.clone(),
                durable: Mutex::new(Durable::default()),
                observer,
            }
        });
        // The root and everything in it now are taken as durable (a fresh root is
        // empty; the root of a crash image holds what survived the cut).
        let mut durable = lock(&cut.durable);
        record_tree(&cut.root, &mut durable).unwrap();
        drop(durable);
        cut
    }

    fn record(&self, what: Synced<'_>) {
        match what {
            Synced::File(file) => {
                let Ok(path) = fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())) else {
                    return;
                };
                if !path.starts_with(&self.root) {
                    return;
                }
                let mut durable = lock(&self.durable);
                let (Ok(meta), Ok(bytes)) = (file.metadata(), read_whole(file)) else {
                    return;
                };
                durable.files.insert(id_of(&meta), bytes);
            }
            Synced::Dir(dir) => {
                let Ok(dir) = dir.canonicalize() else {
                    return;
                };
                if !dir.starts_with(&self.root) {
                    return;
                }
                let mut durable = lock(&self.durable);
                if let (Ok(meta), Ok(entries)) = (fs::metadata(&dir), listing(&dir)) {
                    durable.dirs.insert(id_of(&meta), entries);
                }
            }
        }
    }

    /// Takes a crash image into `image` (which must not exist). `freeze` runs first,
    /// while fsyncs are held back: what it captures (the ledger) is what was
    /// acknowledged at the instant of the cut. `keep` is the chance that an unsynced
    /// change survives.
    pub fn cut<T>(
        &self,
        rng: &mut StdRng,
        keep: f64,
        image: &Path,
        freeze: impl FnOnce() -> T,
    ) -> io::Result<T> {
        let durable = lock(&self.durable);
        let frozen = freeze();
        let mut current = Current::default();
        current.scan(&self.root)?;
        let root = id_of(&fs::metadata(&self.root)?);
        let mut build = Build {
            durable: &durable,
            current: &current,
            rng,
            keep,
        };
        build.dir(root, image)?;
        Ok(frozen)
    }
}

impl Drop for PowerCut {
    fn drop(&mut self) {
        stop_observing(self.observer);
    }
}

/// Records every directory's entries and every file's content under `dir` as durable.
fn record_tree(dir: &Path, durable: &mut Durable) -> io::Result<()> {
    let entries = listing(dir)?;
    for (name, entry) in &entries {
        let path = dir.join(name);
        if entry.is_dir {
            record_tree(&path, durable)?;
        } else {
            durable.files.insert(entry.id, fs::read(&path)?);
        }
    }
    durable.dirs.insert(id_of(&fs::metadata(dir)?), entries);
    Ok(())
}

/// The tree as it is now: listings by directory, paths by file.
#[derive(Default)]
struct Current {
    dirs: HashMap<Id, Listing>,
    files: HashMap<Id, PathBuf>,
}

impl Current {
    fn scan(&mut self, dir: &Path) -> io::Result<()> {
        let id = id_of(&fs::metadata(dir)?);
        let entries = listing(dir)?;
        for (name, entry) in &entries {
            let path = dir.join(name);
            if entry.is_dir {
                // A directory removed meanwhile is simply not there now.
                let _ = self.scan(&path);
            } else {
                self.files.insert(entry.id, path);
            }
        }
        self.dirs.insert(id, entries);
        Ok(())
    }
}

struct Build<'a> {
    durable: &'a Durable,
    current: &'a Current,
    rng: &'a mut StdRng,
    keep: f64,
}

impl Build<'_> {
    fn dir(&mut self, id: Id, to: &Path) -> io::Result<()> {
        fs::create_dir_all(to)?;
        let empty = Listing::new();
        let durable = self.durable.dirs.get(&id).unwrap_or(&empty);
        let entries = match self.current.dirs.get(&id) {
            Some(now) => self.choose_entries(durable, now),
            None => durable.clone(),
        };
        for (name, entry) in entries {
            let path = to.join(&name);
            if entry.is_dir {
                self.dir(entry.id, &path)?;
            } else {
                let bytes = self.file(entry.id)?;
                fs::write(&path, bytes)?;
            }
        }
        Ok(())
    }

    /// The entries after the cut: the durable ones, each change since kept or not.
    fn choose_entries(&mut self, durable: &Listing, now: &Listing) -> Listing {
        let mut out = Listing::new();
        let mut decided: HashSet<OsString> = HashSet::new();
        // A rename: the same file under a new name now, under an old name durably.
        for (new_name, entry) in now {
            if durable.get(new_name) == Some(entry) {
                continue;
            }
            let old = durable
                .iter()
                .find(|(n, e)| e.id == entry.id && *n != new_name && now.get(*n) != Some(e));
            if let Some((old_name, old_entry)) = old {
                if self.rng.gen_bool(self.keep) {
                    out.insert(new_name.clone(), *entry);
                    if let Some(e) = now.get(old_name) {
                        out.insert(old_name.clone(), *e);
                    }
                } else {
                    out.insert(old_name.clone(), *old_entry);
                    if let Some(e) = durable.get(new_name) {
                        out.insert(new_name.clone(), *e);
                    }
                }
                decided.insert(new_name.clone());
                decided.insert(old_name.clone());
            }
        }
        let names: HashSet<&OsString> = durable.keys().chain(now.keys()).collect();
        for name in names {
            if decided.contains(name) {
                continue;
            }
            let (was, is) = (durable.get(name), now.get(name));
            let chosen = if was == is || !self.rng.gen_bool(self.keep) {
                was
            } else {
                is
            };
            if let Some(e) = chosen {
                out.insert(name.clone(), *e);
            }
        }
        out
    }

    /// A file after the cut: its durable content, each page written since kept or not.
    fn file(&mut self, id: Id) -> io::Result<Vec<u8>> {
        let durable: &[u8] = self.durable.files.get(&id).map_or(&[], |v| &v[..]);
        let now = match self.current.files.get(&id) {
            Some(path) => match fs::read(path) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(durable.to_vec()),
                Err(e) => return Err(e),
            },
            None => return Ok(durable.to_vec()),
        };
        let len = if durable.len() == now.len() || self.rng.gen_bool(self.keep) {
            now.len()
        } else {
            durable.len()
        };
        let page = |bytes: &[u8], at: usize, end: usize| -> Vec<u8> {
            let mut out = vec![0u8; end - at];
            if at < bytes.len() {
                let n = (bytes.len().min(end)) - at;
                out[..n].copy_from_slice(&bytes[at..at + n]);
            }
            out
        };
        let mut out = Vec::with_capacity(len);
        for at in (0..len).step_by(PAGE_BYTES) {
            let end = (at + PAGE_BYTES).min(len);
            let (was, is) = (page(durable, at, end), page(&now, at, end));
            if was == is || !self.rng.gen_bool(self.keep) {
                out.extend_from_slice(&was);
            } else {
                out.extend_from_slice(&is);
            }
        }
        Ok(out)
    }
}
