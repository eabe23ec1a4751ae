//! A set of u64 as disjoint half-open ranges: a reader's out-of-order confirmations.
//!
//! A reader that holds one lease while others confirm a million later items has one
//! range here, not a million entries: memory grows with the number of holes (open or
//! released leases), never with the backlog.

use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct IntervalSet {
    /// start -> end (exclusive); ranges neither overlap nor touch.
    ranges: BTreeMap<u64, u64>,
    count: u64,
}

impl IntervalSet {
    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn contains(&self, x: u64) -> bool {
        self.ranges
            .range(..=x)
            .next_back()
            .is_some_and(|(_, &end)| x < end)
    }

    /// Inserts `[start, end)`, merging with neighbours; returns how many were new.
    pub fn insert(&mut self, start: u64, end: u64) -> u64 {
        if start >= end {
            return 0;
        }
        let mut new_start = start;
        let mut new_end = end;
        let mut covered = 0;
        // Absorb every range that overlaps or touches [start, end).
        let touching: Vec<(u64, u64)> = self
            .ranges
            .range(..=end)
            .rev()
            .take_while(|(_, &e)| e >= start)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in touching {
            self.ranges.remove(&s);
            covered += e.min(end).saturating_sub(s.max(start));
            new_start = new_start.min(s);
            new_end = new_end.max(e);
            self.count -= e - s;
        }
        self.ranges.insert(new_start, new_end);
        self.count += new_end - new_start;
        (end - start) - covered
    }

    /// Removes everything below `x`; returns how many were removed.
    pub fn remove_below(&mut self, x: u64) -> u64 {
        let mut removed = 0;
        while let Some((&s, &e)) = self.ranges.iter().next() {
            if s >= x {
                break;
            }
            self.ranges.remove(&s);
            if e > x {
                self.ranges.insert(x, e);
                removed += x - s;
                self.count -= x - s;
                break;
            }
            removed += e - s;
            self.count -= e - s;
        }
        removed
    }

    /// If a range starts exactly at `x`, removes it and returns its end.
    pub fn take_range_at(&mut self, x: u64) -> Option<u64> {
        let end = self.ranges.remove(&x)?;
        self.count -= end - x;
        Some(end)
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|(&s, &e)| (s, e))
    }

    pub fn clear(&mut self) {
        self.ranges.clear();
        self.count = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        #[test]
        fn behaves_like_a_set(ops in proptest::collection::vec((0u64..60, 0u64..8, 0u8..3), 1..80)) {
            let mut set = IntervalSet::default();
            let mut model = BTreeSet::new();
            for (a, n, op) in ops {
                match op {
                    0 | 1 => {
                        let added = set.insert(a, a + n);
                        let before = model.len();
                        model.extend(a..a + n);
                        prop_assert_eq!(added as usize, model.len() - before);
                    }
                    _ => {
                        let removed = set.remove_below(a);
                        let before = model.len();
                        model.retain(|&x| x >= a);
                        prop_assert_eq!(removed as usize, before - model.len());
                    }
                }
                prop_assert_eq!(set.count() as usize, model.len());
                for x in 0..70 {
                    prop_assert_eq!(set.contains(x), model.contains(&x));
                }
                let ranges: Vec<_> = set.iter().collect();
                for w in ranges.windows(2) {
                    prop_assert!(w[0].1 < w[1].0, "ranges touch: {:?}", ranges);
                }
            }
        }
    }
}
