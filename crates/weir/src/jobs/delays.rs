//! Delayed jobs: put or released with a delay, invisible to reserves until due, then
//! ready in their priority's lane.
//!
//! A delayed job waits in a bucket of the tube's delay wheel (`wheel.rs`), each
//! bucket a lane of its own (`lane:TUBE:dL-START`). What is ripe moves on when the
//! tube is next reserved from, peeked, kicked or counted ([`Tube::promote_due`]): a
//! level-0 bucket's jobs to their ready lanes, a coarser bucket's into finer ones; an
//! emptied bucket's lane is deleted. Moves append first and confirm after, as every
//! move between lanes does. In memory: the buckets that exist (at most 390 per tube),
//! never the jobs.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::lane_name;
use super::tube::{Job, Reserved, Tube};
use super::wheel::{self, Bucket};
use crate::error::Result;
use crate::item::{AppendOptions, JobMeta};
use crate::queue::Queue;

/// Delayed jobs one promotion moves at most, so that a reserve meeting a large ripe
/// bucket does a bounded piece of it (the rest at the next call).
pub(crate) const PROMOTED_PER_CALL: u64 = 1024;

impl Tube {
    /// Stores a job that becomes ready `delay` from now; returns its id.
    pub fn put_delayed(
        &self,
        data: &[u8],
        priority: u32,
        ttr: Duration,
        delay: Duration,
    ) -> Result<u64> {
        if delay.is_zero() {
            return self.put(data, priority, ttr);
        }
        let mut meta = self.new_job(priority, ttr)?;
        meta.due_ms = self.due_after(delay);
        self.schedule(data, 0, meta, false)?;
        self.lanes.put.fetch_add(1, Ordering::Relaxed);
        Ok(meta.id)
    }

    /// [`Tube::put_delayed`] for async callers (an event loop) when it needs no file
    /// work and no wait for a lock: the job's bucket of the delay wheel exists
    /// already (an earlier put made it), no bucket is ripe (moving ripe jobs on is
    /// file work), the job's priority is the tube's default or has a lane, nobody
    /// holds the tube's `wheel` lock (promotions, kicks, a delete by id and a
    /// lookup's second read hold it across fsyncs and scans), and the job id needs no
    /// write of the id counter's file. The append runs on the caller's thread, the
    /// fsync wait (under `synced`) on tokio's blocking pool. `Ok(None)` otherwise: put
    /// that job with [`Tube::put_delayed`] off the event loop.
    pub async fn put_delayed_async(
        &self,
        data: &[u8],
        priority: u32,
        ttr: Duration,
        delay: Duration,
    ) -> Result<Option<u64>> {
        if delay.is_zero() {
            return self.put_async(data, priority, ttr).await;
        }
        if self.has_ripe() || (priority != self.priority_default() && !self.has_lane(priority)) {
            return Ok(None);
        }
        let (core, ticket, id) = {
            // Held across the append: an emptied bucket's lane is deleted under it.
            let Some(_wheel) = self.lanes.wheel.try_lock() else {
                return Ok(None);
            };
            let now = self.jobs.store.clock().now_ms();
            let due_ms = self.due_after(delay);
            let Some(bucket) = wheel::bucket_for(due_ms, now) else {
                return Ok(None);
            };
            let name = lane_name::delay_lane(&self.name, bucket.level, bucket.start_ms);
            let Some(lane) = self.jobs.store.existing_queue(&name)? else {
                return Ok(None);
            };
            let Some(mut meta) = self.new_job_in_block(priority, ttr) else {
                return Ok(None);
            };
            meta.due_ms = due_ms;
            let options = AppendOptions {
                job: Some(meta),
                ..AppendOptions::default()
            };
            let (_, ticket) = lane.core.append_batch(&[data], options)?;
            self.note_bucket(bucket);
            (lane.core, ticket, meta.id)
        };
        core.wait_durable_async(ticket).await?;
        self.lanes.put.fetch_add(1, Ordering::Relaxed);
        Ok(Some(id))
    }

    /// Gives a reserved job back with `priority`, ready `delay` from now.
    pub fn release_delayed(
        &self,
        reserved: &Reserved,
        priority: u32,
        delay: Duration,
    ) -> Result<bool> {
        if delay.is_zero() {
            return self.release(reserved, priority);
        }
        let due_ms = self.due_after(delay);
        self.move_to(
            reserved,
            |tube, mut meta| {
                meta.due_ms = due_ms;
                tube.schedule(&reserved.job.data, reserved.job.flags, meta, true)
            },
            priority,
        )
    }

    fn due_after(&self, delay: Duration) -> u64 {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.jobs.store.clock().now_ms().saturating_add(ms)
    }

    /// Puts the job `meta` (with its `due_ms`) where it waits: a bucket, or its ready
    /// lane when it is due already.
    pub(super) fn schedule(
        &self,
        data: &[u8],
        flags: u32,
        meta: JobMeta,
        moved: bool,
    ) -> Result<()> {
        let now = self.jobs.store.clock().now_ms();
        let Some(bucket) = wheel::bucket_for(meta.due_ms, now) else {
            return self.append(data, flags, JobMeta { due_ms: 0, ..meta }, moved);
        };
        if !moved && meta.priority != self.priority_default() {
            // Its lane is made now, so that a priority past `priorities_max` is
            // refused at the put, not found out when the job comes due.
            let _lanes = self.lanes.lanes.lock();
            self.ready_lane(meta.priority)?;
        }
        let _wheel = self.lanes.wheel.lock();
        let lane = self.jobs.store.queue(&lane_name::delay_lane(
            &self.name,
            bucket.level,
            bucket.start_ms,
        ))?;
        let options = AppendOptions {
            flags,
            job: Some(meta),
            ..AppendOptions::default()
        };
        lane.append(data, options)?;
        self.note_bucket(bucket);
        // Ripe buckets move on with the puts too: a tube nobody reserves from does
        // not gather a bucket for every 128 ms that has passed.
        if self.has_ripe() {
            if let Err(e) = self.promote_due_locked() {
                tracing::warn!(tube = %self.name, error = %e, "could not move ripe delayed jobs on; the next reserve tries again");
            }
        }
        Ok(())
    }

    /// Whether a bucket is ripe now (one atomic read: what every reserve asks).
    pub fn has_ripe(&self) -> bool {
        self.lanes.next_ripe_ms.load(Ordering::Acquire) <= self.jobs.store.clock().now_ms()
    }

    /// Reads the buckets from the store's queues, once per tube and process.
    pub(super) fn load_buckets(&self) {
        self.buckets();
    }

    /// Moves the jobs of the ripe buckets on (to ready, or a finer bucket), at most
    /// 1,024 (`PROMOTED_PER_CALL`) of them, and deletes the emptied buckets' lanes; how many
    /// jobs moved. What is left stays ripe for the next call.
    pub fn promote_due(&self) -> Result<u64> {
        if !self.has_ripe() {
            return Ok(0);
        }
        let _wheel = self.lanes.wheel.lock();
        self.promote_due_locked()
    }

    /// [`Tube::promote_due`] under the wheel's lock.
    fn promote_due_locked(&self) -> Result<u64> {
        let now = self.jobs.store.clock().now_ms();
        let ripe: Vec<Bucket> = self
            .buckets()
            .into_iter()
            .take_while(|(at, _)| *at <= now)
            .map(|(_, b)| b)
            .collect();
        let mut moved = 0;
        for bucket in ripe {
            if moved >= PROMOTED_PER_CALL {
                break;
            }
            moved += self.empty_bucket(bucket, now, PROMOTED_PER_CALL - moved, false)?;
        }
        Ok(moved)
    }

    /// Moves up to `most` jobs of `bucket` on; when it is left empty, its lane goes.
    /// Called under the wheel's lock. A `kick` sends every job to ready, due or not;
    /// returns how many became ready (a kick) or moved (a promotion).
    fn empty_bucket(&self, bucket: Bucket, now: u64, most: u64, kick: bool) -> Result<u64> {
        let name = lane_name::delay_lane(&self.name, bucket.level, bucket.start_ms);
        let Some(lane) = self.jobs.store.existing_queue(&name)? else {
            self.forget_bucket(bucket);
            return Ok(0);
        };
        let reader = lane.reader("")?;
        let (mut ready, mut moved) = (0, 0);
        while moved < most {
            let Some(lease) = reader.take_leased()? else {
                break;
            };
            let mut job = self.job_of(lease.item, self.priority_default());
            let finer = if kick {
                None
            } else {
                wheel::bucket_for(job.due_ms, now)
            };
            let appended = match finer {
                None => {
                    job.due_ms = 0;
                    self.append(&job.data, job.flags, meta_of(&job), true)
                }
                Some(b) => self.append_to_bucket(b, &job),
            };
            if let Err(e) = appended {
                let _ = reader.release(lease.id);
                return Err(e);
            }
            reader.confirm(lease.id)?;
            ready += u64::from(finer.is_none());
            moved += 1;
        }
        let stats = lane.stats();
        if stats.items == 0 && stats.open_leases == 0 {
            self.jobs.store.delete_queue(&name)?;
            self.forget_bucket(bucket);
        }
        Ok(if kick { ready } else { moved })
    }

    /// Appends `job` to `bucket`'s lane (under the wheel's lock).
    fn append_to_bucket(&self, bucket: Bucket, job: &Job) -> Result<()> {
        let lane = self.jobs.store.queue(&lane_name::delay_lane(
            &self.name,
            bucket.level,
            bucket.start_ms,
        ))?;
        let options = AppendOptions {
            flags: job.flags,
            job: Some(meta_of(job)),
            ..AppendOptions::default()
        };
        lane.append(&job.data, options)?;
        self.note_bucket(bucket);
        Ok(())
    }

    /// Moves up to `count` delayed jobs to ready, the earliest buckets first; how
    /// many moved (beanstalkd's `kick` when no job is buried).
    pub fn kick_delayed(&self, count: u64) -> Result<u64> {
        let _wheel = self.lanes.wheel.lock();
        self.kick_delayed_locked(count)
    }

    /// [`Tube::kick_delayed`] under the wheel's lock.
    pub(super) fn kick_delayed_locked(&self, count: u64) -> Result<u64> {
        let now = self.jobs.store.clock().now_ms();
        let mut kicked = 0;
        for (_, bucket) in self.buckets() {
            if kicked >= count {
                break;
            }
            kicked += self.empty_bucket(bucket, now, count - kicked, true)?;
        }
        Ok(kicked)
    }

    /// The delayed job due first.
    pub fn peek_delayed(&self) -> Result<Option<Job>> {
        self.promote_due()?;
        for (_, lane) in self.delay_lanes()? {
            // A bucket's lane gets its reader at its first read (see `inspect_seq`).
            lane.reader("")?;
            let mut first: Option<Job> = None;
            for item in lane.iter()? {
                let item = item?;
                if lane.core.standing("", item.seq)?.is_none() {
                    continue;
                }
                let job = self.job_of(item, self.priority_default());
                if first.as_ref().is_none_or(|f| job.due_ms < f.due_ms) {
                    first = Some(job);
                }
            }
            if first.is_some() {
                return Ok(first);
            }
        }
        Ok(None)
    }

    /// Delayed jobs now.
    pub fn delayed_count(&self) -> Result<u64> {
        let mut count = 0;
        for (_, lane) in self.delay_lanes()? {
            let stats = lane.stats();
            count += stats
                .readers
                .iter()
                .find(|r| r.name.is_empty())
                .map_or(stats.items, |r| r.items);
        }
        Ok(count)
    }

    /// The lanes of the buckets, earliest ripening first.
    pub(super) fn delay_lanes(&self) -> Result<Vec<(Bucket, Queue)>> {
        let mut lanes = Vec::new();
        for (_, bucket) in self.buckets() {
            let name = lane_name::delay_lane(&self.name, bucket.level, bucket.start_ms);
            if let Some(q) = self.jobs.store.existing_queue(&name)? {
                lanes.push((bucket, q));
            }
        }
        Ok(lanes)
    }

    /// The buckets with a lane, read from the store's queues the first time.
    fn buckets(&self) -> BTreeSet<(u64, Bucket)> {
        let mut known = self.lanes.buckets.lock();
        if let Some(b) = known.as_ref() {
            return b.clone();
        }
        let found: BTreeSet<(u64, Bucket)> = self
            .jobs
            .store
            .queue_names()
            .iter()
            .filter_map(|q| lane_name::delay_bucket(&self.name, q))
            .map(|(level, start_ms)| Bucket { level, start_ms })
            .map(|b| (b.ripe_at_ms(), b))
            .collect();
        self.set_next_ripe(&found);
        *known = Some(found.clone());
        found
    }

    fn note_bucket(&self, bucket: Bucket) {
        self.buckets();
        let mut known = self.lanes.buckets.lock();
        if let Some(b) = known.as_mut() {
            b.insert((bucket.ripe_at_ms(), bucket));
            self.set_next_ripe(b);
        }
    }

    fn forget_bucket(&self, bucket: Bucket) {
        let mut known = self.lanes.buckets.lock();
        if let Some(b) = known.as_mut() {
            b.remove(&(bucket.ripe_at_ms(), bucket));
            self.set_next_ripe(b);
        }
    }

    fn set_next_ripe(&self, buckets: &BTreeSet<(u64, Bucket)>) {
        let next = buckets.first().map_or(u64::MAX, |(at, _)| *at);
        self.lanes.next_ripe_ms.store(next, Ordering::Release);
    }

    /// When the first bucket ripens (Unix ms), if any: how long a waiting reserve
    /// may sleep before it must promote.
    pub fn next_ripe_ms(&self) -> Option<u64> {
        match self.lanes.next_ripe_ms.load(Ordering::Acquire) {
            u64::MAX => None,
            at => Some(at),
        }
    }
}

/// The extension a job is stored with.
pub(super) fn meta_of(job: &Job) -> JobMeta {
    JobMeta {
        id: job.id,
        priority: job.priority,
        ttr_s: u32::try_from(job.ttr.as_secs()).unwrap_or(u32::MAX),
        due_ms: job.due_ms,
    }
}
