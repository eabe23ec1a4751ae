//! The readers of one queue: a short list looked up by name, with a hash index once
//! it is long.
//!
//! Why a list first: the default reader's name is empty, and glibc's AVX-512 `memcmp`
//! takes ~150 ns for a zero-length compare on some machines (a masked load assist),
//! which a hash map pays on every hit. Most queues have a reader or a few, so a list
//! compared length-first is both simpler and faster there. A list is not fine long:
//! the bus gives a topic one reader per subscriber (up to 201 by default), names of
//! the same length, and a scan of them cost a restart of 200 subscribers x 1,000 topics
//! seconds in `memcmp`. From [`INDEXED_FROM`] readers on, a name → position index
//! answers instead. `READERS_PER_QUEUE_MAX` bounds both.

use std::collections::HashMap;

/// Most readers one queue may have.
pub use weir_types::READERS_PER_QUEUE_MAX;

/// From this many readers on, lookups go through the index.
const INDEXED_FROM: usize = 16;

pub(crate) struct Readers<T> {
    list: Vec<(String, T)>,
    /// Each name's position in `list`, while `list` holds at least [`INDEXED_FROM`].
    index: Option<HashMap<String, usize>>,
}

/// Where a reader is in its queue's [`Readers`]: found by name once per operation,
/// then used for every access in it. Valid while the queue's lock is held and no
/// reader is removed (a removal moves the last reader into the gap); adding one keeps
/// it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot(usize);

/// Name equality that never calls `memcmp` for an empty name (see the module docs);
/// front doors comparing queue or reader names in a hot path use it too.
pub(crate) fn names_equal(a: &str, b: &str) -> bool {
    a.len() == b.len() && (a.is_empty() || a.as_bytes() == b.as_bytes())
}

impl<T> Readers<T> {
    pub fn new() -> Self {
        Readers {
            list: Vec::new(),
            index: None,
        }
    }

    /// Where `name` is in the list.
    fn position(&self, name: &str) -> Option<usize> {
        match &self.index {
            Some(index) => index.get(name).copied(),
            None => self.list.iter().position(|(n, _)| names_equal(n, name)),
        }
    }

    pub fn get(&self, name: &str) -> Option<&T> {
        let i = self.position(name)?;
        self.list.get(i).map(|(_, r)| r)
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut T> {
        let i = self.position(name)?;
        self.list.get_mut(i).map(|(_, r)| r)
    }

    /// The slot of the reader `name`.
    pub fn slot(&self, name: &str) -> Option<Slot> {
        self.position(name).map(Slot)
    }

    /// Every reader's slot, in the list's order.
    pub fn slots(&self) -> impl Iterator<Item = Slot> {
        (0..self.list.len()).map(Slot)
    }

    /// The reader in `slot` (see [`Slot`] for when one is valid).
    pub fn at(&self, slot: Slot) -> &T {
        &self.list[slot.0].1
    }

    pub fn at_mut(&mut self, slot: Slot) -> &mut T {
        &mut self.list[slot.0].1
    }

    /// The name of the reader in `slot`.
    pub fn name_at(&self, slot: Slot) -> &str {
        &self.list[slot.0].0
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Adds a reader; the caller checked that `name` is new and the list is not full.
    pub fn insert(&mut self, name: String, reader: T) {
        debug_assert!(!self.contains_key(&name));
        if let Some(index) = &mut self.index {
            index.insert(name.clone(), self.list.len());
        }
        self.list.push((name, reader));
        if self.index.is_none() && self.list.len() >= INDEXED_FROM {
            let index = self
                .list
                .iter()
                .enumerate()
                .map(|(i, (n, _))| (n.clone(), i));
            self.index = Some(index.collect());
        }
        self.check_index();
    }

    pub fn remove(&mut self, name: &str) -> Option<T> {
        let i = self.position(name)?;
        let (_, removed) = self.list.swap_remove(i);
        if self.list.len() < INDEXED_FROM {
            self.index = None;
        } else if let Some(index) = &mut self.index {
            index.remove(name);
            // The last reader moved into the gap.
            if let Some((moved, _)) = self.list.get(i) {
                index.insert(moved.clone(), i);
            }
        }
        self.check_index();
        Some(removed)
    }

    /// In debug builds: the index, when there is one, agrees with the list.
    fn check_index(&self) {
        if let Some(index) = &self.index {
            debug_assert_eq!(index.len(), self.list.len());
            debug_assert!(self
                .list
                .iter()
                .enumerate()
                .all(|(i, (n, _))| index.get(n) == Some(&i)));
        }
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.list.iter().map(|(n, _)| n)
    }

    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.list.iter().map(|(_, r)| r)
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.list.iter_mut().map(|(_, r)| r)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &T)> {
        self.list.iter().map(|(n, r)| (n, r))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::{Readers, INDEXED_FROM};

    proptest! {
        /// Any sequence of adds and removes, across the length where the index comes
        /// and goes, finds exactly what a plain map would, at a slot holding that
        /// reader.
        #[test]
        fn lookups_agree_with_a_map(ops in prop::collection::vec((any::<bool>(), 0u8..40), 0..400)) {
            let mut readers = Readers::new();
            let mut model = BTreeMap::new();
            for (add, n) in ops {
                // Names of one length, as a subscriber's are; "" is the default reader.
                let name = if n == 0 { String::new() } else { format!("s{n:03}") };
                if add {
                    if !model.contains_key(&name) {
                        readers.insert(name.clone(), n);
                        model.insert(name.clone(), n);
                    }
                } else {
                    prop_assert_eq!(readers.remove(&name), model.remove(&name));
                }
                prop_assert_eq!(readers.len(), model.len());
                prop_assert_eq!(readers.index.is_some(), model.len() >= INDEXED_FROM);
                for k in 0u8..40 {
                    let key = if k == 0 { String::new() } else { format!("s{k:03}") };
                    prop_assert_eq!(readers.get(&key), model.get(&key));
                    if let Some(slot) = readers.slot(&key) {
                        prop_assert_eq!(readers.name_at(slot), key.as_str());
                    }
                }
            }
        }
    }
}
