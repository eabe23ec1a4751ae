//! The work-queue features' handles ([`Jobs`], [`Tube`]) and a job as stored and as
//! reserved; putting a job in its lane, and the lanes of a tube (see the module docs
//! of `jobs`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::ids;
use super::lane_name;
use super::shared::{JobsShared, TubeLanes};
use crate::error::{Error, Result};
use crate::item::{AppendOptions, Item, JobMeta, LeaseId};
use crate::queue::Queue;
use crate::reader::Reader;
use crate::store::Store;

/// The ttr of a job that has none (an item set through the memcache door into a
/// tube whose queue has no `open_timeout`): beanstalkd clients' usual default.
pub const TTR_DEFAULT: Duration = Duration::from_secs(120);

/// Bit 63 of an id made from a plain item's seq ([`plain_id`]).
const PLAIN_ID_BIT: u64 = 1 << 63;

/// The work-queue features of a store: `store.jobs()`.
#[derive(Clone)]
pub struct Jobs {
    pub(super) store: Store,
    pub(super) shared: Arc<JobsShared>,
}

/// One tube: a queue and its lanes.
#[derive(Clone)]
pub struct Tube {
    pub(super) jobs: Jobs,
    pub(super) name: Arc<str>,
    pub(super) queue: Queue,
    pub(super) lanes: Arc<TubeLanes>,
}

/// A job as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub id: u64,
    pub priority: u32,
    pub ttr: Duration,
    pub data: Bytes,
    pub flags: u32,
    pub enqueued_at_ms: u64,
    /// When a delayed job becomes ready (Unix ms); 0 for one that is not delayed.
    pub due_ms: u64,
}

/// A job handed out by `reserve`, held until deleted, released, buried or its ttr
/// passes.
#[derive(Clone, Debug)]
pub struct Reserved {
    pub job: Job,
    /// How many times this lane handed the job out, this time included.
    pub deliveries: u32,
    pub(super) lane: Reader,
    pub(super) lease: LeaseId,
}

impl Store {
    /// The work-queue features of this store.
    pub fn jobs(&self) -> Jobs {
        Jobs {
            store: self.clone(),
            shared: self.jobs_shared(),
        }
    }
}

impl Jobs {
    /// The tube `name` (its queue is created on first use).
    pub fn tube(&self, name: &str) -> Result<Tube> {
        if lane_name::tube_of_lane(name).is_some() {
            return Err(Error::InvalidArgument(format!(
                "{name:?} is a lane's name, not a tube's"
            )));
        }
        let queue = self.store.queue(name)?;
        let tube = Tube {
            jobs: self.clone(),
            name: Arc::from(name),
            lanes: self.shared.tube(name),
            queue,
        };
        tube.load_buckets();
        Ok(tube)
    }
}

impl Tube {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The work-queue features of the store this tube is in.
    pub fn jobs(&self) -> &Jobs {
        &self.jobs
    }

    /// The tube's queue.
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// Stores a job; returns its id. Durable as the tube's queue's appends are.
    pub fn put(&self, data: &[u8], priority: u32, ttr: Duration) -> Result<u64> {
        let meta = self.new_job(priority, ttr)?;
        self.append(data, 0, meta, false)?;
        self.lanes.put.fetch_add(1, Ordering::Relaxed);
        Ok(meta.id)
    }

    /// [`Tube::put`] for async callers (an event loop), when it needs no file work
    /// and no wait for a lock: the job's lane is there already (the tube's own queue
    /// for `priority_default`, else a lane an earlier put made), nobody holds the
    /// tube's `lanes` lock (a lane being made or deleted, a move into a lane waiting
    /// for its fsync), and the job id needs no write of the id counter's file. The
    /// append runs on the caller's thread as any queue's does, the fsync wait (under
    /// `synced`) on tokio's blocking pool. `Ok(None)` otherwise: put that job with
    /// [`Tube::put`] off the event loop.
    pub async fn put_async(
        &self,
        data: &[u8],
        priority: u32,
        ttr: Duration,
    ) -> Result<Option<u64>> {
        let own = priority == self.priority_default();
        if !own && !self.has_lane(priority) {
            return Ok(None);
        }
        let (core, ticket, id) = {
            // Held across the append to another priority's lane, as in `append`: an
            // empty lane is deleted under it. The tube's own queue needs no lock.
            let _lanes = if own {
                None
            } else {
                let Some(guard) = self.lanes.lanes.try_lock() else {
                    return Ok(None);
                };
                Some(guard)
            };
            let lane = if own {
                self.queue.clone()
            } else {
                let name = lane_name::priority_lane(&self.name, priority);
                match self.jobs.store.existing_queue(&name)? {
                    Some(lane) => lane,
                    None => return Ok(None),
                }
            };
            let Some(meta) = self.new_job_in_block(priority, ttr) else {
                return Ok(None);
            };
            let options = AppendOptions {
                job: Some(meta),
                ..AppendOptions::default()
            };
            let (_, ticket) = lane.core.append_batch(&[data], options)?;
            (lane.core, ticket, meta.id)
        };
        core.wait_durable_async(ticket).await?;
        self.lanes.appended.notify_waiters();
        self.lanes.put.fetch_add(1, Ordering::Relaxed);
        Ok(Some(id))
    }

    /// The tube's default priority: its jobs live in the tube's own queue.
    pub(super) fn priority_default(&self) -> u32 {
        self.queue.core.priority_default()
    }

    /// Whether `priority` has a lane this process knows of (no lookup of the store's
    /// queues: `false` until the lanes were read once).
    pub(super) fn has_lane(&self, priority: u32) -> bool {
        self.lanes
            .priorities
            .lock()
            .as_ref()
            .is_some_and(|p| p.contains(&priority))
    }

    /// [`Tube::new_job`] when its id needs no write of the counter's file (the
    /// counter open, its block not used up); `None` otherwise.
    pub(super) fn new_job_in_block(&self, priority: u32, ttr: Duration) -> Option<JobMeta> {
        let counter = self.jobs.shared.ids_if_open()?.next_in_block()?;
        Some(JobMeta {
            id: ids::id_for(counter, &self.name),
            priority,
            ttr_s: ttr_seconds(ttr),
            due_ms: 0,
        })
    }

    /// A new job's id and settings.
    pub(super) fn new_job(&self, priority: u32, ttr: Duration) -> Result<JobMeta> {
        let ids = self
            .jobs
            .shared
            .ids(self.jobs.store.dir())
            .map_err(|e| Error::io("handing out a job id", e))?;
        let counter = ids
            .next()
            .map_err(|e| Error::io("handing out a job id", e))?;
        Ok(JobMeta {
            id: ids::id_for(counter, &self.name),
            priority,
            ttr_s: ttr_seconds(ttr),
            due_ms: 0,
        })
    }

    /// Appends `data` as the job `meta` to the ready lane of its priority. A job
    /// `moved` from another lane goes to the default lane when its priority can get
    /// no lane of its own (`priorities_max`); a new put is refused then.
    pub(super) fn append(&self, data: &[u8], flags: u32, meta: JobMeta, moved: bool) -> Result<()> {
        let options = AppendOptions {
            flags,
            job: Some(meta),
            ..AppendOptions::default()
        };
        if meta.priority == self.priority_default() {
            self.queue.append(data, options)?;
        } else {
            // Held across the append: an empty lane is deleted under it too.
            let _lanes = self.lanes.lanes.lock();
            let lane = match self.ready_lane(meta.priority) {
                Ok(lane) => lane,
                Err(e) if moved && e.kind() == crate::ErrorKind::InvalidArgument => {
                    tracing::warn!(tube = %self.name, error = %e, "a moved job's priority has no lane; it is ready in the default one");
                    self.queue.clone()
                }
                Err(e) => return Err(e),
            };
            lane.append(data, options)?;
        }
        self.lanes.appended.notify_waiters();
        Ok(())
    }

    /// The queue holding ready jobs of `priority`, made when missing.
    pub(super) fn ready_lane(&self, priority: u32) -> Result<Queue> {
        if priority == self.priority_default() {
            return Ok(self.queue.clone());
        }
        let known = self.priorities().contains(&priority);
        if !known {
            self.make_room_for_a_lane()?;
        }
        let lane = self
            .jobs
            .store
            .queue(&lane_name::priority_lane(&self.name, priority))?;
        if !known {
            if let Some(p) = self.lanes.priorities.lock().as_mut() {
                p.insert(priority);
            }
        }
        Ok(lane)
    }

    /// The priorities with a lane, read from the store's queues the first time.
    pub(super) fn priorities(&self) -> std::collections::BTreeSet<u32> {
        let mut known = self.lanes.priorities.lock();
        if let Some(p) = known.as_ref() {
            return p.clone();
        }
        let found: std::collections::BTreeSet<u32> = self
            .jobs
            .store
            .queue_names()
            .iter()
            .filter_map(|q| lane_name::lane_priority(&self.name, q))
            .collect();
        *known = Some(found.clone());
        found
    }

    pub(super) fn forget_lane(&self, priority: u32) {
        if let Some(p) = self.lanes.priorities.lock().as_mut() {
            p.remove(&priority);
        }
    }

    /// Under `priorities_max` lanes (the default priority's counts), deleting empty
    /// lanes first when at it.
    pub(super) fn make_room_for_a_lane(&self) -> Result<()> {
        let max = self.queue.config().priorities_max.max(1) as usize;
        let in_use = |p: &std::collections::BTreeSet<u32>| p.len() + 1;
        let priorities = self.priorities();
        if in_use(&priorities) < max {
            return Ok(());
        }
        for p in priorities {
            let name = lane_name::priority_lane(&self.name, p);
            let Some(lane) = self.jobs.store.existing_queue(&name)? else {
                self.forget_lane(p);
                continue;
            };
            let stats = lane.stats();
            if stats.items == 0 && stats.open_leases == 0 {
                self.jobs.store.delete_queue(&name)?;
                self.forget_lane(p);
            }
        }
        if in_use(&self.priorities()) < max {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "tube {} has jobs of {max} priorities already (priorities_max); use one of those",
            self.name
        )))
    }

    /// The ready lanes, most urgent first.
    pub(super) fn ready_lanes(&self) -> Result<Vec<(u32, Queue)>> {
        let default = self.priority_default();
        let mut lanes = vec![(default, self.queue.clone())];
        for p in self.priorities() {
            let name = lane_name::priority_lane(&self.name, p);
            match self.jobs.store.existing_queue(&name)? {
                Some(q) => lanes.push((p, q)),
                None => self.forget_lane(p),
            }
        }
        lanes.sort_by_key(|(p, _)| *p);
        Ok(lanes)
    }

    /// The lane of buried jobs, if it exists (`make`: made when missing).
    pub(super) fn buried_lane(&self, make: bool) -> Result<Option<Queue>> {
        let name = lane_name::buried_lane(&self.name);
        if make {
            return self.jobs.store.queue(&name).map(Some);
        }
        self.jobs.store.existing_queue(&name)
    }

    /// The job an item of a lane of this tube is.
    pub(super) fn job_of(&self, item: Item, lane_priority: u32) -> Job {
        let (id, priority, ttr, due_ms) = match item.job {
            Some(meta) => (
                meta.id,
                meta.priority,
                Duration::from_secs(meta.ttr_s.into()),
                meta.due_ms,
            ),
            None => (
                plain_id(item.seq, &self.name),
                lane_priority,
                // Asked only for a plain item (the copy of the config is no cost then).
                self.queue.config().open_timeout.unwrap_or(TTR_DEFAULT),
                0,
            ),
        };
        Job {
            id,
            priority,
            ttr,
            data: item.data,
            flags: item.flags,
            enqueued_at_ms: item.enqueued_at_ms,
            due_ms,
        }
    }
}

/// The id of a plain item (no job extension) of a tube's queue: bit 63, its seq, and
/// the tube's name hash; stable, and found by its seq without a read.
pub(super) fn plain_id(seq: u64, tube: &str) -> u64 {
    PLAIN_ID_BIT | ((seq & ((1 << 47) - 1)) << 16) | u64::from(ids::tube_hash(tube))
}

/// The seq of a plain item's id, if `id` is one.
pub(super) fn plain_seq(id: u64) -> Option<u64> {
    (id & PLAIN_ID_BIT != 0).then_some((id & !PLAIN_ID_BIT) >> 16)
}

/// A ttr in whole seconds, at least 1 (beanstalkd's rule: 0 means 1).
fn ttr_seconds(ttr: Duration) -> u32 {
    u32::try_from(ttr.as_secs()).unwrap_or(u32::MAX).max(1)
}
