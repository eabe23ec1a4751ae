//! `QueueCore`: one queue's state behind one lock, and every operation on it.
//!
//! The state is small and bounded: the list of segment files, the writer's mapping
//! window, and per reader a position, its out-of-order confirmations (as ranges), its
//! leases and released items, and one read-ahead buffer. Nothing here grows with the
//! backlog; items live only in the segment files (and the OS page cache).
//!
//! Every operation takes the queue's lock once, does its work without system calls in
//! the common case (appends and confirmations are stores into mappings), and returns a
//! [`Ticket`](commit::Ticket) when the caller must wait for an fsync (`synced` durability). The wait
//! happens outside the lock, through group commit: the first waiter fsyncs for all,
//! and at the end of its round wakes only the waiters the round covered, plus the
//! oldest one it did not cover to lead the next round. Waking every waiter each round
//! (a condition variable's `notify_all`) cost more than the fsync itself with 64
//! threads on 2 cores: most of them woke only to sleep again.
//!
//! Where each part lives: `queue_core.rs` the struct every operation is an `impl` of,
//! and [`StoreLink`](queue_core::StoreLink), the store as a queue sees it; `log.rs`
//! the segment files and reading records; `cursor.rs` the one walk over them;
//! `state.rs` the state behind the lock and the helpers every operation shares;
//! `append.rs`, `take.rs` (what a take is for: `purpose.rs`), `leases.rs` and
//! `expire.rs` the operations; `pending.rs` listing a reader's open leases;
//! `lifecycle.rs` the configuration, readers' creation and deletion, flushing,
//! deletion and closing; `reader_state.rs` one reader's position
//! and leases; `commit.rs` group commit over `sync_state.rs`; `wake.rs` waiting
//! readers; `open.rs` opening and recovery; `seek.rs` moving a reader and finding a
//! seq by time; `idle.rs` the background tick and closing idle files; `stats.rs`
//! statistics and iteration; `handle.rs` the public [`Queue`]. No file imports one
//! that imports it back (`scripts/import-cycles weir`).
//!
//! Invariants per reader (checked by `ReaderState::check` in debug builds):
//! - `acked_below <= next_seq` and `cursor_seq <= next_seq`;
//! - every leased or released seq lies in `[acked_below, cursor_seq)` and is not
//!   confirmed; every unconfirmed seq below the cursor is leased or released;
//! - after a reopen the cursor restarts at `acked_below`, so confirmations made out of
//!   order before the restart can lie above it (or pull `acked_below` past it): reading
//!   skips those items.

mod append;
mod commit;
mod cursor;
pub(crate) mod discard;
mod expire;
mod handle;
mod idle;
mod iter;
mod leases;
mod lifecycle;
mod log;
mod open;
mod pending;
mod purpose;
pub(crate) mod queue_core;
mod reader_state;
mod seek;
mod state;
mod stats;
mod sync_state;
mod take;
mod wake;

pub use self::handle::Queue;
pub use self::iter::Iter;
pub(crate) use self::wake::WaiterGuard;
