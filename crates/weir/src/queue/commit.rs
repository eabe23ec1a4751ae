//! Group commit: what an operation must wait for before it is durable (a [`Ticket`])
//! and the fsync rounds that cover many waiters at once.
//!
//! The wait happens outside the state lock. The first waiter to find no round running
//! leads one (fsyncs the journal, the segments and the directories for everyone); at
//! the end of its round it wakes only the waiters the round covered, plus the oldest
//! one it did not cover to lead the next round.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::MutexGuard;

use crate::config::Durability;
use crate::error::{Error, Result};
use crate::mapfile::{sync_dir, sync_file};
use crate::reader_list;

use super::idle::MarkActiveOnDrop;
use super::queue_core::QueueCore;
use super::state::State;
use super::sync_state::{SyncState, SyncWaiter, SYNC_GATHER_YIELDS_MAX};

/// What a caller must wait for before its operation is durable: the fsync of the
/// segments up to `data_seq` and of the reader journal up to `journal_offset`.
/// Operations hand out `Option<Ticket>`: `None` when nothing needs waiting for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    pub(super) data_seq: u64,
    pub(super) journal_offset: u64,
}

impl Ticket {
    /// One ticket covering both (what an operation waits for when it wrote twice).
    pub(super) fn both(a: Option<Ticket>, b: Option<Ticket>) -> Option<Ticket> {
        match (a, b) {
            (Some(a), Some(b)) => Some(Ticket {
                data_seq: a.data_seq.max(b.data_seq),
                journal_offset: a.journal_offset.max(b.journal_offset),
            }),
            (a, None) => a,
            (None, b) => b,
        }
    }
}

impl State {
    /// Whether anything was written and not fsync'ed yet.
    pub(super) fn unsynced_writes(&self) -> bool {
        self.dirty
            || self.created_unsynced
            || self.dir_dirty
            || self.reader_list_dirty
            || !self.unsynced.is_empty()
            || self.log.writer.staged_len() > 0
    }
}

impl State {
    /// What an operation that appended up to `data_seq` (0: none) and, when
    /// `journal`, wrote the reader journal must wait for: nothing unless the queue is
    /// `synced` or the append asked for `sync`.
    pub(super) fn ticket(&self, sync: bool, data_seq: u64, journal: bool) -> Option<Ticket> {
        let wait = sync || self.config.durability == Durability::Synced;
        let journal_offset = if journal { self.journal.written } else { 0 };
        wait.then_some(Ticket {
            data_seq,
            journal_offset,
        })
    }

    /// The end every operation that wrote the reader journal shares: the segments no
    /// reader needs any more are deleted and the journal is rotated when due.
    pub(super) fn after_write(&mut self) {
        self.reclaim();
        self.maybe_rotate_journal();
    }

    /// [`State::after_write`], and what the caller must wait for.
    pub(super) fn after_journal_write(&mut self) -> Option<Ticket> {
        self.after_write();
        self.ticket(false, 0, true)
    }
}

impl QueueCore {
    /// Blocks until what `ticket` names is on disk. The first caller to find no round
    /// running leads one (fsyncs for everyone); the others park until its end wakes
    /// them (see [`SyncState::take_woken_after_round`]).
    pub(crate) fn wait_durable(&self, ticket: Option<Ticket>) -> Result<()> {
        let Some(ticket) = ticket else {
            return Ok(());
        };
        let (seq, journal_offset) = (ticket.data_seq, ticket.journal_offset);
        let mut s = self.sync.lock();
        // This caller's entry in `waiting`, while it has one.
        let mut listed: Option<u64> = None;
        loop {
            if let Some(id) = listed {
                if s.waiting.iter().any(|w| w.id == id) {
                    // A spurious wake-up: still listed, so no round has ended for us.
                    drop(s);
                    std::thread::park();
                    s = self.sync.lock();
                    continue;
                }
                listed = None;
            }
            if s.covers(seq, journal_offset) {
                return Ok(());
            }
            if s.in_progress {
                let id = s.next_waiter_id;
                s.next_waiter_id += 1;
                s.waiting.push_back(SyncWaiter {
                    id,
                    seq,
                    journal_offset,
                    thread: std::thread::current(),
                });
                listed = Some(id);
                drop(s);
                // An unpark between the drop and the park is not lost: it makes this
                // park return at once.
                std::thread::park();
                s = self.sync.lock();
                continue;
            }
            s = self.lead_round(s)?;
        }
    }

    /// Runs one round of group commit, `s` locked with no round in progress: lets
    /// arriving waiters in, fsyncs outside the lock, records what it covered and wakes
    /// the waiters it covered. Returns the lock again; on error every waiter is woken
    /// (each tries again, leading a round of its own) and the error returned.
    fn lead_round<'a>(
        &'a self,
        mut s: MutexGuard<'a, SyncState>,
    ) -> Result<MutexGuard<'a, SyncState>> {
        debug_assert!(!s.in_progress);
        s.in_progress = true;
        let synced = (s.data_seq, s.journal);
        // Let callers that are about to append and wait (typically the ones the last
        // round just woke) get in first, while more keep arriving: a round then covers
        // more of them, and fewer rounds (fsyncs, wake-ups) are needed per item. With
        // nobody else runnable this costs one sched_yield.
        for _ in 0..SYNC_GATHER_YIELDS_MAX {
            let before = s.waiting.len();
            drop(s);
            std::thread::yield_now();
            s = self.sync.lock();
            if s.waiting.len() == before {
                break;
            }
        }
        drop(s);
        let result = self.sync_files(synced);
        s = self.sync.lock();
        s.in_progress = false;
        let woken = match &result {
            Ok((done_seq, done_journal)) => {
                s.data_seq = s.data_seq.max(*done_seq);
                s.journal = s.journal.max(*done_journal);
                s.take_woken_after_round()
            }
            Err(_) => s.take_all(),
        };
        drop(s);
        woken.iter().for_each(std::thread::Thread::unpark);
        result?;
        Ok(self.sync.lock())
    }

    pub(crate) async fn wait_durable_async(self: &Arc<Self>, ticket: Option<Ticket>) -> Result<()> {
        let Some(wanted) = ticket else {
            return Ok(());
        };
        {
            let s = self.sync.lock();
            if s.covers(wanted.data_seq, wanted.journal_offset) {
                return Ok(());
            }
        }
        let me = Arc::clone(self);
        match tokio::task::spawn_blocking(move || me.wait_durable(ticket)).await {
            Ok(r) => r,
            Err(e) => Err(Error::io(
                "waiting for fsync",
                io::Error::other(e.to_string()),
            )),
        }
    }

    /// fsyncs every file with writes newer than `synced` (data seq, journal position);
    /// returns what is now durable. A synced append costs one fsync, a synced take one.
    pub(super) fn sync_files(&self, synced: (u64, u64)) -> Result<(u64, u64)> {
        let (files, sealed, dir_dirty, list_dirty, created, seq, journal_offset) = {
            let mut state = self.state.lock();
            if state.deleted {
                return Ok((u64::MAX, u64::MAX));
            }
            // Not `ready`: an fsync is no use of the queue (it would keep an idle queue
            // from closing its files); the files it needs open as they are used.
            state.check_usable()?;
            // An fsync covers only what the file holds.
            state.log.flush_staged()?;
            let sealed = std::mem::take(&mut state.unsynced);
            let mut files = Vec::with_capacity(2);
            let (seq, journal_offset) = (state.next_seq - 1, state.journal.written);
            let created = std::mem::take(&mut state.created_unsynced);
            let file_err = |e| Error::io(format!("syncing {}", self.dir.display()), e);
            if seq > synced.0 || !sealed.is_empty() || created {
                files.push(Arc::clone(state.log.writer.file().map_err(file_err)?));
            }
            if journal_offset > synced.1 || created {
                files.push(Arc::clone(state.journal.file().map_err(file_err)?));
            }
            state.dirty = false;
            state.last_sync = Instant::now();
            let dir_dirty = std::mem::take(&mut state.dir_dirty) || created;
            let list_dirty = std::mem::take(&mut state.reader_list_dirty) || created;
            (
                files,
                sealed,
                dir_dirty,
                list_dirty,
                created,
                seq,
                journal_offset,
            )
        };
        let result = (|| {
            for f in sealed.iter().map(|(_, f)| f).chain(files.iter()) {
                sync_file(f)?;
                #[cfg(feature = "fault-injection")]
                crate::fault::fsynced(&self.dir);
            }
            if list_dirty {
                reader_list::sync(&self.dir)?;
            }
            if dir_dirty {
                sync_dir(&self.dir)?;
            }
            if created {
                // The queue's own entry, renamed into `queues/` at its creation.
                sync_dir(self.dir.parent().unwrap_or(Path::new(".")))?;
            }
            Ok::<(), io::Error>(())
        })();
        if let Err(e) = result {
            let mut state = self.state.lock();
            tracing::error!(dir = %self.dir.display(), error = %e, "fsync failed; the queue refuses work until the store is reopened");
            state.poisoned = Some(e.to_string());
            return Err(Error::io(format!("fsync in {}", self.dir.display()), e));
        }
        Ok((seq, journal_offset))
    }

    pub(crate) fn sync_now(&self) -> Result<()> {
        // Marked on the way out (after the state lock is released): see `tick`.
        let _active = MarkActiveOnDrop(self);
        let (ticket, files_only) = {
            let state = self.state.lock();
            if state.deleted || state.closed {
                return Ok(());
            }
            // A creation or a deleted segment is no data a ticket can name: sync the
            // files and directories directly (group commit would find nothing to do).
            let files_only = state.created_unsynced || state.dir_dirty || state.reader_list_dirty;
            (
                Ticket {
                    data_seq: state.next_seq - 1,
                    journal_offset: state.journal.written,
                },
                files_only,
            )
        };
        if files_only {
            let (seq, journal_offset) = self.sync_files((0, 0))?;
            let mut s = self.sync.lock();
            s.data_seq = s.data_seq.max(seq);
            s.journal = s.journal.max(journal_offset);
        }
        self.wait_durable(Some(ticket))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiter for `(seq, journal_offset)` whose thread is told apart by the id.
    fn waiter(id: u64, seq: u64, journal_offset: u64) -> SyncWaiter {
        SyncWaiter {
            id,
            seq,
            journal_offset,
            thread: std::thread::current(),
        }
    }

    fn ids(s: &SyncState) -> Vec<u64> {
        s.waiting.iter().map(|w| w.id).collect()
    }

    #[test]
    fn a_round_wakes_the_waiters_it_covered_and_one_successor() {
        let mut s = SyncState {
            data_seq: 10,
            journal: 100,
            ..SyncState::default()
        };
        s.waiting.push_back(waiter(1, 12, 0)); // not covered: the successor
        s.waiting.push_back(waiter(2, 10, 100)); // covered
        s.waiting.push_back(waiter(3, 5, 101)); // journal not covered: stays
        s.waiting.push_back(waiter(4, 9, 50)); // covered
        let woken = s.take_woken_after_round();
        assert_eq!(woken.len(), 3, "two covered and the successor");
        assert_eq!(
            ids(&s),
            [3],
            "the rest stay listed for the successor's round"
        );
    }

    #[test]
    fn covers_needs_both_the_data_and_the_journal() {
        let s = SyncState {
            data_seq: 10,
            journal: 100,
            ..SyncState::default()
        };
        assert!(s.covers(10, 100));
        assert!(s.covers(0, 0));
        assert!(!s.covers(11, 0));
        assert!(!s.covers(0, 101));
    }

    #[test]
    fn a_failed_round_wakes_everyone() {
        let mut s = SyncState::default();
        for id in 0..5 {
            s.waiting.push_back(waiter(id, 1, 1));
        }
        assert_eq!(s.take_all().len(), 5);
        assert!(s.waiting.is_empty());
    }
}
