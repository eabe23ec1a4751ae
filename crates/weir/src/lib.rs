//! # weir: a durable queue on local disk
//!
//! A [`Store`] owns a data directory. It holds named [`Queue`]s; each queue is a
//! segmented, append-only log of [`Item`]s on disk with CRC32C-framed records. Named
//! [`Reader`]s keep positions in a queue: every reader sees every item (fanout), and
//! handles on one reader compete for items (work queue). An item can be taken under a
//! lease and confirmed or released later; a released (or timed-out, or crashed) lease
//! comes back ahead of newer items.
//!
//! Memory does not grow with the backlog: the engine keeps no per-item index, only
//! per-lease state. Durability is a per-queue setting ([`Durability`]); see
//! `docs/storage.md` for exactly what each mode can lose in a crash.
//!
//! ```
//! use weir::{AppendOptions, Store};
//!
//! # fn main() -> weir::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let store = Store::open(dir.path())?;
//! let jobs = store.queue("jobs")?;
//! jobs.append(b"resize photo 17", AppendOptions::default())?;
//!
//! // A reliable read: take under a lease, then confirm once the work is done.
//! let workers = jobs.reader("")?;
//! let lease = workers.take_leased()?.expect("an item");
//! assert_eq!(&lease.item.data[..], b"resize photo 17");
//! workers.confirm(lease.id)?;
//! assert!(workers.take()?.is_none());
//! # Ok(())
//! # }
//! ```

mod clock;
mod config;
mod error;
#[cfg(feature = "fault-injection")]
#[doc(hidden)]
pub mod fault;
mod file_cell;
mod frame;
mod intervals;
mod item;
pub mod jobs;

mod journal;
mod lockfile;
mod mapfile;
mod name;
mod queue;
mod reader;
mod reader_list;
mod readers;
mod redrive;
mod segment;
mod space_reserve;
mod stats;
mod store;

pub use crate::clock::{Clock, ManualClock};
pub use crate::config::{open_files_limit, ConfigFn, Durability, QueueConfig, StoreOptions};
pub use crate::error::{Error, ErrorKind, Result};
pub use crate::item::{AppendOptions, Item, JobMeta, Lease, LeaseId, TakeMode, Taken};
pub use crate::name::{validate_queue_name, validate_reader_name, NAME_LENGTH_MAX};
pub use crate::queue::Iter;
pub use crate::queue::Queue;
pub use crate::reader::Reader;
pub use crate::readers::READERS_PER_QUEUE_MAX;
pub use crate::stats::{QueueStats, ReaderStats};
pub use crate::store::Store;
pub use weir_types::{PendingLease, PENDING_LIST_MAX, REDRIVE_PER_CALL_MAX};
