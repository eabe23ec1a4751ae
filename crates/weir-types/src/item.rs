//! An item as stored and handed out, the options of an append, a take's mode and
//! what it returns: the same on every backend.

use std::time::Duration;

use bytes::Bytes;

/// One item of a queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    /// Sequence number, unique and increasing within its queue (first item is 1).
    pub seq: u64,
    /// The payload; may be empty.
    pub data: Bytes,
    /// Opaque flags stored with the item (memcache's `flags`).
    pub flags: u32,
    /// Enqueue time, Unix milliseconds.
    pub enqueued_at_ms: u64,
    /// Expiry time, Unix milliseconds; 0 means never.
    pub expires_at_ms: u64,
    /// What the work-queue features keep with the item, when it was appended with it
    /// ([`AppendOptions::job`]); `None` for a plain item.
    pub job: Option<JobMeta>,
}

/// A job's id, priority and time-to-run, stored with its item: the id stays the same
/// when the job moves (released with another priority, buried, kicked, made ready).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct JobMeta {
    /// Unique in the store and never reused.
    pub id: u64,
    /// Smaller is more urgent (beanstalkd's order); 0 is the most urgent.
    pub priority: u32,
    /// Seconds a reservation lasts before the job goes back (beanstalkd's ttr).
    pub ttr_s: u32,
    /// When a delayed job becomes ready (Unix ms); 0 for a job ready when stored.
    pub due_ms: u64,
}

impl Item {
    /// When the item expires in a queue whose `max_age` is `max_age` (Unix
    /// milliseconds; [`NEVER`](crate::NEVER) when never): see [`expiry_ms`](crate::expiry_ms).
    pub fn expiry_ms(&self, max_age: Option<Duration>) -> u64 {
        crate::expiry::expiry_ms(self.expires_at_ms, self.enqueued_at_ms, max_age)
    }

    /// Whether the item has expired at `now_ms` (Unix milliseconds) in a queue whose
    /// `max_age` is `max_age` (the queue's `max_age` setting): exactly when the
    /// queue stops handing it out.
    pub fn is_expired_at(&self, now_ms: u64, max_age: Option<Duration>) -> bool {
        self.expiry_ms(max_age) <= now_ms
    }
}

/// Options of one append.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AppendOptions {
    /// Flags stored with the item.
    pub flags: u32,
    /// Expiry time in Unix milliseconds; 0 means never. A time in the past stores an
    /// item that is already expired (it is never delivered).
    pub expires_at_ms: u64,
    /// Return only once the item is fdatasync'ed, whatever the queue's durability.
    pub sync: bool,
    /// Store the item as a job with this id, priority, ttr and due time (24 bytes more
    /// on disk).
    /// Only for an append of one item: a batch with it is refused.
    pub job: Option<JobMeta>,
}

/// Identifies a lease within its reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub u64);

/// An item handed out under a lease: confirm or release it by `id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub id: LeaseId,
    pub item: Item,
    /// How many times the reader has been handed this item, this time included (see
    /// [`Taken::deliveries`]).
    pub deliveries: u32,
}

/// What a take does with the item it finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TakeMode {
    /// Take and confirm at once (a plain `get`).
    Take,
    /// Take under a lease (`get q/open`).
    Lease,
    /// Look at the next item without taking it.
    Peek,
}

/// What a take returns: the item, and its lease when taken with [`TakeMode::Lease`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taken {
    pub item: Item,
    pub lease: Option<LeaseId>,
    /// How many times the reader has been handed this item, this time included: 1 the
    /// first time, one more after each time it came back unconfirmed (released, or its
    /// lease timed out). For a peek, which hands nothing out, the times before. A
    /// delivery under way when the process was killed is not counted.
    pub deliveries: u32,
}
