//! A route's targets, taken in turn (round-robin). A target that could not be
//! connected to is left out for the route's `down_ms` (passive health): the next
//! request goes to the others; when every target is out, they are tried anyway.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::config::Target;

pub struct Balancer {
    // A target is out until `start + until` (ms); 0: in.
    targets: Vec<(Target, AtomicU64)>,
    next: AtomicUsize,
    start: Instant,
}

impl Balancer {
    pub fn new(targets: &[Target]) -> Balancer {
        Balancer {
            targets: targets
                .iter()
                .map(|t| (t.clone(), AtomicU64::new(0)))
                .collect(),
            next: AtomicUsize::new(0),
            start: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The next target in turn that is not out, or the next one when all are.
    pub fn pick(&self) -> (usize, &Target) {
        let n = self.targets.len();
        let now = self.now_ms();
        let first = self.next.fetch_add(1, Relaxed);
        for k in 0..n {
            let i = (first + k) % n;
            if self.targets[i].1.load(Relaxed) <= now {
                return (i, &self.targets[i].0);
            }
        }
        let i = first % n;
        (i, &self.targets[i].0)
    }

    /// Puts target `i` back (an active health check passed).
    pub fn mark_up(&self, i: usize) {
        if let Some((_, until)) = self.targets.get(i) {
            until.store(0, Relaxed);
        }
    }

    /// The targets, in order.
    pub fn targets(&self) -> impl Iterator<Item = &Target> {
        self.targets.iter().map(|(t, _)| t)
    }

    /// Leaves target `i` out for `down`.
    pub fn mark_down(&self, i: usize, down: Duration) {
        if let Some((t, until)) = self.targets.get(i) {
            let ms = u64::try_from(down.as_millis()).unwrap_or(u64::MAX);
            until.store(self.now_ms().saturating_add(ms), Relaxed);
            tracing::warn!(target = %t.authority, down_ms = ms, "target unreachable: left out");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(a: &str) -> Target {
        Target {
            https: false,
            authority: a.into(),
            base_path: String::new(),
        }
    }

    #[test]
    fn targets_take_turns_and_a_down_one_is_skipped() {
        let b = Balancer::new(&[t("a"), t("b"), t("c")]);
        let picks: Vec<usize> = (0..6).map(|_| b.pick().0).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        b.mark_down(1, Duration::from_secs(60));
        let picks: Vec<usize> = (0..4).map(|_| b.pick().0).collect();
        assert!(!picks.contains(&1), "{picks:?}");
        b.mark_down(0, Duration::from_secs(60));
        b.mark_down(2, Duration::from_secs(60));
        let (i, _) = b.pick(); // all out: tried anyway
        assert!(i < 3);
    }
}
