//! The readers of one queue: a short list looked up by name.
//!
//! Why not a `HashMap<String, _>`: the default reader's name is empty, and glibc's
//! AVX-512 `memcmp` takes ~150 ns for a zero-length compare on some machines (a masked
//! load assist), which a hash map pays on every hit. A queue has few readers, so a list
//! compared length-first is both simpler and faster; `READERS_PER_QUEUE_MAX` bounds it.

/// Most readers one queue may have.
pub use weir_types::READERS_PER_QUEUE_MAX;

pub(crate) struct Readers<T> {
    list: Vec<(String, T)>,
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
        Readers { list: Vec::new() }
    }

    pub fn get(&self, name: &str) -> Option<&T> {
        self.list
            .iter()
            .find(|(n, _)| names_equal(n, name))
            .map(|(_, r)| r)
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut T> {
        self.list
            .iter_mut()
            .find(|(n, _)| names_equal(n, name))
            .map(|(_, r)| r)
    }

    /// The slot of the reader `name`.
    pub fn slot(&self, name: &str) -> Option<Slot> {
        self.list
            .iter()
            .position(|(n, _)| names_equal(n, name))
            .map(Slot)
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
        self.list.push((name, reader));
    }

    pub fn remove(&mut self, name: &str) -> Option<T> {
        let i = self.list.iter().position(|(n, _)| names_equal(n, name))?;
        Some(self.list.swap_remove(i).1)
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

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&String, &mut T)> {
        self.list.iter_mut().map(|(n, r)| (&*n, r))
    }
}
