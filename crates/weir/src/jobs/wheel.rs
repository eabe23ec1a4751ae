//! The delay wheel's arithmetic: which bucket a delayed job goes to, and when a
//! bucket is ripe. Pure functions (no I/O), so the rules are tested alone.
//!
//! Six levels of buckets, each 64 times as wide as the one below: 128 ms, 8.2 s,
//! 8.7 min, 9.3 h, 24.9 days, 4.4 years. A job due at `due` (Unix ms) goes to the
//! finest level whose 64 buckets from now reach it, in the bucket that contains
//! `due`, and never to a coarse bucket that has started (one level finer then). A
//! bucket of level 0 is ripe when it ends: its jobs are then all due, so a delayed
//! job is never ready early and at most 128 ms late (plus the wait for the next
//! reserve, stats or kick of its tube, which promote what is ripe). A coarser bucket
//! is ripe when it starts: its jobs are spread again into finer buckets (a job
//! moves down at most five times). So at most 65 buckets per level exist at once
//! (390 per tube), whatever the number of delayed jobs.

/// Levels of the wheel.
pub(crate) const LEVELS: u8 = 6;
/// Buckets per level before the next one takes over.
const SPAN: u64 = 64;
/// log2 of level 0's width in ms (128 ms).
const SHIFT0: u32 = 7;
/// log2 of the ratio between levels (64).
const SHIFT_STEP: u32 = 6;

/// A bucket of the wheel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Bucket {
    pub level: u8,
    /// Its first ms (a multiple of its width).
    pub start_ms: u64,
}

/// The width of a level's buckets, in ms.
pub(crate) fn width_ms(level: u8) -> u64 {
    1u64 << (SHIFT0 + SHIFT_STEP * u32::from(level.min(LEVELS - 1)))
}

impl Bucket {
    /// When the bucket's jobs move on: its end for level 0, its start above.
    pub fn ripe_at_ms(self) -> u64 {
        if self.level == 0 {
            self.start_ms.saturating_add(width_ms(0))
        } else {
            self.start_ms
        }
    }
}

/// The bucket a job due at `due_ms` goes to at `now_ms`; `None` when it is due
/// already (it goes to its ready lane).
pub(crate) fn bucket_for(due_ms: u64, now_ms: u64) -> Option<Bucket> {
    if due_ms <= now_ms {
        return None;
    }
    let ahead = due_ms - now_ms;
    let mut level = (0..LEVELS)
        .find(|&l| ahead < width_ms(l).saturating_mul(SPAN))
        .unwrap_or(LEVELS - 1);
    loop {
        let start_ms = due_ms - due_ms % width_ms(level);
        // A coarse bucket that has started is being (or about to be) spread: the
        // job goes one level finer, where it fits (`ahead` < this width).
        if level == 0 || start_ms > now_ms {
            return Some(Bucket { level, start_ms });
        }
        level -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn widths_grow_by_64() {
        assert_eq!(width_ms(0), 128);
        assert_eq!(width_ms(1), 8192);
        assert_eq!(width_ms(5), 1u64 << 37);
        assert!(
            width_ms(5) * SPAN > 136 * 365 * 24 * 3600 * 1000,
            "beanstalkd's longest delay fits"
        );
    }

    #[test]
    fn near_jobs_go_to_level_0_and_far_ones_up() {
        let now = 1_000_000_000;
        assert_eq!(bucket_for(now, now), None);
        assert_eq!(bucket_for(now - 5, now), None);
        let b = bucket_for(now + 300, now).unwrap();
        assert_eq!(b.level, 0);
        assert!(b.start_ms <= now + 300 && now + 300 < b.ripe_at_ms());
        assert_eq!(bucket_for(now + 60_000, now).unwrap().level, 1);
        assert_eq!(bucket_for(now + 3_600_000, now).unwrap().level, 2);
    }

    proptest! {
        /// Never ripe before the job is due; at most 128 ms late at level 0; a
        /// coarse bucket has not started; each level's buckets reach 64 widths ahead.
        #[test]
        fn a_bucket_holds_its_job_until_due_and_no_longer_than_needed(
            now in 0u64..(1u64 << 45),
            ahead in 1u64..(1u64 << 42),
        ) {
            let due = now + ahead;
            let b = bucket_for(due, now).unwrap();
            prop_assert!(b.start_ms <= due && due < b.start_ms + width_ms(b.level));
            if b.level == 0 {
                prop_assert!(b.ripe_at_ms() > due && b.ripe_at_ms() - due <= width_ms(0));
            } else {
                prop_assert!(b.start_ms > now, "a started coarse bucket");
                prop_assert!(b.ripe_at_ms() <= due);
                // Spread at its start, the job lands strictly finer.
                let again = bucket_for(due, b.ripe_at_ms());
                prop_assert!(again.is_none_or(|a| a.level < b.level));
            }
            prop_assert!(due - now < width_ms(b.level) * SPAN || b.level == LEVELS - 1);
        }
    }
}
