//! `State`: everything a queue keeps behind its lock, and the helpers every operation
//! shares: the checks an operation starts with, journal appends, the reader list,
//! readers created on first use and flushed.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::clock::Clock;
use crate::config::{Durability, QueueConfig};
use crate::error::{Error, Result};
use crate::file_cell::FilesBudget;
use crate::journal::{Journal, JournalRecord, JournalState, ReaderRecord};
use crate::name::validate_reader_name;
use crate::reader_list::{self, ReaderList};
use crate::readers::{Readers, Slot, READERS_PER_QUEUE_MAX};
use crate::segment::{Loc, ReadBuf};
use crate::space_reserve::SpaceReserve;

use super::log::SegmentLog;
use super::reader_state::{new_reader, ReaderState};
use crate::error::{io_err, is_disk_full};

pub(super) struct State {
    /// The queue's name (its `expire_to` may not name itself).
    pub(super) name: String,
    pub(super) config: QueueConfig,
    /// The store's clock: item expiry, enqueue times, lease deadlines.
    pub(super) clock: Clock,
    pub(super) closed: bool,
    pub(super) deleted: bool,
    /// An fsync failed: the kernel may have dropped the dirty pages, so a later fsync
    /// that succeeds proves nothing. The queue refuses work until the store reopens.
    pub(super) poisoned: Option<String>,
    /// The segment files, the last one written through a mapping.
    pub(super) log: SegmentLog,
    pub(super) next_seq: u64,
    /// Oldest seq kept when the queue has no reader.
    pub(super) floor: u64,
    /// The oldest item of a queue without readers, as `ReaderState::oldest_enqueued`.
    pub(super) floor_oldest: Option<(Loc, u64)>,
    /// `(floor, ms)`: the oldest item of a queue without readers cannot expire before
    /// `ms` (see `ReaderState::head_expiry`).
    pub(super) floor_head_expiry: Option<(u64, u64)>,
    /// The store's tally of open descriptors (see `file_cell.rs`), which every file
    /// of the queue counts itself in; `None` once the store is gone.
    pub(super) tally: Option<Arc<FilesBudget>>,
    /// Oldest seq kept for readers the store lost track of (see `reader_list.rs`):
    /// nothing from it on is reclaimed until the whole queue is flushed.
    pub(super) hold: Option<u64>,
    /// Seqs found missing at open, past the last item on disk, that some reader had
    /// confirmed already (`State::retire_lost_seqs`): a reader that skips them later
    /// meets a loss the open explained, not damage.
    pub(super) retired: std::ops::Range<u64>,
    /// The reader list was rewritten since the last fsync.
    pub(super) reader_list_dirty: bool,
    /// The store's space reserve (`None` once the store is gone).
    pub(super) reserve: Option<Arc<SpaceReserve>>,
    /// The queue was created (`QueueCore::open_or_create`) and its files and
    /// directory entries not fsync'ed yet: its first fsync covers them all, its parent
    /// directory included.
    pub(super) created_unsynced: bool,
    pub(super) floor_bytes: u64,
    pub(super) floor_loc: Option<Loc>,
    pub(super) floor_discarded: u64,
    pub(super) floor_expired: u64,
    pub(super) floor_read_buf: ReadBuf,
    pub(super) readers: Readers<ReaderState>,
    pub(super) next_reader_id: u32,
    pub(super) next_lease_id: u64,
    /// A lease may have a deadline of its own (`touch`) though the queue sets no
    /// `open_timeout`: the background tick looks at the leases. Cleared by a tick that
    /// finds none with a deadline.
    pub(super) lease_deadlines: bool,
    pub(super) journal: Journal,
    pub(super) total_appended: u64,
    pub(super) corrupt_records: u64,
    /// Written since the last fsync.
    pub(super) dirty: bool,
    /// A file was created in the queue's directory since the last fsync.
    pub(super) dir_dirty: bool,
    /// Sealed segments not yet fsync'ed, with the descriptor they were written
    /// through (see `roll`).
    pub(super) unsynced: Vec<(PathBuf, Arc<File>)>,
    pub(super) last_sync: Instant,
    /// When the queue last wrote (an append or a journal record); windows idle for
    /// `IDLE_UNMAP` are unmapped.
    pub(super) last_write: Instant,
    /// Written since the background thread last looked.
    pub(super) wrote: bool,
    /// Used (an operation went through `ready`) since the background thread last
    /// looked, and when it last saw that: files close after [`IDLE_CLOSE`](super::idle::IDLE_CLOSE) unused.
    pub(super) used: bool,
    pub(super) last_used: Instant,
    /// The last take stopped after dropping `EXPIRED_PER_CALL_MAX` expired items.
    pub(super) expired_budget_spent: bool,
    pub(super) mapped: bool,
}

impl State {
    pub(super) fn check_usable(&self) -> Result<()> {
        if self.deleted {
            Err(Error::NotFound {
                what: format!("queue at {}", self.log.writer.path().display()),
            })
        } else if self.closed {
            Err(Error::Closed)
        } else if let Some(why) = &self.poisoned {
            Err(Error::io(
                format!(
                    "queue in {} failed an fsync earlier ({why}); reopen the store",
                    self.dir().display()
                ),
                io::Error::other("fsync failed"),
            ))
        } else {
            Ok(())
        }
    }

    /// Refuses work on a closed, deleted or poisoned queue, and opens its files again
    /// if they were closed while it was idle: every operation that may touch a file
    /// starts here.
    pub(super) fn ready(&mut self) -> Result<()> {
        self.check_usable()?;
        self.used = true;
        Ok(())
    }

    /// Creates the reader `name` on first use (a reader comes into being the first
    /// time it is read from), after [`State::ready`].
    pub(super) fn usable_reader(&mut self, name: &str) -> Result<Slot> {
        self.ready()?;
        if let Some(slot) = self.readers.slot(name) {
            return Ok(slot);
        }
        validate_reader_name(name)?;
        self.create_reader(name, false)?;
        self.readers.slot(name).ok_or_else(|| Error::NotFound {
            what: format!("reader {name:?}"),
        })
    }

    pub(super) fn dir(&self) -> &Path {
        self.log.writer.path().parent().unwrap_or(Path::new("."))
    }

    /// Whether the segment writer should stage appends: the queue is `buffered`.
    pub(super) fn staging_wanted(&self) -> bool {
        self.config.durability == Durability::Buffered
    }

    /// Stages appends in memory (see `mapfile.rs`) when the queue is `buffered`, and
    /// stops (writing what is staged) when it is not; nothing to do when it already
    /// matches.
    pub(super) fn apply_staging(&mut self) -> Result<()> {
        let on = self.staging_wanted();
        self.log
            .writer
            .set_staging(on)
            .map_err(|e| Error::io(format!("writing {}", self.log.writer.path().display()), e))
    }

    pub(super) fn journal_append(&mut self, rec: JournalRecord) -> Result<()> {
        let mut result = self.journal.append(&rec);
        if result.as_ref().is_err_and(is_disk_full) && self.release_reserve() {
            result = self.journal.append(&rec);
        }
        if let Err(e) = result {
            return Err(Error::io(
                format!("writing reader state in {}", self.dir().display()),
                e,
            ));
        }
        self.dirty = true;
        self.wrote = true;
        self.mapped = true;
        Ok(())
    }

    /// Gives the store's space reserve back to the file system (see
    /// `space_reserve.rs`), so that reader state can be written on a full disk; false
    /// when there was none left to give.
    pub(super) fn release_reserve(&self) -> bool {
        // For consuming only: a queue with nothing to consume (a new one, say) must not
        // take the space that readers of full queues need.
        let holds_items = self.oldest_kept() < self.next_seq;
        holds_items && self.reserve.as_ref().is_some_and(|r| r.release())
    }

    /// Rotates the journal when it is due. A failure leaves the current file in use.
    pub(super) fn maybe_rotate_journal(&mut self) {
        if !self.journal.needs_rotation() {
            return;
        }
        let state = self.journal_state();
        if let Err(e) = self.journal.rotate(&state) {
            tracing::warn!(dir = %self.dir().display(), error = %e, "could not rotate the reader journal");
        }
    }

    pub(super) fn journal_state(&self) -> JournalState {
        let mut readers = BTreeMap::new();
        for (name, r) in self.readers.iter() {
            readers.insert(
                r.id,
                ReaderRecord {
                    name: name.clone(),
                    acked_below: r.acked_below,
                    confirmed: r.confirmed.clone(),
                    returns: r.returns.clone(),
                },
            );
        }
        JournalState {
            floor: self.floor,
            readers,
            next_reader_id: self.next_reader_id,
        }
    }

    /// The oldest seq some reader (or, with none, the queue itself) still keeps: what a
    /// new reader starts at, and below which segments may go. A hold (readers lost with
    /// the journal and the reader list, see `reader_list.rs`) keeps everything from it.
    pub(super) fn oldest_kept(&self) -> u64 {
        let kept = self
            .readers
            .values()
            .map(|r| r.acked_below)
            .min()
            .unwrap_or(self.floor);
        self.hold.map_or(kept, |hold| kept.min(hold))
    }

    /// Rewrites the reader list (`reader_list.rs`) from the readers in memory, plus
    /// `extra` when one is about to be created; its fsync goes with the queue's next.
    pub(super) fn write_reader_list(&mut self, extra: Option<&str>) -> Result<()> {
        let mut names: Vec<String> = self.readers.keys().cloned().collect();
        names.extend(extra.map(str::to_string));
        let list = ReaderList {
            names,
            hold: self.hold,
        };
        let dir = self.dir().to_path_buf();
        let mut result = reader_list::write(&dir, &list);
        if result.as_ref().is_err_and(is_disk_full) && self.release_reserve() {
            result = reader_list::write(&dir, &list);
        }
        result
            .map_err(|e| Error::io(format!("writing the reader list in {}", dir.display()), e))?;
        self.reader_list_dirty = true;
        self.dir_dirty = true;
        Ok(())
    }

    /// Creates reader `name` at the oldest item kept, or with `at_end` after the
    /// newest: one journal record either way, so no crash or failed write can leave
    /// a reader meant for the end at the oldest item.
    pub(super) fn create_reader(&mut self, name: &str, at_end: bool) -> Result<()> {
        if self.readers.len() >= READERS_PER_QUEUE_MAX {
            return Err(Error::InvalidArgument(format!(
                "a queue has at most {READERS_PER_QUEUE_MAX} readers; delete one first"
            )));
        }
        let start = if at_end {
            self.next_seq
        } else {
            self.oldest_kept()
        };
        self.log.flush_staged()?;
        let cursor = self
            .log
            .locate(self.next_seq, start)
            .map_err(io_err(|| "locating a new reader".into()))?;
        let pending_bytes = match self.readers.values().min_by_key(|r| r.acked_below) {
            _ if at_end => 0,
            Some(r) if r.acked_below == start => r.pending_bytes,
            None if self.hold.is_none() => self.floor_bytes,
            // Starting below every reader (a hold): estimated from the files.
            _ => self.log.span_payload_bytes(cursor, self.next_seq - start),
        };
        // The list first: a crash before the journal record leaves a name in the list
        // that the journal does not have, and a readable journal wins.
        self.write_reader_list(Some(name))?;
        let id = self.next_reader_id;
        self.journal_append(JournalRecord::ReaderCreate {
            id,
            acked_below: start,
            name: name.to_string(),
        })?;
        self.next_reader_id += 1;
        self.readers.insert(
            name.to_string(),
            new_reader(id, start, cursor, pending_bytes),
        );
        Ok(())
    }

    pub(super) fn flush_reader(&mut self, name: &str) -> Result<u64> {
        let next_seq = self.next_seq;
        let tail = self
            .log
            .locate(next_seq, next_seq)
            .map_err(io_err(|| "locating the tail".into()))?;
        let Some((id, acked)) = self.readers.get(name).map(|r| (r.id, r.acked_below)) else {
            return Ok(0);
        };
        if acked < next_seq {
            self.journal_append(JournalRecord::Confirm {
                id,
                from: acked,
                to: next_seq,
            })?;
        }
        let Some(r) = self.readers.get_mut(name) else {
            return Ok(0);
        };
        let dropped = r.pending_items(next_seq);
        r.acked_below = next_seq;
        r.confirmed.clear();
        r.leases.clear();
        r.expire_moves = 0;
        r.expire_moves_bytes = 0;
        r.released.clear();
        r.forget_returns();
        r.cursor_seq = next_seq;
        r.cursor = tail;
        r.pending_bytes = 0;
        r.read_buf.clear();
        Ok(dropped)
    }
}
