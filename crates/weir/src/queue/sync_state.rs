//! What group commit shares under its own lock (`QueueCore::sync`): how far the
//! data and the journal are on disk, whether a round is in progress, and who waits
//! for one. The rounds themselves are in `commit.rs`; this is its own file so that
//! the queue's shared parts (`queue_core.rs`) hold it without importing the rounds.

use std::collections::VecDeque;

#[derive(Default)]
pub(super) struct SyncState {
    /// Every item up to this seq is on disk.
    pub(super) data_seq: u64,
    /// The journal is on disk up to this position.
    pub(super) journal: u64,
    pub(super) in_progress: bool,
    /// Callers waiting for a round in progress to end, oldest first.
    pub(super) waiting: VecDeque<SyncWaiter>,
    pub(super) next_waiter_id: u64,
}

/// Most times a round's leader yields the CPU to let more callers join before it
/// fsyncs (see [`QueueCore::wait_durable`]).
pub(super) const SYNC_GATHER_YIELDS_MAX: usize = 8;

/// One caller parked in [`QueueCore::wait_durable`]; woken by being removed from
/// [`SyncState::waiting`] and unparked.
pub(super) struct SyncWaiter {
    pub(super) id: u64,
    pub(super) seq: u64,
    pub(super) journal_offset: u64,
    pub(super) thread: std::thread::Thread,
}

impl SyncState {
    pub(super) fn covers(&self, seq: u64, journal_offset: u64) -> bool {
        self.data_seq >= seq && self.journal >= journal_offset
    }

    /// After a round: takes out of the list the waiters it covered, and the oldest of
    /// the others (if any) to lead the next round, successor first; the caller wakes
    /// them once it has dropped the lock. Those left stay listed: a round is about to
    /// start (the successor leads it, or finds another caller leading it), and its
    /// leader runs this again when it ends.
    pub(super) fn take_woken_after_round(&mut self) -> Vec<std::thread::Thread> {
        let mut woken = Vec::with_capacity(self.waiting.len());
        let mut kept = VecDeque::with_capacity(self.waiting.len());
        let mut successor = None;
        while let Some(w) = self.waiting.pop_front() {
            if self.covers(w.seq, w.journal_offset) {
                woken.push(w.thread);
            } else if successor.is_none() {
                successor = Some(w.thread);
            } else {
                kept.push_back(w);
            }
        }
        self.waiting = kept;
        if let Some(t) = successor {
            woken.insert(0, t);
        }
        woken
    }

    /// After a failed round: everyone retries (and meets the error themselves).
    pub(super) fn take_all(&mut self) -> Vec<std::thread::Thread> {
        self.waiting.drain(..).map(|w| w.thread).collect()
    }
}
