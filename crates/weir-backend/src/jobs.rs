//! The work-queue features as the doors see them: tubes of jobs with priorities, a
//! ttr per reservation, bury and kick, jobs named by id (beanstalkd's model; the
//! engine's `weir::jobs`).
//!
//! On the engine the hot calls (put into a lane that exists, reserve, delete,
//! release with the same priority, touch) run on the event loop and wait for an
//! fsync on tokio's blocking pool; what does file work (a new lane, a move between
//! lanes, a lookup by id, which reads a tube) runs on the blocking pool.
//!
//! On JetStream they are refused ([`Kind::Unsupported`], naming the feature): a
//! cluster has no lanes to order priorities or park buried jobs in yet
//! (docs/cluster.md).

use std::time::Duration;

use crate::embedded::blocking;
use crate::error::Result;
#[cfg(feature = "jetstream")]
use crate::error::{Error, Kind};
use crate::Backend;

pub use weir::jobs::{Job, JobState, TubeStats};

/// A tube: a queue and its lanes.
#[derive(Clone)]
pub enum Tube {
    Embedded(weir::jobs::Tube),
}

/// A reserved job, held until deleted, released, buried or its ttr passes.
#[derive(Clone, Debug)]
pub struct Reserved {
    pub job: Job,
    /// How many times the job was handed out from its lane, this time included.
    pub deliveries: u32,
    inner: weir::jobs::Reserved,
}

/// A job found by its id.
#[derive(Clone, Debug)]
pub struct FoundJob {
    pub tube: String,
    pub job: Job,
    pub state: JobState,
}

#[cfg(feature = "jetstream")]
fn unsupported() -> Error {
    Error::new(
        Kind::Unsupported,
        "tubes (priorities, bury, kick, jobs by id) are not supported on the jetstream backend",
    )
}

impl Backend {
    /// The tube `name` (its queue is created on first use).
    pub async fn tube(&self, name: &str) -> Result<Tube> {
        match self {
            Backend::Embedded(e) => {
                let jobs = e.store().jobs();
                if e.store().existing_queue(name)?.is_some() {
                    return Ok(Tube::Embedded(jobs.tube(name)?));
                }
                let name = name.to_owned();
                blocking(move || jobs.tube(&name)).await.map(Tube::Embedded)
            }
            #[cfg(feature = "jetstream")]
            Backend::JetStream(_) => Err(unsupported()),
        }
    }

    /// The most urgent ready job of `tubes` (by priority, the first tube first among
    /// equals), waiting up to `timeout`. Dropping the future reserves nothing.
    pub async fn reserve(&self, tubes: &[Tube], timeout: Duration) -> Result<Option<Reserved>> {
        let Some(first) = tubes.first() else {
            return Ok(None);
        };
        let Tube::Embedded(tube) = first;
        // The engine's async reserve moves ripe delayed jobs on off the event loop.
        let engine: Vec<weir::jobs::Tube> =
            tubes.iter().map(|Tube::Embedded(t)| t.clone()).collect();
        let reserved = tube.jobs().reserve(&engine, timeout).await?;
        Ok(reserved.map(|r| Reserved {
            job: r.job.clone(),
            deliveries: r.deliveries,
            inner: r,
        }))
    }

    /// The job `id`, wherever it stands (reads the tube it names: see `weir::jobs`).
    pub async fn find_job(&self, id: u64) -> Result<Option<FoundJob>> {
        let jobs = self.engine_jobs()?;
        let found = blocking(move || jobs.find(id)).await?;
        Ok(found.map(|f| FoundJob {
            tube: f.tube,
            job: f.job,
            state: f.state,
        }))
    }

    /// Deletes the job `id` when nobody holds it; false when not found or reserved.
    pub async fn delete_job(&self, id: u64) -> Result<bool> {
        let jobs = self.engine_jobs()?;
        blocking(move || jobs.delete(id)).await
    }

    /// Moves the buried job `id` back to ready; false when it is not buried.
    pub async fn kick_job(&self, id: u64) -> Result<bool> {
        let jobs = self.engine_jobs()?;
        blocking(move || jobs.kick_job(id)).await
    }

    fn engine_jobs(&self) -> Result<weir::jobs::Jobs> {
        match self {
            Backend::Embedded(e) => Ok(e.store().jobs()),
            #[cfg(feature = "jetstream")]
            Backend::JetStream(_) => Err(unsupported()),
        }
    }
}

impl Tube {
    pub fn name(&self) -> &str {
        let Tube::Embedded(t) = self;
        t.name()
    }

    /// Stores a job, ready `delay` from now (zero: at once); returns its id.
    pub async fn put(
        &self,
        data: &[u8],
        priority: u32,
        ttr: Duration,
        delay: Duration,
    ) -> Result<u64> {
        let Tube::Embedded(t) = self;
        if let Some(id) = t.put_delayed_async(data, priority, ttr, delay).await? {
            return Ok(id);
        }
        let (t, data) = (t.clone(), data.to_vec());
        blocking(move || t.put_delayed(&data, priority, ttr, delay)).await
    }

    /// Deletes a reserved job; false when its reservation had ended.
    pub async fn delete(&self, reserved: &Reserved) -> Result<bool> {
        let Tube::Embedded(t) = self;
        Ok(t.delete_async(&reserved.inner).await?)
    }

    /// Gives a reserved job back with `priority`, ready `delay` from now.
    pub async fn release(
        &self,
        reserved: &Reserved,
        priority: u32,
        delay: Duration,
    ) -> Result<bool> {
        let Tube::Embedded(t) = self;
        if delay.is_zero() && priority == reserved.job.priority {
            return Ok(t.release_async(&reserved.inner).await?);
        }
        let (t, r) = (t.clone(), reserved.inner.clone());
        blocking(move || t.release_delayed(&r, priority, delay)).await
    }

    /// Parks a reserved job in the tube's buried lane.
    pub async fn bury(&self, reserved: &Reserved) -> Result<bool> {
        let Tube::Embedded(t) = self;
        let (t, r) = (t.clone(), reserved.inner.clone());
        blocking(move || t.bury(&r)).await
    }

    /// The reservation lasts the job's ttr from now again.
    pub fn touch(&self, reserved: &Reserved) -> Result<bool> {
        let Tube::Embedded(t) = self;
        Ok(t.touch(&reserved.inner)?)
    }

    /// What the reservation has left; `None` once it ended.
    pub fn time_left(&self, reserved: &Reserved) -> Option<Duration> {
        let Tube::Embedded(t) = self;
        t.time_left(&reserved.inner)
    }

    /// Moves up to `count` buried jobs back to ready (with none buried, delayed
    /// ones, earliest due first); how many moved.
    pub async fn kick(&self, count: u64) -> Result<u64> {
        let Tube::Embedded(t) = self;
        let t = t.clone();
        blocking(move || t.kick(count)).await
    }

    /// The most urgent ready job, not reserved.
    pub async fn peek_ready(&self) -> Result<Option<Job>> {
        let Tube::Embedded(t) = self;
        let t = t.clone();
        blocking(move || t.peek_ready()).await
    }

    /// The delayed job due first.
    pub async fn peek_delayed(&self) -> Result<Option<Job>> {
        let Tube::Embedded(t) = self;
        let t = t.clone();
        blocking(move || t.peek_delayed()).await
    }

    /// The oldest buried job.
    pub async fn peek_buried(&self) -> Result<Option<Job>> {
        let Tube::Embedded(t) = self;
        let t = t.clone();
        blocking(move || t.peek_buried()).await
    }

    /// Ready, reserved, buried and delayed jobs now (moves ripe delayed jobs to
    /// ready first, which is file work).
    pub async fn stats(&self) -> Result<TubeStats> {
        let Tube::Embedded(t) = self;
        let t = t.clone();
        blocking(move || t.stats()).await
    }
}
