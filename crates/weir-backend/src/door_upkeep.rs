//! What a front door that names every reader of its queues (the proxy; the capture
//! import) asks of the store besides items: a queue whose leases never time out, the
//! readers it no longer wants, a directory for its scratch files, and whether the
//! store may be out of reach for a while.
//!
//! These are on the interface so that a door never reaches the engine's own
//! `weir::Store`: each is one question with an answer on either home, and where the
//! two homes answer differently (a reader no longer wanted is deleted in the engine,
//! left in place on a cluster that other weir instances share) the difference is
//! said here, once, rather than in every front door.

use std::path::PathBuf;

use crate::{Backend, Queue, Reader, Result};

/// How long a lease of a queue lasts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LeaseTimeout {
    /// As the queue's settings say (`open_timeout`).
    #[default]
    AsConfigured,
    /// Never: a lease lasts until it is confirmed or given back, however long that
    /// takes. For a worker that holds an item while its receiver is down (a
    /// shadow's replay, a bus delivery): a lease ending under it would deliver the
    /// item twice.
    Never,
}

/// Settings a door asks for when it opens a queue
/// ([`Backend::queue_for_readers_with`]), over the queue's configured ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueOptions {
    pub lease_timeout: LeaseTimeout,
}

impl QueueOptions {
    /// A queue a worker drains at its receiver's pace: leases never time out.
    pub const NO_LEASE_TIMEOUT: QueueOptions = QueueOptions {
        lease_timeout: LeaseTimeout::Never,
    };
}

/// What [`Backend::forget_readers`] did with the readers no longer wanted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForgottenReaders {
    /// Deleted, with their positions and leases (the engine).
    pub deleted: Vec<String>,
    /// Left in place (JetStream: another weir instance may still read them), for the
    /// front door to name to the operator. `""` is the default reader.
    pub left: Vec<String>,
}

impl Backend {
    /// [`Backend::queue_for_readers`], with settings over the queue's configured
    /// ones.
    ///
    /// [`LeaseTimeout::Never`]: on the engine the queue's `open_timeout` is cleared
    /// (in this process, until the settings are reloaded; the door asks again each
    /// time it opens the queue). On JetStream nothing is changed, because it already
    /// holds there for the queues that ask for it: a lease is a delivered message
    /// awaiting its ack, and for a queue without `open_timeout` the instance renews
    /// every lease it holds (`+WPI`, see `jetstream::leases`) for as long as it holds it;
    /// weir's config gives no `open_timeout` to the proxy's and the bus's queues
    /// (`proxy:capture:*`, `bus:*`), and JetStream takes a queue's settings from the
    /// same [`crate::StoreOptions`]. A consumer's AckWait is the cluster's, shared
    /// by every weir instance, so one instance does not change it for the others.
    pub async fn queue_for_readers_with(
        &self,
        name: &str,
        readers: &[&str],
        new_at_end: bool,
        options: QueueOptions,
    ) -> Result<(Queue, Vec<Reader>)> {
        if let (Backend::Embedded(e), LeaseTimeout::Never) = (self, options.lease_timeout) {
            crate::readers_named::check_readers_named(readers)?;
            let queue = e.queue(name).await?;
            e.clear_lease_timeout(&queue).await?;
        }
        self.queue_for_readers(name, readers, new_at_end).await
    }

    /// Forgets the readers of `queue` for which `keep` is false: readers a door made
    /// and no longer wants (a shadow removed from the config), which would keep
    /// every item nobody reads. On the engine they are deleted: one process owns the
    /// data directory. On JetStream they are left in place and returned: several
    /// weir instances share the queue, and one still running an older config (a
    /// rolling deploy) may read them; the door names them for the operator to delete. A
    /// queue that does not exist has no reader and is not created. An error (the
    /// readers could not be listed, a deletion failed) stops at once: on the engine
    /// the readers deleted before it stay deleted.
    pub async fn forget_readers(
        &self,
        queue: &str,
        keep: impl Fn(&str) -> bool,
    ) -> Result<ForgottenReaders> {
        let mut forgotten = ForgottenReaders::default();
        match self {
            Backend::Embedded(e) => {
                // The queue's own list, not `stats` (which takes a queue it cannot
                // open for none): a failure to open it is the caller's to see.
                for name in e.reader_names(queue).await? {
                    if !keep(&name) && e.delete_reader(queue, &name).await? {
                        forgotten.deleted.push(name);
                    }
                }
            }
            #[cfg(feature = "jetstream")]
            Backend::JetStream(_) => {
                let stats = self.stats(Some(vec![queue.to_owned()])).await?;
                let names = stats.into_iter().flat_map(|q| q.readers).map(|r| r.name);
                forgotten.left.extend(names.filter(|name| !keep(name)));
            }
        }
        Ok(forgotten)
    }

    /// A directory for a door's scratch files (the proxy's spill files, unnamed and
    /// gone when closed): the data directory on the engine, a disk the operator
    /// sized for the queues; the system's temporary directory on JetStream, whose
    /// weir instances keep no data directory.
    pub fn scratch_dir(&self) -> PathBuf {
        match self {
            Backend::Embedded(e) => e.store().dir().to_path_buf(),
            #[cfg(feature = "jetstream")]
            Backend::JetStream(_) => std::env::temp_dir(),
        }
    }

    /// Whether the store may be out of reach for a while, which a door outlives: on
    /// JetStream the queues are across the network, and a door whose cluster does
    /// not answer keeps serving what it can and tries again (an error of kind
    /// [`crate::Kind::Unavailable`] says so). The engine is in this process: its
    /// failures are not an outage to wait out.
    pub fn may_be_unreachable(&self) -> bool {
        match self {
            Backend::Embedded(_) => false,
            #[cfg(feature = "jetstream")]
            Backend::JetStream(_) => true,
        }
    }
}
