//! What a change of the metadata touches, so that it costs what it changes.
//!
//! [`Touched::between`] compares two states key by key (tokens, topics,
//! subscriptions): the topics whose queue or readers may need work (a topic made,
//! deleted or claimed; a topic a subscription joined or left) and the subscribers
//! whose worker may need work (made, deleted, changed, or their token's owner
//! renamed). [`ByTopic`] is the standing index topic → subscriber tokens, kept in
//! step by the same differences, so that a topic's subscribers are found without
//! walking every subscription.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::meta::{Meta, SubscriberMeta};

/// The topics and subscribers (by token) a change touches.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Touched {
    pub topics: BTreeSet<String>,
    pub subscribers: BTreeSet<String>,
    /// Topic → the ids of the subscriptions that did not have it before (their
    /// reader there starts at the topic's end).
    pub joined: BTreeMap<String, BTreeSet<String>>,
}

impl Touched {
    pub fn is_empty(&self) -> bool {
        self.topics.is_empty() && self.subscribers.is_empty()
    }

    /// The differences between `previous` and `next`.
    pub fn between(previous: &Meta, next: &Meta) -> Touched {
        let mut touched = Touched::default();
        for name in changed_keys(&previous.topics, &next.topics) {
            touched.topics.insert(name.to_owned());
        }
        for token in changed_keys(&previous.tokens, &next.tokens) {
            if previous.subscribers.contains_key(token) || next.subscribers.contains_key(token) {
                touched.subscribers.insert(token.to_owned());
            }
        }
        for token in changed_keys(&previous.subscribers, &next.subscribers) {
            touched.subscribers.insert(token.to_owned());
            let (before, after) = (
                previous.subscribers.get(token).map(|s| &**s),
                next.subscribers.get(token).map(|s| &**s),
            );
            let (moved, joined) = moved_topics(before, after);
            for topic in moved {
                touched.topics.insert(topic.to_owned());
            }
            if let Some(s) = after {
                for topic in joined {
                    touched
                        .joined
                        .entry(topic.to_owned())
                        .or_default()
                        .insert(s.id.clone());
                }
            }
        }
        touched
    }
}

/// The keys whose value differs between `a` and `b` (present in one only, or
/// unequal), each once.
fn changed_keys<'a, V: PartialEq>(
    a: &'a BTreeMap<String, V>,
    b: &'a BTreeMap<String, V>,
) -> Vec<&'a str> {
    let mut keys: Vec<&str> = a
        .iter()
        .filter(|(k, v)| b.get(*k) != Some(*v))
        .map(|(k, _)| k.as_str())
        .collect();
    keys.extend(b.keys().filter(|k| !a.contains_key(*k)).map(String::as_str));
    keys
}

/// The topics a subscription joined or left between `before` and `after` (every
/// topic of both when it was made, deleted or made again: a new id, new readers),
/// and those it joined.
fn moved_topics<'a>(
    before: Option<&'a SubscriberMeta>,
    after: Option<&'a SubscriberMeta>,
) -> (Vec<&'a str>, Vec<&'a str>) {
    let names = |s: Option<&'a SubscriberMeta>| -> HashSet<&'a str> {
        s.into_iter()
            .flat_map(|s| s.topics.iter().map(String::as_str))
            .collect()
    };
    let (old, new) = (names(before), names(after));
    if before.zip(after).is_some_and(|(b, a)| a.id == b.id) {
        let moved = old.symmetric_difference(&new).copied().collect();
        let joined = new.difference(&old).copied().collect();
        (moved, joined)
    } else {
        let joined = new.iter().copied().collect();
        (old.union(&new).copied().collect(), joined)
    }
}

/// Topic → the tokens of the subscriptions on it.
#[derive(Debug, Default)]
pub struct ByTopic(HashMap<String, BTreeSet<String>>);

impl ByTopic {
    /// The index of `meta`, built whole.
    pub fn of(meta: &Meta) -> ByTopic {
        let mut index = ByTopic::default();
        for (token, s) in &meta.subscribers {
            for topic in &s.topics {
                index.add(topic, token);
            }
        }
        index
    }

    fn add(&mut self, topic: &str, token: &str) {
        self.0
            .entry(topic.to_owned())
            .or_default()
            .insert(token.to_owned());
    }

    /// Brings the index from `previous` to `next` for the subscribers `touched`
    /// names (the others did not move).
    pub fn update(&mut self, previous: &Meta, next: &Meta, touched: &Touched) {
        for token in &touched.subscribers {
            if let Some(s) = previous.subscribers.get(token) {
                for topic in &s.topics {
                    if let Some(tokens) = self.0.get_mut(topic) {
                        tokens.remove(token);
                        if tokens.is_empty() {
                            self.0.remove(topic);
                        }
                    }
                }
            }
            if let Some(s) = next.subscribers.get(token) {
                for topic in &s.topics {
                    self.add(topic, token);
                }
            }
        }
    }

    /// The tokens of the subscriptions on `topic`.
    pub fn tokens(&self, topic: &str) -> impl Iterator<Item = &String> {
        self.0.get(topic).into_iter().flatten()
    }

    /// The subscriptions of `meta` on `topic` (the index is of `meta`).
    pub fn subscribers<'m>(&self, meta: &'m Meta, topic: &str) -> Vec<&'m SubscriberMeta> {
        self.tokens(topic)
            .filter_map(|t| meta.subscribers.get(t).map(|s| &**s))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::{Format, TopicMeta};

    fn sub(id: &str, topics: &[&str]) -> std::sync::Arc<SubscriberMeta> {
        std::sync::Arc::new(SubscriberMeta {
            id: id.into(),
            uuid: None,
            callback: "https://example.com/hook".into(),
            timeout_ms: 1000,
            max_events: 10,
            topics: topics.iter().map(|t| t.to_string()).collect(),
            format: Format::Routemaster,
            secrets: vec![],
            redrive_below: 0,
        })
    }

    fn big(topics: usize, subscribers: usize) -> Meta {
        let mut meta = Meta::empty();
        let names: Vec<String> = (0..topics).map(|i| format!("t{i}")).collect();
        for n in &names {
            meta.topics.insert(
                n.clone(),
                TopicMeta {
                    publisher: None,
                    epoch: 1,
                },
            );
        }
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        for i in 0..subscribers {
            meta.tokens.insert(format!("s{i}"), format!("owner{i}"));
            meta.subscribers
                .insert(format!("s{i}"), sub(&format!("id{i}"), &refs));
        }
        meta
    }

    /// The scaling property: at 200 subscriptions x 1,000 topics, a change touches
    /// only what it changes.
    #[test]
    fn a_change_touches_only_what_it_changes() {
        let before = big(1000, 200);
        // A new token: nothing to reconcile.
        let mut after = before.clone();
        after.tokens.insert("new".into(), "n".into());
        assert!(Touched::between(&before, &after).is_empty());
        // A new topic, claimed: that topic only.
        let mut after = before.clone();
        after.topics.insert(
            "fresh".into(),
            TopicMeta {
                publisher: Some("s1".into()),
                epoch: 2,
            },
        );
        let t = Touched::between(&before, &after);
        assert_eq!(t.topics.iter().collect::<Vec<_>>(), ["fresh"]);
        assert!(t.subscribers.is_empty());
        // A subscription leaves one topic: that topic and that subscriber.
        let mut after = before.clone();
        if let Some(s) = after
            .subscribers
            .get_mut("s7")
            .map(std::sync::Arc::make_mut)
        {
            s.topics.retain(|t| t != "t500");
        }
        let t = Touched::between(&before, &after);
        assert_eq!(t.topics.iter().collect::<Vec<_>>(), ["t500"]);
        assert_eq!(t.subscribers.iter().collect::<Vec<_>>(), ["s7"]);
        // A subscription's callback changes: its worker only, no topic.
        let mut after = before.clone();
        if let Some(s) = after
            .subscribers
            .get_mut("s9")
            .map(std::sync::Arc::make_mut)
        {
            s.callback = "https://example.com/other".into();
        }
        let t = Touched::between(&before, &after);
        assert!(t.topics.is_empty());
        assert_eq!(t.subscribers.len(), 1);
        // A subscription deleted: its topics and itself.
        let mut after = before.clone();
        after.subscribers.remove("s3");
        let t = Touched::between(&before, &after);
        assert_eq!(t.topics.len(), 1000);
        assert_eq!(t.subscribers.iter().collect::<Vec<_>>(), ["s3"]);
        // Its token's owner renamed: the worker's metrics label.
        let mut after = before.clone();
        after.tokens.insert("s4".into(), "renamed".into());
        let t = Touched::between(&before, &after);
        assert!(t.topics.is_empty());
        assert_eq!(t.subscribers.iter().collect::<Vec<_>>(), ["s4"]);
    }

    #[test]
    fn the_index_follows_the_changes() {
        let before = big(5, 3);
        let mut index = ByTopic::of(&before);
        assert_eq!(index.tokens("t2").count(), 3);
        let mut after = before.clone();
        after.subscribers.remove("s0");
        if let Some(s) = after
            .subscribers
            .get_mut("s1")
            .map(std::sync::Arc::make_mut)
        {
            s.topics = vec!["t2".into(), "t9".into()];
        }
        after.subscribers.insert("s5".into(), sub("id5", &["t9"]));
        let touched = Touched::between(&before, &after);
        index.update(&before, &after, &touched);
        let fresh = ByTopic::of(&after);
        for topic in ["t0", "t1", "t2", "t3", "t4", "t9", "none"] {
            let got: Vec<&String> = index.tokens(topic).collect();
            let want: Vec<&String> = fresh.tokens(topic).collect();
            assert_eq!(got, want, "{topic}");
        }
        assert_eq!(index.subscribers(&after, "t9").len(), 2);
    }
}
