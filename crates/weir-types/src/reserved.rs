//! Queue names that belong to a front door or a feature: the event bus keeps its
//! topics and dead letters in `bus:*` queues, the proxy its captures in
//! `proxy:capture:*` queues, the work-queue features a tube's priority and buried
//! lanes in `lane:*` queues. The
//! memcache door lets clients read them (`stats`) but not delete or flush them unless
//! `reserved_queues_writable` is set, and the proxy's capture tools serve only
//! `proxy:capture:*`. One definition, so that a door and the tools agree.

/// Every queue of the event bus.
pub const BUS_PREFIX: &str = "bus:";
/// A topic's queue: `bus:topic:<topic>`.
pub const BUS_TOPIC_PREFIX: &str = "bus:topic:";
/// A subscriber's dead letters: `bus:dead:<subscriber>`.
pub const BUS_DEAD_PREFIX: &str = "bus:dead:";
/// A proxy route's captures: `proxy:capture:<route>`.
pub const PROXY_CAPTURE_PREFIX: &str = "proxy:capture:";
/// A tube's lanes (the engine's `jobs`): `lane:<tube>:p<priority>`, `lane:<tube>:buried`.
pub const LANE_PREFIX: &str = "lane:";

// The bus's names are its own prefix's.
const _: () = assert!(starts_with(BUS_TOPIC_PREFIX, BUS_PREFIX));
const _: () = assert!(starts_with(BUS_DEAD_PREFIX, BUS_PREFIX));

/// Whether `queue` belongs to a front door (the bus, the proxy) or is a tube's lane.
pub fn is_reserved(queue: &str) -> bool {
    queue.starts_with(BUS_PREFIX)
        || queue.starts_with(PROXY_CAPTURE_PREFIX)
        || queue.starts_with(LANE_PREFIX)
}

const fn starts_with(s: &str, prefix: &str) -> bool {
    let (s, p) = (s.as_bytes(), prefix.as_bytes());
    if p.len() > s.len() {
        return false;
    }
    let mut i = 0;
    while i < p.len() {
        if s[i] != p[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bus_and_the_proxy_own_their_prefixes_and_nothing_else() {
        for owned in [
            "bus:topic:orders",
            "bus:dead:s1",
            "bus:",
            "proxy:capture:api",
            "lane:jobs:p5",
            "lane:jobs:buried",
        ] {
            assert!(is_reserved(owned), "{owned}");
        }
        for free in [
            "jobs",
            "proxy:other",
            "proxy:",
            "bu:s",
            "busy",
            "x:bus:topic",
        ] {
            assert!(!is_reserved(free), "{free}");
        }
    }
}
