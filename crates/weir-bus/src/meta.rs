//! The bus's own metadata: API tokens, topics and who claimed them, subscriptions
//! with their secrets, and what is being re-driven from dead letters.
//!
//! It is small (bounded by `tokens_max`, `topics_max` and `subscribers_max`) and
//! changes rarely (a new token, topic or subscription), so it is kept whole in memory
//! and written whole to `DATA_DIR/bus/meta.json` on every change: a new file is
//! written and fsync'ed, renamed over the old one, and the directory fsync'ed, before
//! the API answers. A kill at any instant leaves either the old or the new file;
//! never half of one. Events are not here: they live in the backend's queues.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The format version written; a file of a newer version is refused at start.
pub const VERSION: u32 = 1;
const FILE_NAME: &str = "meta.json";
const TEMP_NAME: &str = "meta.json.tmp";
/// The metadata file's size limit when read: far above what the limits allow.
const FILE_BYTES_MAX: u64 = 256 * 1024 * 1024;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Meta {
    pub version: u32,
    /// API tokens: token -> owner name.
    pub tokens: BTreeMap<String, String>,
    pub topics: BTreeMap<String, TopicMeta>,
    /// Subscriptions by subscriber token.
    pub subscribers: BTreeMap<String, SubscriberMeta>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TopicMeta {
    /// The token that claimed it by publishing first.
    pub publisher: Option<String>,
    /// Random per incarnation of the topic, part of every event id, so that a topic
    /// deleted and created again (its seqs start over) never repeats an id.
    pub epoch: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SubscriberMeta {
    /// Names the subscriber in the backend (its reader on each topic, its dead-letter
    /// queue), in logs and in metrics: random, never the token (a credential).
    pub id: String,
    pub uuid: Option<String>,
    pub callback: String,
    pub timeout_ms: u64,
    pub max_events: u64,
    pub topics: Vec<String>,
    pub format: Format,
    /// Signing secrets, newest first; an older one signs until `expires_at_ms`.
    pub secrets: Vec<Secret>,
    /// Dead letters with a seq below this are being re-driven.
    pub redrive_below: u64,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// routemaster's JSON array of events.
    #[default]
    Routemaster,
    /// `application/cloudevents-batch+json`.
    Cloudevents,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Secret {
    /// `whsec_` and the base64 of the key.
    pub secret: String,
    pub created_at_ms: u64,
    /// When a rotated-out secret stops signing; `None` for the current one.
    pub expires_at_ms: Option<u64>,
}

impl Meta {
    /// No tokens, topics or subscriptions, in this weir's format.
    pub fn empty() -> Meta {
        Meta {
            version: VERSION,
            ..Meta::default()
        }
    }
}

/// Where the metadata is kept: this file on the embedded engine, the cluster's map
/// on JetStream (`meta_map.rs`).
pub enum MetaStore {
    File(MetaFile),
    /// Set once the cluster answered.
    Map(Box<std::sync::OnceLock<crate::meta_map::MetaMap>>),
}

/// Where the metadata lives, and its last written state.
pub struct MetaFile {
    dir: PathBuf,
}

impl MetaFile {
    /// Reads `DATA_DIR/bus/meta.json` (creating the directory; an absent file is an
    /// empty bus). A leftover temporary file (a kill mid-write) is removed: the
    /// rename had not happened, so the old file is the state the API last confirmed.
    pub fn open(data_dir: &Path) -> io::Result<(MetaFile, Meta)> {
        let dir = data_dir.join("bus");
        fs::create_dir_all(&dir)?;
        let temp = dir.join(TEMP_NAME);
        if temp.exists() {
            fs::remove_file(&temp)?;
        }
        let path = dir.join(FILE_NAME);
        let meta = match fs::metadata(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Meta::empty(),
            Err(e) => return Err(e),
            Ok(m) if m.len() > FILE_BYTES_MAX => {
                return Err(invalid(format!(
                    "{} is larger than {FILE_BYTES_MAX} bytes",
                    path.display()
                )))
            }
            Ok(_) => {
                let bytes = fs::read(&path)?;
                let meta: Meta = serde_json::from_slice(&bytes)
                    .map_err(|e| invalid(format!("{} is not valid: {e}", path.display())))?;
                if meta.version > VERSION {
                    return Err(invalid(format!(
                        "{} has version {}; this weir reads up to {VERSION}",
                        path.display(),
                        meta.version
                    )));
                }
                meta
            }
        };
        Ok((MetaFile { dir }, meta))
    }

    /// Writes `meta` durably: temporary file (mode 0600), fsync, rename, fsync of the
    /// directory.
    pub fn write(&self, meta: &Meta) -> io::Result<()> {
        let bytes = serde_json::to_vec(meta).map_err(|e| invalid(e.to_string()))?;
        let temp = self.dir.join(TEMP_NAME);
        let result = (|| {
            // Owner-only: it holds tokens and signing secrets.
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&temp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            fs::rename(&temp, self.dir.join(FILE_NAME))?;
            File::open(&self.dir)?.sync_all()
        })();
        if result.is_err() {
            // A full disk leaves a partial temporary file: remove it, the old file
            // stands.
            let _ = fs::remove_file(&temp);
        }
        result
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_state_is_read_back_and_a_leftover_temp_file_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let (file, mut meta) = MetaFile::open(dir.path()).unwrap();
        assert_eq!(meta.version, VERSION);
        meta.tokens.insert("svc--00".into(), "svc".into());
        meta.topics.insert(
            "orders".into(),
            TopicMeta {
                publisher: Some("svc--00".into()),
                epoch: 7,
            },
        );
        file.write(&meta).unwrap();
        fs::write(dir.path().join("bus").join(TEMP_NAME), b"{\"half").unwrap();
        let (_, read) = MetaFile::open(dir.path()).unwrap();
        assert_eq!(read, meta);
        assert!(!dir.path().join("bus").join(TEMP_NAME).exists());
    }

    #[test]
    fn a_damaged_or_newer_file_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("bus")).unwrap();
        let path = dir.path().join("bus").join(FILE_NAME);
        fs::write(&path, b"{not json").unwrap();
        let e = MetaFile::open(dir.path()).err().unwrap();
        assert!(e.to_string().contains("meta.json"), "{e}");
        fs::write(
            &path,
            br#"{"version":99,"tokens":{},"topics":{},"subscribers":{}}"#,
        )
        .unwrap();
        let e = MetaFile::open(dir.path()).err().unwrap();
        assert!(e.to_string().contains("version 99"), "{e}");
    }
}
