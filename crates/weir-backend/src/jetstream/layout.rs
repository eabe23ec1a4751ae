//! How weir lays its queues out on JetStream: names, subjects, and the stream's and
//! consumers' configurations.
//!
//! One stream holds every queue; queue `q` is the subject `<prefix>.q`, and each of
//! its readers is a durable pull consumer `q~r` filtered on that subject (`q~` for the
//! default reader). `~` is outside weir's name alphabet, so `q~r` splits back
//! unambiguously; weir's names are subject- and consumer-safe as they are
//! (`[A-Za-z0-9_:-]`). The stream keeps every item (limits retention, no limit set)
//! until an instance's sweep purges what every reader of its queue has confirmed
//! (`sweep.rs`): Kestrel's fan-out. Interest retention, which did that in the server,
//! let a replica that was down drop items a reader made meanwhile still needed.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::{Error, Kind, Result};
use crate::jetstream_config::JetStreamConfig;

/// The publishes JetStream remembers by `Nats-Msg-Id`: a `set` retried after a lost
/// PubAck within this window is stored once.
pub(crate) const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// What separates a queue's name from its reader's in a consumer's name.
pub(crate) const READER_MARK: char = '~';

/// The stream's and the subjects' names.
pub(crate) struct Layout {
    pub stream: String,
    pub prefix: String,
}

impl Layout {
    /// Checks the names in `config` (restart-only settings, so a bad one stops weir).
    pub fn new(config: &JetStreamConfig) -> Result<Layout> {
        let bad = |what: &str, value: &str| {
            Error::new(
                Kind::InvalidArgument,
                format!(
                    "[backend.jetstream] {what} {value:?}: empty, or has '.', '*', '>', or a space"
                ),
            )
        };
        let token_ok = |s: &str| {
            !s.is_empty()
                && !s
                    .chars()
                    .any(|c| c == '*' || c == '>' || c.is_whitespace() || c == '/' || c == '\\')
        };
        if !token_ok(&config.stream) || config.stream.contains('.') {
            return Err(bad("stream", &config.stream));
        }
        let prefix_ok = token_ok(&config.subject_prefix)
            && config.subject_prefix.split('.').all(|t| !t.is_empty());
        if !prefix_ok {
            return Err(bad("subject_prefix", &config.subject_prefix));
        }
        Ok(Layout {
            stream: config.stream.clone(),
            prefix: config.subject_prefix.clone(),
        })
    }

    pub fn subject(&self, queue: &str) -> String {
        format!("{}.{queue}", self.prefix)
    }

    /// `$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`: where pulls go.
    pub fn next_subject(&self, consumer: &str) -> String {
        format!("$JS.API.CONSUMER.MSG.NEXT.{}.{consumer}", self.stream)
    }

    /// The stream's configuration (create, or update when it differs).
    pub fn stream_config(&self, config: &JetStreamConfig) -> Value {
        json!({
            "name": self.stream,
            "subjects": [format!("{}.>", self.prefix)],
            "retention": "limits",
            "storage": "file",
            "num_replicas": config.replicas,
            "allow_direct": true,
            "allow_msg_ttl": true,
            "duplicate_window": nanos(DUPLICATE_WINDOW),
            "max_consumers": config.consumers_max,
            "max_msgs": -1,
            "max_bytes": -1,
            "max_age": 0,
            "max_msg_size": -1,
            "max_msgs_per_subject": -1,
            "discard": "old",
        })
    }

    /// The body of `CONSUMER.CREATE` for reader `reader` of `queue`: a durable pull
    /// consumer that never gives up redelivering and never deletes itself (what only
    /// it kept would go at the next sweep).
    pub fn consumer_request(
        &self,
        config: &JetStreamConfig,
        queue: &str,
        reader: &str,
        ack_wait: Duration,
        start: Start,
    ) -> Value {
        let name = consumer_name(queue, reader);
        let (deliver_policy, opt_start_seq) = match start {
            Start::Oldest | Start::Placed(_) => ("all", None),
            Start::At(seq) => ("by_start_sequence", Some(seq)),
        };
        let mut request = json!({
            "stream_name": self.stream,
            "action": "create",
            "config": {
                "name": name,
                "durable_name": name,
                "filter_subject": self.subject(queue),
                "ack_policy": "explicit",
                "deliver_policy": deliver_policy,
                "replay_policy": "instant",
                "ack_wait": nanos(ack_wait),
                "max_deliver": -1,
                "max_ack_pending": config.ack_pending_max,
                "max_waiting": config.waiting_max,
                "metadata": {"weir.queue": queue, "weir.reader": reader},
            },
        });
        if let Some(seq) = opt_start_seq {
            request["config"]["opt_start_seq"] = json!(seq);
        }
        if let Start::Placed(seq) = start {
            request["config"]["metadata"][PLACE_KEY] = json!(seq.to_string());
        }
        request
    }
}

/// Where a consumer made for a reader starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Start {
    /// The queue's oldest kept item (`deliver_policy` `all`).
    Oldest,
    /// This stream sequence (`by_start_sequence`): after the queue's newest item when
    /// it was made. Unlike `new`, which earlier builds used, it is fixed at creation
    /// (two instances making it at once agree or find it made) and can be reset forward
    /// later (`flush q.r`), but never below it. Only for servers without
    /// `CONSUMER.RESET` (before 2.14) now.
    At(u64),
    /// Made `all` with [`PLACE_KEY`] naming this sequence, then moved there
    /// (`CONSUMER.RESET`) and the key dropped: it starts as `At` does, and can later
    /// be moved anywhere the queue keeps (the bus's replay to before a
    /// subscription). The key in its config makes two instances' creations differ, so
    /// only one makes it; an instance that finds the key (its maker died between the two
    /// steps, or a reply was lost) does the move. See `Inner::place`.
    Placed(u64),
}

/// The metadata key of a reader made at the end and not yet moved there
/// ([`Start::Placed`]): the stream sequence to move it to.
pub(crate) const PLACE_KEY: &str = "weir.place";

/// A consumer that builds of 2026-11-26 added to every stream (filtered on every
/// queue's subject, starting at sequence 2^62) to keep every replica interested in
/// every queue. Its ack floor past the stream's last sequence can make a replica purge
/// its whole copy of the stream (nats-server's interest check after a purge and a
/// restart), so setup deletes it where it is found; not a reader (`split_consumer`
/// refuses it: its queue name is empty).
pub(crate) const INTEREST_KEEPER: &str = "~interest";

/// What weir reads of a `STREAM.INFO` answer (a page of it, with a subjects filter).
#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct StreamInfo {
    /// Subjects in all (for paging `subjects`).
    pub total: usize,
    pub state: StreamState,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct StreamState {
    pub last_seq: u64,
    /// Messages per subject, for a request with `subjects_filter`.
    pub subjects: std::collections::HashMap<String, u64>,
}

/// `q~r`; `q~` for the default reader.
pub(crate) fn consumer_name(queue: &str, reader: &str) -> String {
    format!("{queue}{READER_MARK}{reader}")
}

/// `(queue, reader)` of a consumer weir made.
pub(crate) fn split_consumer(name: &str) -> Option<(&str, &str)> {
    let (queue, reader) = name.split_once(READER_MARK)?;
    let ok = weir_types::validate_queue_name(queue).is_ok()
        && weir_types::validate_reader_name(reader).is_ok();
    ok.then_some((queue, reader))
}

pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A consumer's state, as `CONSUMER.INFO`, `CONSUMER.CREATE` and `CONSUMER.LIST`
/// give it (only what weir reads).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ConsumerInfo {
    pub name: String,
    pub config: ConsumerSettings,
    pub delivered: Sequences,
    pub ack_floor: Sequences,
    pub num_ack_pending: u64,
    pub num_waiting: u64,
    pub num_pending: u64,
}

impl ConsumerInfo {
    /// Whether an instance may register this consumer's queue from a listing: it is a
    /// queue's default reader (the stream keeps what is appended to the queue from
    /// then on whatever its replicas did, so no proof is needed).
    pub fn learnable(&self) -> bool {
        split_consumer(&self.name).is_some_and(|(_, reader)| reader.is_empty())
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ConsumerSettings {
    /// Nanoseconds.
    pub ack_wait: u64,
    /// `all`, `new`, `by_start_sequence`, ...: whether CONSUMER.RESET may move it.
    pub deliver_policy: String,
    /// Where a `by_start_sequence` consumer started: a reset may not go below it.
    pub opt_start_seq: u64,
    /// weir's own (`weir.queue`, `weir.reader`) and the server's (`_nats.ver`: the
    /// version of the server that answered).
    pub metadata: std::collections::HashMap<String, String>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Sequences {
    pub consumer_seq: u64,
    pub stream_seq: u64,
}

/// What the ack subject of a delivered message says about it:
/// `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ns>.<pending>`,
/// or the newer form with `<domain>.<account hash>` after `$JS.ACK` and a token at the
/// end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Delivery {
    pub stream_seq: u64,
    pub timestamp_ns: u64,
    /// How many times the consumer has delivered the message, this time included.
    pub delivered: u32,
}

impl Delivery {
    pub fn parse(reply: &str) -> Option<Delivery> {
        Delivery::parse_with_consumer(reply).map(|(_, d)| d)
    }

    /// [`Delivery::parse`], and the consumer's name.
    pub fn parse_with_consumer(reply: &str) -> Option<(&str, Delivery)> {
        let tokens: Vec<&str> = reply.split('.').collect();
        if tokens.first() != Some(&"$JS") || tokens.get(1) != Some(&"ACK") {
            return None;
        }
        let at = match tokens.len() {
            9 => 2,
            n if n >= 11 => 4,
            _ => return None,
        };
        let delivery = Delivery {
            stream_seq: tokens.get(at + 3)?.parse().ok()?,
            timestamp_ns: tokens.get(at + 5)?.parse().ok()?,
            delivered: tokens.get(at + 2)?.parse().ok()?,
        };
        Some((tokens.get(at + 1)?, delivery))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One consumer of a `CONSUMER.LIST` answer of nats-server 2.15.2, as it came.
    #[test]
    fn the_servers_listing_is_read() {
        let listed = r#"{"stream_name":"TSCHK","name":"q~","created":"2026-11-26T12:35:31.767204609Z","config":{"durable_name":"q~","ack_policy":"explicit","ack_wait":30000000000,"max_deliver":-1},"delivered":{"consumer_seq":3,"stream_seq":9},"ack_floor":{"consumer_seq":2,"stream_seq":7},"num_ack_pending":1,"num_redelivered":0,"num_waiting":0,"num_pending":4,"cluster":{"name":"weir","leader":"n1","replicas":[{"name":"n2","current":true,"active":1025767742,"peer":"44jzkV9D"}]},"ts":"2026-11-26T12:35:32.860795187Z"}"#;
        let info: ConsumerInfo = serde_json::from_str(listed).unwrap();
        assert_eq!(info.ack_floor.stream_seq, 7);
        assert_eq!((info.num_pending, info.num_ack_pending), (4, 1));
        assert!(info.learnable());
    }

    #[test]
    fn only_a_default_reader_makes_its_queue_learnable() {
        let info = |name: &str| ConsumerInfo {
            name: name.into(),
            ..ConsumerInfo::default()
        };
        assert!(info("q~").learnable());
        assert!(!info("q~r").learnable());
        assert!(!info("~interest").learnable());
        assert!(!info("no-mark").learnable());
    }

    #[test]
    fn names_round_trip() {
        assert_eq!(consumer_name("q", ""), "q~");
        assert_eq!(split_consumer("q:x-1~r_2"), Some(("q:x-1", "r_2")));
        assert_eq!(split_consumer("q~"), Some(("q", "")));
        assert_eq!(split_consumer("other"), None);
        assert_eq!(split_consumer("~r"), None);
        assert_eq!(split_consumer(INTEREST_KEEPER), None);
    }

    #[test]
    fn parses_ack_subjects() {
        let v1 = "$JS.ACK.WEIR.q~.3.42.7.1700000000123456789.0";
        assert_eq!(
            Delivery::parse(v1),
            Some(Delivery {
                stream_seq: 42,
                timestamp_ns: 1_700_000_000_123_456_789,
                delivered: 3,
            })
        );
        let v2 = "$JS.ACK._.ACCHASH.WEIR.q~.2.42.7.1700000000123456789.0.tok";
        assert_eq!(
            Delivery::parse(v2).map(|d| (d.stream_seq, d.delivered)),
            Some((42, 2))
        );
        for reply in [v1, v2] {
            let (consumer, _) = Delivery::parse_with_consumer(reply).unwrap();
            assert_eq!(consumer, "q~");
        }
        assert_eq!(Delivery::parse("_INBOX.x"), None);
    }

    #[test]
    fn refuses_bad_layout_names() {
        let mut config = JetStreamConfig::default();
        assert!(Layout::new(&config).is_ok());
        config.stream = "a.b".into();
        assert!(Layout::new(&config).is_err());
        config.stream = "S".into();
        config.subject_prefix = "weir..q".into();
        assert!(Layout::new(&config).is_err());
    }
}
