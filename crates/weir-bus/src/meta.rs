//! The bus's own metadata: API tokens, topics and who claimed them, subscriptions
//! with their secrets, and what is being re-driven from dead letters.
//!
//! It is small (bounded by `tokens_max`, `topics_max` and `subscribers_max`), so it
//! is kept whole in memory, as these types; it is stored a key per token, topic and
//! subscription in the backend's map (`meta_map.rs`), on the embedded engine and on
//! JetStream alike. Events are not here: they live in the backend's queues.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// The format version of the model (and of the `meta.json` of earlier weirs: a
/// newer one is refused at its import, `meta_import.rs`).
pub const VERSION: u32 = 1;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Meta {
    pub version: u32,
    /// API tokens: token -> owner name.
    pub tokens: BTreeMap<String, String>,
    pub topics: BTreeMap<String, TopicMeta>,
    /// Subscriptions by subscriber token. Shared between states: a change clones
    /// the map (a pointer per subscription) and copies only the subscriptions it
    /// edits (`Arc::make_mut`), and comparing two states skips a shared one; a
    /// subscription names up to `topics_max` topics.
    pub subscribers: BTreeMap<String, Arc<SubscriberMeta>>,
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
