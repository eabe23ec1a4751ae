//! Limits every backend enforces alike, so that a front door behaves the same on
//! either.

/// Most readers one queue has (the default reader included); creating one more is
/// refused. A reader's state is per queue and looked up by name, so this bounds the
/// lookup and the state.
pub const READERS_PER_QUEUE_MAX: usize = 256;

/// Most queue or reader creations a backend runs at once: a creation is file work
/// (embedded) or cluster round trips (JetStream), and a client naming new queues in a
/// loop must not take every worker or flood the cluster's metadata leader.
pub const CREATIONS_AT_ONCE: usize = 4;

/// Items one re-drive call moves at most (`Store::redrive`, `Backend::redrive`): a
/// deep dead-letter queue is re-driven by calls in a loop, each bounded in time.
pub const REDRIVE_PER_CALL_MAX: u64 = 100_000;
