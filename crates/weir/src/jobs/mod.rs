//! Work-queue features over the engine's queues: priorities, bury and kick, jobs named
//! by an id (beanstalkd's model), for one reader of a queue (its default reader).
//!
//! A *tube* is a queue. A job is an item stored with a job extension (its id,
//! priority and time-to-run, `JobMeta`). Jobs of the tube's default priority
//! (`QueueConfig::priority_default`) live in the tube's own queue; each other priority
//! in use gets a *lane*, a queue of its own named `lane:TUBE:pN` ([`lane_name`]), and
//! buried jobs live in `lane:TUBE:buried`. A lane is a complete engine queue: its
//! segments, its reader journal, its crash recovery. So nothing here keeps a job in
//! memory, and a queue that uses none of it runs exactly as before.
//!
//! - `reserve` takes from the ready lanes by urgency (smaller priority first, then
//!   the order jobs arrived in a lane: beanstalkd's priority-then-id order where ids
//!   follow arrival), under a lease that lasts the job's ttr.
//! - A job that changes lane (released with another priority, buried, kicked) is
//!   appended to the new lane with its extension, then confirmed in the old one: a
//!   process killed between the two leaves it in both (delivered twice, with the same
//!   id), never in neither. It starts its delivery count again there.
//! - Finding a job by its id: the id's low 16 bits are a hash of its tube's name
//!   (`ids.rs`), so only tubes with that hash are looked at; in them, each lane is read
//!   in order until the job is found (no index is kept: a lookup costs a read of the
//!   tube's lanes). A reserved job is found by its holder, who keeps it.
//! - Lanes per tube are bounded (`priorities_max`); a put past it first deletes the
//!   empty ones, then is refused.
//!
//! Items a tube's queue got without an extension (a memcache `set`) are jobs too: of
//! the default priority, the queue's `open_timeout` (or 120 s) as ttr, and an id made
//! from their seq (`plain_id`), found without a read.

mod delays;
pub(crate) mod ids;
pub mod lane_name;
mod lookup;
mod moves;
mod reserve;
pub(crate) mod shared;
mod tube;
mod wheel;

pub use self::lookup::{Found, JobState};
pub use self::moves::TubeStats;
pub use self::tube::{Job, Jobs, Reserved, Tube, TTR_DEFAULT};
