//! The bus's metadata in the backend's map ([`weir_backend::SharedMap`]): a file of
//! the data directory on the embedded engine, the cluster's map on JetStream.
//!
//! One key per token (`tok-HEX`), topic (`top-HEX`) and subscription (`sub-HEX`),
//! HEX being the hex of the name or token, each value that item's JSON (beside
//! `owner`, which says which instance serves the bus: `owner.rs`): a change
//! writes only the keys it changes, so the metadata is not bounded by a message's
//! size (1 MB by default), only by the bus's limits. Every write is compare-and-set
//! against the revision last read or written here: an instance that no longer serves the
//! bus (another took over) has its write refused ([`weir_backend::Kind::Conflict`])
//! rather than overwrite the newer instance's.
//!
//! A change of several keys is not atomic: it writes tokens and topics before the
//! subscriptions that name them, and deletes subscriptions before what they name,
//! and [`MetaMap::load`] reads any cut of that as a valid state (a subscription
//! without its token is dropped, a topic a subscription names but that is gone is
//! left out, a topic's publisher token gone is cleared), which the next change then
//! writes back.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use weir_backend::{Error, Expect, Kind, SharedMap};

use crate::meta::{Meta, SubscriberMeta, TopicMeta};

/// The key of the instance that serves the bus (`owner.rs`): in the map, not metadata.
pub const OWNER_KEY: &str = "owner";

const TOKEN: &str = "tok-";
const TOPIC: &str = "top-";
const SUBSCRIBER: &str = "sub-";

/// The map, and what it held as last read or written here (key → value, revision).
pub struct MetaMap {
    map: SharedMap,
    written: tokio::sync::Mutex<BTreeMap<String, (Bytes, u64)>>,
}

impl MetaMap {
    pub fn new(map: SharedMap) -> MetaMap {
        MetaMap {
            map,
            written: tokio::sync::Mutex::new(BTreeMap::new()),
        }
    }

    /// Reads the whole metadata from the map (on JetStream, after another instance's
    /// last write).
    pub async fn load(&self) -> weir_backend::Result<Meta> {
        let entries = self.map.list().await?;
        let mut written = self.written.lock().await;
        written.clear();
        let mut meta = Meta::empty();
        for e in entries {
            if e.key == OWNER_KEY {
                // Who serves the bus (`owner.rs`), not metadata.
                continue;
            }
            decode_into(&mut meta, &e.key, &e.value)?;
            written.insert(e.key, (e.value, e.revision));
        }
        normalize(&mut meta);
        Ok(meta)
    }

    /// Writes what differs between `meta` and what the map holds, key by key, as
    /// long as `may_write` says this instance may (it still serves the bus); stops at the
    /// first refusal (what was written stays, and is known here). With `previous`
    /// (the metadata the map holds, as last read or written here), only the items
    /// that differ from it are encoded and compared: a change costs the keys it
    /// changes, not the whole metadata; without, every item is.
    pub async fn write(
        &self,
        meta: &Meta,
        previous: Option<&Meta>,
        may_write: impl Fn() -> bool,
    ) -> weir_backend::Result<()> {
        let next = match previous {
            Some(previous) => encode_changed(previous, meta)?,
            None => encode(meta)?,
        };
        let mut written = self.written.lock().await;
        let changes = match previous {
            Some(_) => ordered_changes(&written, next, false),
            None => ordered_changes(&written, next, true),
        };
        for (key, value) in changes {
            if !may_write() {
                return Err(Error::new(
                    Kind::Conflict,
                    "this instance no longer serves the bus",
                ));
            }
            match value {
                Some(value) => {
                    let expect = written
                        .get(&key)
                        .map_or(Expect::Absent, |(_, r)| Expect::Revision(*r));
                    let revision = self.map.put(&key, value.clone(), expect).await?;
                    written.insert(key, (value, revision));
                }
                None => {
                    if let Some((_, revision)) = written.get(&key) {
                        self.map.delete(&key, *revision).await?;
                    }
                    written.remove(&key);
                }
            }
        }
        Ok(())
    }
}

/// The changes from `written` to `next` (a key's new value, `None` to delete it),
/// in the order that keeps every cut valid: subscriptions deleted, tokens and topics
/// written, subscriptions written, topics and tokens deleted. A value `written`
/// already holds is left out. With `whole`, `next` is every key, and a key of
/// `written` that it lacks is deleted.
fn ordered_changes(
    written: &BTreeMap<String, (Bytes, u64)>,
    next: BTreeMap<String, Option<Bytes>>,
    whole: bool,
) -> Vec<(String, Option<Bytes>)> {
    let rank = |key: &str, put: bool| match (key.starts_with(SUBSCRIBER), put) {
        (true, false) => 0,
        (false, true) => 1,
        (true, true) => 2,
        (false, false) => 3,
    };
    let mut changes: Vec<(u8, String, Option<Bytes>)> = Vec::new();
    if whole {
        for key in written.keys().filter(|k| !next.contains_key(*k)) {
            changes.push((rank(key, false), key.clone(), None));
        }
    }
    for (key, value) in next {
        let same = match (&value, written.get(&key)) {
            (Some(value), Some((old, _))) => old == value,
            (None, None) => true,
            _ => false,
        };
        if !same {
            changes.push((rank(&key, value.is_some()), key, value));
        }
    }
    changes.sort_by_key(|(rank, _, _)| *rank);
    changes.into_iter().map(|(_, k, v)| (k, v)).collect()
}

/// The items that differ between `previous` and `next`, as keys and values (`None`:
/// gone from `next`).
fn encode_changed(
    previous: &Meta,
    next: &Meta,
) -> weir_backend::Result<BTreeMap<String, Option<Bytes>>> {
    let mut out = BTreeMap::new();
    changed(&mut out, TOKEN, &previous.tokens, &next.tokens)?;
    changed(&mut out, TOPIC, &previous.topics, &next.topics)?;
    changed(
        &mut out,
        SUBSCRIBER,
        &previous.subscribers,
        &next.subscribers,
    )?;
    Ok(out)
}

/// The entries of `a` and `b` that differ, encoded under `kind` into `out`.
fn changed<V: PartialEq + Serialize>(
    out: &mut BTreeMap<String, Option<Bytes>>,
    kind: &str,
    a: &BTreeMap<String, V>,
    b: &BTreeMap<String, V>,
) -> weir_backend::Result<()> {
    for (name, value) in b {
        if a.get(name) != Some(value) {
            out.insert(key(kind, name), Some(json(value)?));
        }
    }
    for name in a.keys().filter(|n| !b.contains_key(*n)) {
        out.insert(key(kind, name), None);
    }
    Ok(())
}

/// The metadata as keys and values, every item.
fn encode(meta: &Meta) -> weir_backend::Result<BTreeMap<String, Option<Bytes>>> {
    encode_changed(&Meta::empty(), meta)
}

fn decode_into(meta: &mut Meta, key: &str, value: &[u8]) -> weir_backend::Result<()> {
    let bad = || invalid(format!("the bus's map has a bad key {key:?}"));
    let (kind, name) = (key.get(..4).ok_or_else(bad)?, key.get(4..).ok_or_else(bad)?);
    let name = unhex(name).ok_or_else(bad)?;
    match kind {
        TOKEN => {
            meta.tokens.insert(name, parse::<String>(key, value)?);
        }
        TOPIC => {
            meta.topics.insert(name, parse::<TopicMeta>(key, value)?);
        }
        SUBSCRIBER => {
            meta.subscribers
                .insert(name, Arc::new(parse::<SubscriberMeta>(key, value)?));
        }
        _ => {
            return Err(invalid(format!(
                "the bus's map has a key of a newer weir: {key:?}"
            )))
        }
    }
    Ok(())
}

/// Makes a cut of a multi-key change valid (see the module's doc). Runs at every load
/// (a restart): lookups go through the maps, so 200 subscriptions naming 1,000 topics
/// cost 200,000 of them, not a scan of the topics' names for each (100 million name
/// compares, most of a restart's seconds at that size).
fn normalize(meta: &mut Meta) {
    let Meta {
        tokens,
        topics,
        subscribers,
        ..
    } = meta;
    subscribers.retain(|token, _| tokens.contains_key(token));
    for s in subscribers.values_mut() {
        if s.topics.iter().any(|t| !topics.contains_key(t)) {
            Arc::make_mut(s).topics.retain(|t| topics.contains_key(t));
        }
    }
    for t in topics.values_mut() {
        if t.publisher
            .as_ref()
            .is_some_and(|p| !tokens.contains_key(p))
        {
            t.publisher = None;
        }
    }
}

fn key(kind: &str, name: &str) -> String {
    let mut key = String::with_capacity(kind.len() + 2 * name.len());
    key.push_str(kind);
    for b in name.bytes() {
        key.push_str(&format!("{b:02x}"));
    }
    key
}

fn unhex(hex: &str) -> Option<String> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

fn json<T: Serialize>(value: &T) -> weir_backend::Result<Bytes> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(|e| invalid(e.to_string()))
}

fn parse<T: DeserializeOwned>(key: &str, value: &[u8]) -> weir_backend::Result<T> {
    serde_json::from_slice(value)
        .map_err(|e| invalid(format!("the bus's map has a bad value under {key:?}: {e}")))
}

fn invalid(message: String) -> Error {
    Error::new(Kind::Other, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::{Format, Secret};

    fn subscriber(topics: &[&str]) -> Arc<SubscriberMeta> {
        Arc::new(SubscriberMeta {
            id: "s1".into(),
            uuid: None,
            callback: "https://example.com/hook".into(),
            timeout_ms: 1000,
            max_events: 10,
            topics: topics.iter().map(|t| t.to_string()).collect(),
            format: Format::Routemaster,
            secrets: vec![Secret {
                secret: "whsec_AAAA".into(),
                created_at_ms: 1,
                expires_at_ms: None,
            }],
            redrive_below: 0,
        })
    }

    fn sample() -> Meta {
        let mut meta = Meta::empty();
        meta.tokens.insert("svc--00".into(), "svc".into());
        meta.tokens.insert("sub/é".into(), "reader".into());
        meta.topics.insert(
            "orders".into(),
            TopicMeta {
                publisher: Some("svc--00".into()),
                epoch: 7,
            },
        );
        meta.subscribers
            .insert("sub/é".into(), subscriber(&["orders"]));
        meta
    }

    #[test]
    fn keys_are_subject_tokens_and_read_back() {
        let meta = sample();
        let encoded: BTreeMap<String, Bytes> = encode(&meta)
            .unwrap()
            .into_iter()
            .map(|(k, v)| (k, v.unwrap()))
            .collect();
        for k in encoded.keys() {
            assert!(k
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'=')));
        }
        let mut read = Meta::empty();
        for (k, v) in &encoded {
            decode_into(&mut read, k, v).unwrap();
        }
        assert_eq!(read, meta);
        let longest = key(SUBSCRIBER, &"x".repeat(crate::names::NAME_BYTES_MAX));
        assert!(longest.len() <= weir_backend::MAP_KEY_BYTES_MAX);
        assert!(decode_into(&mut read, "tok-zz", b"\"a\"").is_err());
        assert!(decode_into(&mut read, "abcé", b"\"a\"").is_err());
        assert!(decode_into(&mut read, "to", b"\"a\"").is_err());
        assert!(decode_into(&mut read, "new-00", b"{}").is_err());
        assert!(decode_into(&mut read, "tok-61", b"{not json").is_err());
    }

    #[test]
    fn changes_come_in_an_order_whose_every_cut_is_valid() {
        let before = sample();
        let written: BTreeMap<String, (Bytes, u64)> = encode(&before)
            .unwrap()
            .into_iter()
            .map(|(k, v)| (k, (v.unwrap(), 1)))
            .collect();
        // The subscriber's token is deleted and a new token subscribes to a new topic.
        let mut after = before.clone();
        after.tokens.remove("sub/é");
        after.subscribers.remove("sub/é");
        after.tokens.insert("t2".into(), "two".into());
        after.topics.insert(
            "new".into(),
            TopicMeta {
                publisher: None,
                epoch: 1,
            },
        );
        after.subscribers.insert("t2".into(), subscriber(&["new"]));
        let changes = ordered_changes(&written, encode(&after).unwrap(), true);
        // The same changes from the two states alone (what a change writes).
        let only = ordered_changes(&written, encode_changed(&before, &after).unwrap(), false);
        assert_eq!(only, changes);
        // A change of one item encodes that item alone.
        let mut one = before.clone();
        one.tokens.insert("t3".into(), "three".into());
        let keys: Vec<String> = encode_changed(&before, &one).unwrap().into_keys().collect();
        assert_eq!(keys, vec![key(TOKEN, "t3")]);
        let keys: Vec<(String, bool)> = changes
            .iter()
            .map(|(k, v)| (k.clone(), v.is_some()))
            .collect();
        assert_eq!(
            keys,
            vec![
                (key(SUBSCRIBER, "sub/é"), false),
                (key(TOKEN, "t2"), true),
                (key(TOPIC, "new"), true),
                (key(SUBSCRIBER, "t2"), true),
                (key(TOKEN, "sub/é"), false),
            ]
        );
        // Every prefix of those writes, read back as it is, is a valid state.
        for cut in 0..=changes.len() {
            let mut state: BTreeMap<String, Bytes> = written
                .iter()
                .map(|(k, (v, _))| (k.clone(), v.clone()))
                .collect();
            for (k, v) in &changes[..cut] {
                match v {
                    Some(v) => state.insert(k.clone(), v.clone()),
                    None => state.remove(k),
                };
            }
            let mut read = Meta::default();
            for (k, v) in &state {
                decode_into(&mut read, k, v).unwrap();
            }
            for (token, s) in &read.subscribers {
                assert!(read.tokens.contains_key(token), "cut {cut}");
                assert!(
                    s.topics.iter().all(|t| read.topics.contains_key(t)),
                    "cut {cut}"
                );
            }
        }
    }

    #[test]
    fn a_cut_is_made_valid_on_load() {
        let mut meta = sample();
        meta.tokens.remove("svc--00");
        meta.topics.remove("orders");
        meta.subscribers.insert("ghost".into(), subscriber(&[]));
        normalize(&mut meta);
        assert!(!meta.subscribers.contains_key("ghost"));
        assert!(meta.subscribers["sub/é"].topics.is_empty());
        let mut meta = sample();
        meta.tokens.remove("svc--00");
        normalize(&mut meta);
        assert_eq!(meta.topics["orders"].publisher, None);
    }
}
