//! A lease on JetStream: a message delivered to this instance and not yet
//! acknowledged, named by its ack subject. `leases.rs` keeps the leases alive and
//! gives them back; this is the handle a connection holds and the crate's
//! [`crate::Lease`] wraps.

use std::sync::Arc;

/// A delivered, not yet acknowledged message: its ack subject says which.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub(super) reply: Arc<str>,
    pub(super) seq: u64,
}

impl Lease {
    /// The item's stream sequence.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// A lease of no real delivery, for the crate's tests of what is done with one.
    #[cfg(test)]
    pub(crate) fn for_tests(reply: &str, seq: u64) -> Lease {
        Lease {
            reply: reply.into(),
            seq,
        }
    }
}
