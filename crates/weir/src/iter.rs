//! Iteration over every kept item of a queue, in order, without consuming.
use crate::error::Result;
use crate::item::Item;

/// Iterator over a queue's kept items; see [`crate::Queue::iter`].
pub struct Iter {
    pub(crate) _private: (),
}

impl Iterator for Iter {
    type Item = Result<Item>;
    fn next(&mut self) -> Option<Self::Item> {
        todo!()
    }
}
