//! The bus's metadata as earlier weirs kept it on the embedded engine:
//! `DATA_DIR/bus/meta.json`, the whole [`Meta`] in one JSON file, rewritten on every
//! change. At the first start of this weir on such a data directory the file is
//! imported into the bus's map (`meta_map.rs`), copied to `meta.json.imported`, and
//! replaced by a stub of version [`IMPORTED_VERSION`] (each step fsync'ed): from
//! then on the map is the metadata. The stub is there for a rollback: an earlier
//! weir started on this data directory refuses a `meta.json` of a version it does
//! not read, and stops, where with no file it would take the bus for empty and
//! delete every `bus:*` queue it does not name.
//!
//! An import cut short (a kill) leaves the full `meta.json` in place, with some of
//! its keys written: the next start imports it again, writing what differs (the file
//! is the truth until the stub replaces it, in one rename), so an import is done
//! once, whole.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::meta::{Meta, VERSION};
use crate::meta_map::MetaMap;

const FILE_NAME: &str = "meta.json";
/// What an earlier weir left of a write cut short: never the confirmed state.
const TEMP_NAME: &str = "meta.json.tmp";
/// A copy of `meta.json` as it was imported.
pub const IMPORTED_NAME: &str = "meta.json.imported";
/// The copy, while it is written.
const IMPORTED_TEMP: &str = "meta.json.imported.tmp";
/// The version of the stub left as `meta.json` once imported: above [`VERSION`],
/// the last an earlier weir reads.
pub const IMPORTED_VERSION: u32 = VERSION + 1;
/// The file's size limit when read: far above what the limits allow.
const FILE_BYTES_MAX: u64 = 256 * 1024 * 1024;

/// Imports `data_dir/bus/meta.json` into `map` when there is one (see the module's
/// doc); nothing to do otherwise.
pub async fn import(map: &MetaMap, data_dir: &Path) -> anyhow::Result<()> {
    let dir = data_dir.join("bus");
    let read = {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || read(&dir))
            .await
            .context("reading the bus's meta.json")??
    };
    let Some(meta) = read else {
        return Ok(());
    };
    let path = dir.join(FILE_NAME);
    // What an import cut short wrote: the file's state is written over it.
    map.load()
        .await
        .context("reading the bus's metadata map before the import")?;
    map.write(&meta, None, || true)
        .await
        .with_context(|| format!("importing {} into the bus's metadata map", path.display()))?;
    tokio::task::spawn_blocking(move || retire(&dir))
        .await
        .context("replacing the bus's meta.json by its stub")??;
    tracing::info!(
        file = %path.display(),
        topics = meta.topics.len(),
        subscriptions = meta.subscribers.len(),
        "imported the bus's metadata into its map; the file is kept as {IMPORTED_NAME}"
    );
    Ok(())
}

/// `dir/meta.json` as an earlier weir wrote it; `None` when there is none. A
/// leftover temporary file (a kill mid-write) is removed: it was never renamed,
/// so the file is the state the API last confirmed.
fn read(dir: &Path) -> io::Result<Option<Meta>> {
    let temp = dir.join(TEMP_NAME);
    if temp.exists() {
        fs::remove_file(&temp)?;
    }
    let path = dir.join(FILE_NAME);
    match fs::metadata(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
        Ok(m) if m.len() > FILE_BYTES_MAX => Err(invalid(format!(
            "{} is larger than {FILE_BYTES_MAX} bytes",
            path.display()
        ))),
        Ok(_) => {
            let bytes = fs::read(&path)?;
            let meta: Meta = serde_json::from_slice(&bytes)
                .map_err(|e| invalid(format!("{} is not valid: {e}", path.display())))?;
            if meta.version == IMPORTED_VERSION {
                // Imported already: the stub this module leaves.
                return Ok(None);
            }
            if meta.version > VERSION {
                return Err(invalid(format!(
                    "{} has version {}; this weir reads up to {VERSION}",
                    path.display(),
                    meta.version
                )));
            }
            Ok(Some(meta))
        }
    }
}

/// Copies `meta.json` to [`IMPORTED_NAME`], then replaces it by the stub (see the
/// module's doc), each durable before the next: once done, the map alone is read.
fn retire(dir: &Path) -> io::Result<()> {
    let path = dir.join(FILE_NAME);
    let bytes = fs::read(&path)?;
    write_durably(dir, IMPORTED_TEMP, IMPORTED_NAME, &bytes)?;
    let stub = Meta {
        version: IMPORTED_VERSION,
        ..Meta::default()
    };
    let stub = serde_json::to_vec(&stub).map_err(|e| invalid(e.to_string()))?;
    write_durably(dir, TEMP_NAME, FILE_NAME, &stub)
}

/// Writes `bytes` to `dir/temp`, fsyncs it, renames it to `dir/name` and fsyncs
/// the directory.
fn write_durably(dir: &Path, temp: &str, name: &str, bytes: &[u8]) -> io::Result<()> {
    let temp: PathBuf = dir.join(temp);
    let mut f = File::create(&temp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    fs::rename(&temp, dir.join(name))?;
    File::open(dir)?.sync_all()
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `meta.json` as weir wrote it before the map (`MetaFile::write`: the
    /// `serde_json` of `Meta`), with tokens, a claimed topic and a subscription;
    /// `tests/api.rs` imports it.
    const FIXTURE: &str = include_str!("../tests/fixtures/meta.json");

    #[test]
    fn the_fixture_is_what_the_old_code_wrote() {
        let meta: Meta = serde_json::from_str(FIXTURE).unwrap();
        assert_eq!(serde_json::to_string(&meta).unwrap(), FIXTURE);
    }

    #[test]
    fn a_damaged_or_newer_file_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        fs::write(&path, b"{not json").unwrap();
        let e = read(dir.path()).err().unwrap();
        assert!(e.to_string().contains("meta.json"), "{e}");
        fs::write(
            &path,
            br#"{"version":99,"tokens":{},"topics":{},"subscribers":{}}"#,
        )
        .unwrap();
        let e = read(dir.path()).err().unwrap();
        assert!(e.to_string().contains("version 99"), "{e}");
    }

    #[test]
    fn the_stub_left_after_an_import_is_nothing_to_import_and_keeps_the_copy() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(FILE_NAME), FIXTURE).unwrap();
        retire(dir.path()).unwrap();
        assert!(read(dir.path()).unwrap().is_none());
        assert_eq!(
            fs::read_to_string(dir.path().join(IMPORTED_NAME)).unwrap(),
            FIXTURE
        );
        // An earlier weir reads the stub's version and refuses it (it reads up to
        // VERSION), rather than taking the bus for empty.
        let stub: Meta =
            serde_json::from_slice(&fs::read(dir.path().join(FILE_NAME)).unwrap()).unwrap();
        assert!(stub.version > VERSION);
        assert!(!dir.path().join(IMPORTED_TEMP).exists());
    }

    #[test]
    fn a_leftover_temp_file_is_removed_and_no_file_is_nothing_to_import() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(TEMP_NAME), b"{\"half").unwrap();
        assert!(read(dir.path()).unwrap().is_none());
        assert!(!dir.path().join(TEMP_NAME).exists());
    }
}
