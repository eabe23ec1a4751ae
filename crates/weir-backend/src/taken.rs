//! What a take hands out: the item ([`Taken`]) and, for a lease, the handle
//! ([`Lease`]) that `confirm` and `release` give back.
//!
//! A [`Lease`] is an enum over the two backends' own lease handles, like the crate's
//! other handles (see the crate docs). It lives here, apart from the crate root, so
//! that a backend's reader builds one without reaching the root that composes the
//! backends.

use weir_types::{Item, LeaseId};

/// What `open` hands out and `close`/`abort` give back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lease {
    Embedded(LeaseId),
    #[cfg(feature = "jetstream")]
    JetStream(crate::jetstream::lease::Lease),
}

/// What a take returns: the item, and its lease when taken with
/// [`TakeMode::Lease`](weir_types::TakeMode::Lease).
#[derive(Clone, Debug)]
pub struct Taken {
    pub item: Item,
    pub lease: Option<Lease>,
    /// How many times the reader has been handed this item, this time included (see
    /// [`weir_types::Taken::deliveries`]; on JetStream the consumer's delivery count).
    pub deliveries: u32,
}
