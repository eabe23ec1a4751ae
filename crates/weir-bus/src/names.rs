//! The names the API accepts, as routemaster did: topics `[a-z_]{1,64}`, token owners
//! and tokens `[a-z0-9:_-]{1,64}`; the backend's queues and readers they become; and
//! the name of the bus's map in the backend.
//!
//! Topic `NAME` is the queue `bus:topic:NAME`. A subscription has a random id
//! `ID` (`s` and 16 hex digits, never its token: a credential must not show in queue
//! names, logs or metrics): it reads topic queues as reader `ID`, and its dead letters
//! are the queue `bus:dead:ID`. Ids are lowercase, so the retention reader's
//! capitalised name can never be a subscriber's.

/// The name of the bus's map in the backend ([`weir_backend::Backend::shared_map`]).
pub const BUS_MAP: &str = "bus";
/// The reader that holds events for the configured retention (see `retention.rs`).
pub const RETENTION_READER: &str = "Retention";
/// Longest topic name, token or token owner name.
pub const NAME_BYTES_MAX: usize = 64;

pub fn is_topic_name(name: &str) -> bool {
    (1..=NAME_BYTES_MAX).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
}

pub fn is_token(name: &str) -> bool {
    (1..=NAME_BYTES_MAX).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_:-".contains(&b))
}

/// What a topic's queue name starts with (reserved for the bus in every door).
pub const TOPIC_PREFIX: &str = weir_backend::BUS_TOPIC_PREFIX;
/// What a dead-letter queue's name starts with (reserved for the bus in every door).
pub const DEAD_PREFIX: &str = weir_backend::BUS_DEAD_PREFIX;

pub fn topic_queue(topic: &str) -> String {
    format!("{TOPIC_PREFIX}{topic}")
}

/// A subscriber's dead-letter queue, by its id.
pub fn dead_queue(subscriber_id: &str) -> String {
    format!("{DEAD_PREFIX}{subscriber_id}")
}

/// A new subscriber id: `s` and 16 random hex digits (a valid reader name, never
/// `Retention`).
pub fn new_subscriber_id() -> String {
    let n: u64 = rand::random();
    format!("s{n:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_as_routemaster_did() {
        assert!(is_topic_name("orders_v_two"));
        for bad in ["", "Orders", "orders1", "a-b", "a.b", &"a".repeat(65)] {
            assert!(!is_topic_name(bad), "{bad:?}");
        }
        assert!(is_token("svc--0123abcd"));
        assert!(is_token("a:b_c-d"));
        for bad in ["", "Svc", "a b", "a/b", &"a".repeat(65), RETENTION_READER] {
            assert!(!is_token(bad), "{bad:?}");
        }
        // What they become is valid in the engine.
        weir_backend::validate_queue_name(&topic_queue(&"a".repeat(64))).unwrap();
        weir_backend::validate_queue_name(&dead_queue(&"a".repeat(64))).unwrap();
        weir_backend::validate_reader_name(RETENTION_READER).unwrap();
        let id = new_subscriber_id();
        weir_backend::validate_reader_name(&id).unwrap();
        assert_eq!(id.len(), 17);
        assert_ne!(id, new_subscriber_id());
    }
}
