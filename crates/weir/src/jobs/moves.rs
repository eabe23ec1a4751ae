//! What a holder does with a reserved job (delete, release, bury, touch), kicking
//! buried jobs back, peeking, and a tube's counts.
//!
//! A job that changes lane is appended to its new lane first and confirmed in its
//! old one after (see the module docs of `jobs`).

use std::time::Duration;

use super::tube::{Job, Reserved, Tube};
use crate::error::Result;
use crate::item::{JobMeta, TakeMode};

/// A tube's counts, as beanstalkd's `stats-tube` gives them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TubeStats {
    pub ready: u64,
    pub reserved: u64,
    pub buried: u64,
    pub delayed: u64,
    /// Jobs put through this store since it opened.
    pub total_put: u64,
    /// Lanes with jobs of a priority of their own.
    pub priority_lanes: u64,
}

impl Tube {
    /// Deletes a reserved job; false when the reservation had ended (its ttr passed).
    pub fn delete(&self, reserved: &Reserved) -> Result<bool> {
        reserved.lane.confirm(reserved.lease)
    }

    /// [`Tube::delete`] for async callers.
    pub async fn delete_async(&self, reserved: &Reserved) -> Result<bool> {
        reserved.lane.confirm_async(reserved.lease).await
    }

    /// [`Tube::release`] with the job's own priority, for async callers (another
    /// priority moves the job: [`Tube::release`] off the event loop).
    pub async fn release_async(&self, reserved: &Reserved) -> Result<bool> {
        reserved.lane.release_async(reserved.lease).await
    }

    /// Gives a reserved job back, ready, with `priority` (a lane of its own when it
    /// changes). False when the reservation had ended.
    pub fn release(&self, reserved: &Reserved, priority: u32) -> Result<bool> {
        if priority == reserved.job.priority {
            return reserved.lane.release(reserved.lease);
        }
        self.move_to(
            reserved,
            |tube, meta| tube.append(&reserved.job.data, reserved.job.flags, meta, true),
            priority,
        )
    }

    /// Moves a reserved job to the buried lane, keeping its priority.
    pub fn bury(&self, reserved: &Reserved) -> Result<bool> {
        let priority = reserved.job.priority;
        self.move_to(
            reserved,
            |tube, meta| {
                let lane = tube.buried_lane(true)?;
                let options = crate::AppendOptions {
                    flags: reserved.job.flags,
                    job: Some(meta),
                    ..crate::AppendOptions::default()
                };
                match lane {
                    Some(lane) => lane.append(&reserved.job.data, options).map(|_| ()),
                    None => Ok(()),
                }
            },
            priority,
        )
    }

    /// The reservation lasts the job's ttr from now again (beanstalkd's `touch`).
    pub fn touch(&self, reserved: &Reserved) -> Result<bool> {
        reserved.lane.touch(reserved.lease, Some(reserved.job.ttr))
    }

    /// Appends the reserved job where `put` says (with `priority`), then ends its
    /// reservation as confirmed. False, and nothing appended, when it had ended.
    pub(super) fn move_to(
        &self,
        reserved: &Reserved,
        put: impl FnOnce(&Tube, JobMeta) -> Result<()>,
        priority: u32,
    ) -> Result<bool> {
        // Held still? A touch that changes nothing says so without a write.
        if !reserved
            .lane
            .touch(reserved.lease, Some(reserved.job.ttr))?
        {
            return Ok(false);
        }
        let meta = JobMeta {
            id: reserved.job.id,
            priority,
            ttr_s: u32::try_from(reserved.job.ttr.as_secs()).unwrap_or(u32::MAX),
            due_ms: 0,
        };
        put(self, meta)?;
        // Its holder's: only a ttr passing in between could end it, and then the job
        // is in both lanes (delivered twice), as after a crash here.
        reserved.lane.confirm(reserved.lease)?;
        Ok(true)
    }

    /// Moves up to `count` buried jobs, oldest first, back to their ready lanes, or,
    /// with none buried, up to `count` delayed jobs, earliest due first (beanstalkd's
    /// `kick`); how many moved.
    pub fn kick(&self, count: u64) -> Result<u64> {
        // One kick at a time per tube, and none while `kick_job` moves a job.
        let _wheel = self.lanes.wheel.lock();
        let buried = self
            .buried_lane(false)?
            .filter(|b| default_reader_counts(&b.stats()).0 > 0);
        let Some(buried) = buried else {
            return self.kick_delayed_locked(count);
        };
        let reader = buried.reader("")?;
        let mut kicked = 0;
        while kicked < count {
            let Some(lease) = reader.take_leased()? else {
                break;
            };
            let job = self.job_of(lease.item, self.priority_default());
            let meta = JobMeta {
                id: job.id,
                priority: job.priority,
                ttr_s: u32::try_from(job.ttr.as_secs()).unwrap_or(u32::MAX),
                due_ms: 0,
            };
            if let Err(e) = self.append(&job.data, job.flags, meta, true) {
                let _ = reader.release(lease.id);
                return Err(e);
            }
            reader.confirm(lease.id)?;
            kicked += 1;
        }
        Ok(kicked)
    }

    /// The most urgent ready job, without reserving it.
    pub fn peek_ready(&self) -> Result<Option<Job>> {
        self.promote_due()?;
        for (priority, lane) in self.ready_lanes()? {
            if let Some(t) = lane.reader("")?.take_mode(TakeMode::Peek)? {
                return Ok(Some(self.job_of(t.item, priority)));
            }
        }
        Ok(None)
    }

    /// The oldest buried job.
    pub fn peek_buried(&self) -> Result<Option<Job>> {
        let Some(buried) = self.buried_lane(false)? else {
            return Ok(None);
        };
        let peeked = buried.reader("")?.take_mode(TakeMode::Peek)?;
        let default = self.priority_default();
        Ok(peeked.map(|t| self.job_of(t.item, default)))
    }

    /// Ready, reserved, buried and delayed jobs now.
    pub fn stats(&self) -> Result<TubeStats> {
        self.promote_due()?;
        let mut stats = TubeStats {
            total_put: self.lanes.put.load(std::sync::atomic::Ordering::Relaxed),
            ..TubeStats::default()
        };
        for (i, (_, lane)) in self.ready_lanes()?.into_iter().enumerate() {
            let (items, leased) = default_reader_counts(&lane.stats());
            stats.ready += items.saturating_sub(leased);
            stats.reserved += leased;
            stats.priority_lanes += u64::from(i > 0);
        }
        if let Some(buried) = self.buried_lane(false)? {
            stats.buried = default_reader_counts(&buried.stats()).0;
        }
        stats.delayed = self.delayed_count()?;
        Ok(stats)
    }

    /// How long the reservation has left: `None` when it has ended.
    pub fn time_left(&self, reserved: &Reserved) -> Option<Duration> {
        reserved.lane.lease_time_left(reserved.lease)
    }
}

/// Items pending and leased for a lane's default reader (all items with no reader).
fn default_reader_counts(stats: &crate::QueueStats) -> (u64, u64) {
    match stats.readers.iter().find(|r| r.name.is_empty()) {
        Some(r) => (r.items, r.open_leases),
        None => (stats.items, 0),
    }
}
