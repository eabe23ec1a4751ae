//! The names of a tube's lanes: queues of their own, named `lane:TUBE:pN` for
//! priority N and `lane:TUBE:buried`, so that they sort together and no client name
//! collides with them (doors refuse the `lane:` prefix, as they do `bus:`).
//! Leaf: imports nothing of the crate (the store's options use it to give a lane its
//! tube's settings).

pub use weir_types::LANE_PREFIX;
const BURIED: &str = "buried";

/// The queue holding `tube`'s jobs of priority `priority` (not its default one).
pub(crate) fn priority_lane(tube: &str, priority: u32) -> String {
    format!("{LANE_PREFIX}{tube}:p{priority}")
}

/// The queue holding `tube`'s buried jobs.
pub(crate) fn buried_lane(tube: &str) -> String {
    format!("{LANE_PREFIX}{tube}:{BURIED}")
}

/// The queue holding `tube`'s delayed jobs due in the bucket of `level` that starts
/// at `start_ms` (see `wheel.rs`).
pub(crate) fn delay_lane(tube: &str, level: u8, start_ms: u64) -> String {
    format!("{LANE_PREFIX}{tube}:d{level}-{start_ms}")
}

/// The bucket (level, start) of a delay lane of `tube` named `queue`.
pub(crate) fn delay_bucket(tube: &str, queue: &str) -> Option<(u8, u64)> {
    let rest = queue.strip_prefix(LANE_PREFIX)?.strip_prefix(tube)?;
    let (level, start) = rest.strip_prefix(":d")?.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(level) || !digits(start) {
        return None;
    }
    Some((level.parse().ok()?, start.parse().ok()?))
}

/// Whether `queue` is a lane where jobs wait to be made ready (buried, or a delay
/// bucket): no expiry, no delivery limit, no size limit applies there, since a job
/// there is not being delivered.
pub fn is_parking_lane(queue: &str) -> bool {
    let Some(tube) = tube_of_lane(queue) else {
        return false;
    };
    queue.ends_with(&format!(":{BURIED}")) || delay_bucket(tube, queue).is_some()
}

/// The tube a lane belongs to, when `queue` is a lane's name.
pub fn tube_of_lane(queue: &str) -> Option<&str> {
    let rest = queue.strip_prefix(LANE_PREFIX)?;
    let (tube, _) = rest.rsplit_once(':')?;
    (!tube.is_empty()).then_some(tube)
}

/// The priority of a lane of `tube` named `queue`, when it is a priority lane.
pub(crate) fn lane_priority(tube: &str, queue: &str) -> Option<u32> {
    let rest = queue.strip_prefix(LANE_PREFIX)?.strip_prefix(tube)?;
    let digits = rest.strip_prefix(":p")?;
    if digits.is_empty() || digits.len() > 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_names_round_trip() {
        let p = priority_lane("emails", 5);
        assert_eq!(p, "lane:emails:p5");
        assert_eq!(tube_of_lane(&p), Some("emails"));
        assert_eq!(lane_priority("emails", &p), Some(5));
        assert_eq!(lane_priority("email", &p), None);
        let b = buried_lane("a:b");
        assert_eq!(tube_of_lane(&b), Some("a:b"));
        assert_eq!(lane_priority("a:b", &b), None);
        assert_eq!(tube_of_lane("emails"), None);
        assert_eq!(tube_of_lane("lane::p1"), None);
        assert_eq!(lane_priority("t", "lane:t:p99999999999"), None);
        assert_eq!(lane_priority("t", "lane:t:p4294967295"), Some(u32::MAX));
        assert_eq!(lane_priority("t", "lane:t:p+1"), None);
        let d = delay_lane("t", 2, 1_700_000_000_000);
        assert_eq!(tube_of_lane(&d), Some("t"));
        assert_eq!(delay_bucket("t", &d), Some((2, 1_700_000_000_000)));
        assert_eq!(lane_priority("t", &d), None);
        assert_eq!(delay_bucket("t", "lane:t:p5"), None);
        assert_eq!(delay_bucket("t", "lane:t:d1-"), None);
        assert_eq!(delay_bucket("t", "lane:t:dx-5"), None);
        assert!(is_parking_lane(&d) && is_parking_lane(&b));
        assert!(!is_parking_lane(&p) && !is_parking_lane("emails"));
    }
}
