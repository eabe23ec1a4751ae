//! An item as stored and handed out, and the options of an append: the vocabulary
//! every backend shares, defined in `weir-types` (re-exported here and at the crate
//! root), with the one rule of expiry.

pub use weir_types::{expiry_ms, AppendOptions, Item, JobMeta, Lease, LeaseId, TakeMode, Taken};
