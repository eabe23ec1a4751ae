//! A small replicated map in the cluster, for a front door's own metadata (the event
//! bus's tokens, topics and subscriptions) and for choosing which instance does what.
//!
//! One stream per map, `<stream>_MAP_<NAME>` (file storage, the stream's replicas, one
//! message per subject, no Direct Get), a subject per key,
//! `_weir.<stream>.map.<name>.<key>`. A key's revision is the stream sequence of its
//! value; a write can require the revision it expects
//! (`Nats-Expected-Last-Subject-Sequence`, 0 for "absent"), which makes
//! compare-and-set writes: of two instances writing from the same revision, one wins and
//! the other gets [`Kind::Conflict`] (unless the key then holds the very value it
//! wrote: a retried write whose first attempt was stored, its reply lost, is done). A delete purges the key's messages up to the
//! revision it expects, so it never removes a newer value.
//!
//! Every read asks the stream's leader (`STREAM.MSG.GET`): a replica behind could
//! answer an older value, and an instance that takes over from another must see what the
//! other last wrote.

use async_nats::{HeaderMap, Request};
use base64::Engine;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;
use tokio::time::Instant;

use super::api::{Api, Backoff, Sent};
use super::errors::{code, unavailable, unexpected};
use super::pub_ack::PubAck;
use crate::error::{Error, Kind, Result};

pub use crate::map_entry::{Entry, Expect, KEY_BYTES_MAX};

/// How many keys [`SharedMap::list`] reads at most: a map is small by design.
const LIST_MAX: usize = 1_000_000;

/// A map of the cluster; cheap to clone.
#[derive(Clone)]
pub struct SharedMap {
    api: Api,
    stream: String,
    /// `_weir.<stream>.map.<name>.`
    prefix: String,
}

/// A `STREAM.MSG.GET` answer (the fields weir reads).
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct MsgGet {
    pub message: StoredMsg,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct StoredMsg {
    pub subject: String,
    pub seq: u64,
    /// Base64.
    pub data: Option<String>,
}

impl SharedMap {
    /// Sets up map `name` (`[a-z0-9_]{1,32}`) on the cluster: its stream is created
    /// or brought to this layout.
    pub(super) async fn open(
        api: Api,
        stream: &str,
        name: &str,
        replicas: usize,
    ) -> Result<SharedMap> {
        let valid = !name.is_empty()
            && name.len() <= 32
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !valid {
            return Err(Error::new(
                Kind::InvalidName,
                format!("map name {name:?}: 1 to 32 of [a-z0-9_]"),
            ));
        }
        let map = SharedMap {
            stream: format!("{stream}_MAP_{}", name.to_ascii_uppercase()),
            prefix: format!("_weir.{stream}.map.{name}."),
            api,
        };
        let config = json!({
            "name": map.stream,
            "subjects": [format!("{}>", map.prefix)],
            "retention": "limits",
            "storage": "file",
            "num_replicas": replicas,
            "allow_direct": false,
            "max_msgs_per_subject": 1,
            "discard": "old",
        });
        map.api
            .create_or_update_stream(&map.stream, &config, map.api.deadline())
            .await?;
        Ok(map)
    }

    /// The key's value, as the stream's leader has it.
    pub async fn get(&self, key: &str) -> Result<Option<Entry>> {
        let subject = self.subject(key)?;
        self.leader_get(&json!({ "last_by_subj": subject }), self.api.deadline())
            .await
    }

    /// Every key and value, in the order they were last written: one read per key,
    /// each with a deadline of its own.
    pub async fn list(&self) -> Result<Vec<Entry>> {
        let filter = format!("{}>", self.prefix);
        let mut entries = Vec::new();
        let mut from = 1;
        while let Some(entry) = self
            .leader_get(
                &json!({ "seq": from, "next_by_subj": filter }),
                self.api.deadline(),
            )
            .await?
        {
            if entries.len() >= LIST_MAX {
                return Err(unexpected(format!(
                    "map {} holds more than {LIST_MAX} keys",
                    self.stream
                )));
            }
            from = entry.revision + 1;
            entries.push(entry);
        }
        Ok(entries)
    }

    /// Writes `value` under `key` if the key is as `expect` says; answers the new
    /// revision, or [`Kind::Conflict`] when the key was not as expected (another
    /// writer was first).
    pub async fn put(&self, key: &str, value: Bytes, expect: Expect) -> Result<u64> {
        let subject = self.subject(key)?;
        let mut headers = HeaderMap::new();
        let expected = match expect {
            Expect::Absent => 0,
            Expect::Revision(r) => r,
        };
        headers.insert("Nats-Expected-Last-Subject-Sequence", expected.to_string());
        let deadline = self.api.deadline();
        let mut backoff = Backoff::new(deadline);
        loop {
            let request = Request::new()
                .headers(headers.clone())
                .payload(value.clone());
            let why = match self.api.send(subject.clone(), request, deadline).await {
                Sent::Reply(m) => match serde_json::from_slice::<PubAck>(&m.payload) {
                    Ok(PubAck { error: None, seq }) if seq > 0 => return Ok(seq),
                    Ok(PubAck { error: Some(e), .. })
                        if matches!(
                            e.err_code,
                            code::WRONG_LAST_SEQUENCE | code::WRONG_LAST_SEQUENCE_CONSTANT
                        ) =>
                    {
                        return self.on_conflict(key, &value).await;
                    }
                    Ok(PubAck { error: Some(e), .. }) if e.is_transient() => e.description,
                    Ok(PubAck { error: Some(e), .. }) => return Err(e.to_error()),
                    _ => return Err(unexpected(String::from_utf8_lossy(&m.payload))),
                },
                Sent::NoResponders => "no responders (stream leader election?)".to_owned(),
                Sent::Failed(why) => why,
                Sent::Refused(e) => return Err(e),
            };
            if !backoff.pause(&self.api.metrics).await {
                return Err(unavailable(format!("writing {subject}: {why}")));
            }
        }
    }

    /// A conflict on a write: the key already holds this very value (an earlier
    /// attempt of this write, or an earlier write whose acknowledgement was lost, was
    /// stored), and then the write is done at that revision; or another writer was
    /// first.
    async fn on_conflict(&self, key: &str, value: &Bytes) -> Result<u64> {
        if let Some(now) = self.get(key).await? {
            if now.value == *value {
                return Ok(now.revision);
            }
        }
        Err(Error::new(
            Kind::Conflict,
            format!("{key}: another writer changed it first"),
        ))
    }

    /// Removes `key` if its value is at `revision` (a newer value stays: then
    /// [`Kind::Conflict`]); false when it had no value.
    pub async fn delete(&self, key: &str, revision: u64) -> Result<bool> {
        let subject = self.subject(key)?;
        let api = format!("STREAM.PURGE.{}", self.stream);
        let body = json!({ "filter": subject, "seq": revision.saturating_add(1) });
        let purged: super::admin::Purged = self.api.json(&api, &body, self.api.deadline()).await?;
        if purged.purged > 0 {
            return Ok(true);
        }
        match self.get(key).await? {
            None => Ok(false),
            Some(_) => Err(Error::new(
                Kind::Conflict,
                format!("{key}: another writer changed it first"),
            )),
        }
    }

    /// The subject of `key`, refused when it is not a valid key.
    fn subject(&self, key: &str) -> Result<String> {
        if !valid_key(key) {
            return Err(Error::new(
                Kind::InvalidArgument,
                format!("map key {key:?}: 1 to {KEY_BYTES_MAX} of [A-Za-z0-9_=-]"),
            ));
        }
        Ok(format!("{}{key}", self.prefix))
    }

    async fn leader_get(
        &self,
        query: &serde_json::Value,
        deadline: Instant,
    ) -> Result<Option<Entry>> {
        let api = format!("STREAM.MSG.GET.{}", self.stream);
        let got = match self
            .api
            .json_or_api_error::<MsgGet>(&api, query, deadline)
            .await?
        {
            Ok(got) if got.message.seq > 0 => got.message,
            Ok(_) => return Err(unexpected("a message get without a sequence")),
            Err(e) if e.err_code == code::NO_MESSAGE_FOUND => return Ok(None),
            Err(e) => return Err(e.to_error()),
        };
        let value = base64::engine::general_purpose::STANDARD
            .decode(got.data.unwrap_or_default())
            .map_err(|e| unexpected(format!("a map value's base64: {e}")))?;
        let key = got
            .subject
            .strip_prefix(&self.prefix)
            .filter(|k| valid_key(k))
            .ok_or_else(|| unexpected(format!("{} is not a key of this map", got.subject)))?;
        Ok(Some(Entry {
            key: key.to_owned(),
            value: Bytes::from(value),
            revision: got.seq,
        }))
    }
}

/// 1 to [`KEY_BYTES_MAX`] of `[A-Za-z0-9_=-]`.
fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= KEY_BYTES_MAX
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'=' | b'-'))
}
