//! Reserving: the most urgent ready job of one tube or of several (beanstalkd's watch
//! list), under a lease that lasts the job's ttr, waiting up to a timeout.
//!
//! The lanes are tried most urgent first, each a plain lease of its default reader.
//! A wait registers on every lane's reader (an append, a release or a lease timeout
//! there wakes it) and on each tube's own signal (a put into a lane made while
//! waiting), before it looks, so nothing arriving between the look and the wait is
//! missed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::Notify;

use super::tube::{Jobs, Reserved, Tube};
use crate::error::Result;
use crate::item::TakeMode;
use crate::queue::Queue;
use crate::queue::WaiterGuard;

/// What a timeout too large to add to the clock is cut to (about 30 years).
const WAIT_FOREVER: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

impl Tube {
    /// The most urgent ready job, reserved now; `None` when none is ready.
    pub fn reserve_now(&self) -> Result<Option<Reserved>> {
        self.jobs.reserve_now(std::slice::from_ref(self))
    }

    /// The most urgent ready job, waiting up to `timeout` for one.
    pub async fn reserve(&self, timeout: Duration) -> Result<Option<Reserved>> {
        self.jobs.reserve(std::slice::from_ref(self), timeout).await
    }

    /// Reserves the job `item` just leased from the lane `queue` of priority
    /// `priority`: its lease now lasts the job's ttr.
    fn hold(&self, priority: u32, queue: &Queue, taken: crate::Taken) -> Result<Option<Reserved>> {
        let Some(lease) = taken.lease else {
            return Ok(None);
        };
        let lane = queue.reader("")?;
        let job = self.job_of(taken.item, priority);
        if !lane.touch(lease, Some(job.ttr))? {
            // Timed out already (a queue `open_timeout` shorter than the moment since
            // the take): it is back in the lane, someone else's to reserve.
            return Ok(None);
        }
        Ok(Some(Reserved {
            job,
            deliveries: taken.deliveries,
            lane,
            lease,
        }))
    }
}

impl Jobs {
    /// The most urgent ready job of `tubes`, now: by priority over every tube's
    /// lanes, the first tube first among equals.
    pub fn reserve_now(&self, tubes: &[Tube]) -> Result<Option<Reserved>> {
        for tube in tubes {
            // Delayed jobs whose time came are ready first (see `delays.rs`).
            tube.promote_due()?;
        }
        self.reserve_ready(tubes)
    }

    /// [`Jobs::reserve_now`] without moving ripe delayed jobs on first (the async
    /// reserve does that on tokio's blocking pool: it is file work).
    fn reserve_ready(&self, tubes: &[Tube]) -> Result<Option<Reserved>> {
        let mut lanes = Vec::new();
        for (i, tube) in tubes.iter().enumerate() {
            for (priority, queue) in tube.ready_lanes()? {
                lanes.push((priority, i, queue));
            }
        }
        lanes.sort_by_key(|(priority, i, _)| (*priority, *i));
        for (priority, i, queue) in lanes {
            let taken = match queue.reader("").and_then(|r| r.take_mode(TakeMode::Lease)) {
                Ok(taken) => taken,
                // Deleted as empty (to make room for another priority) meanwhile.
                Err(e) if e.kind() == crate::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if let Some(taken) = taken {
                if let Some(reserved) = tubes[i].hold(priority, &queue, taken)? {
                    return Ok(Some(reserved));
                }
            }
        }
        Ok(None)
    }

    /// [`Jobs::reserve_now`], waiting up to `timeout` for a job. Dropping the future
    /// while it waits reserves nothing. Ripe delayed jobs move on on tokio's blocking
    /// pool (they are appended, confirmed and their emptied buckets deleted: file
    /// work, never on the caller's event loop), the look for a ready job on the
    /// caller's thread.
    pub async fn reserve(&self, tubes: &[Tube], timeout: Duration) -> Result<Option<Reserved>> {
        let now = tokio::time::Instant::now();
        let deadline = now.checked_add(timeout).unwrap_or(now + WAIT_FOREVER);
        loop {
            // Registered before the look (see the module docs).
            let signals = self.signals(tubes)?;
            let mut waits: Vec<Pin<Box<tokio::sync::futures::Notified<'_>>>> = signals
                .notifies
                .iter()
                .map(|n| Box::pin(n.notified()))
                .collect();
            for w in &mut waits {
                w.as_mut().enable();
            }
            promote_off_loop(tubes).await?;
            if let Some(reserved) = self.reserve_ready(tubes)? {
                return Ok(Some(reserved));
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
            let any = std::future::poll_fn(|cx| {
                for w in &mut waits {
                    if w.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(());
                    }
                }
                Poll::Pending
            });
            // A delayed job's bucket ripening wakes the wait too.
            let wake = self
                .next_ripe(tubes)
                .map_or(deadline, |at| at.min(deadline));
            if tokio::time::timeout_at(wake, any).await.is_err() && wake == deadline {
                drop(waits);
                drop(signals);
                promote_off_loop(tubes).await?;
                return self.reserve_ready(tubes);
            }
        }
    }

    /// When the first delay bucket of `tubes` ripens, on tokio's clock.
    fn next_ripe(&self, tubes: &[Tube]) -> Option<tokio::time::Instant> {
        let at = tubes.iter().filter_map(Tube::next_ripe_ms).min()?;
        // Not sooner than 10 ms: a bucket that could not be emptied must not spin.
        let ahead = at
            .saturating_sub(self.store.clock().now_ms())
            .clamp(10, 3_600_000);
        Some(tokio::time::Instant::now() + Duration::from_millis(ahead))
    }

    /// What wakes a reserve of `tubes`: each lane's reader, and each tube's signal.
    fn signals(&self, tubes: &[Tube]) -> Result<Signals> {
        let mut notifies = Vec::new();
        let mut guards = Vec::new();
        for tube in tubes {
            notifies.push(Arc::clone(&tube.lanes.appended));
            for (_, queue) in tube.ready_lanes()? {
                queue.reader("")?;
                notifies.push(queue.core.reader_notify("")?);
                guards.push(queue.core.waiter_guard(""));
            }
        }
        Ok(Signals {
            notifies,
            _guards: guards,
        })
    }
}

/// The notifies a waiting reserve listens on, and its place in the waiters' counts.
struct Signals {
    notifies: Vec<Arc<Notify>>,
    _guards: Vec<WaiterGuard>,
}

/// Moves the ripe delayed jobs of `tubes` on, on tokio's blocking pool (a tube with
/// none ripe costs one atomic read).
async fn promote_off_loop(tubes: &[Tube]) -> Result<()> {
    for tube in tubes.iter().filter(|t| t.has_ripe()) {
        let tube = tube.clone();
        match tokio::task::spawn_blocking(move || tube.promote_due()).await {
            Ok(promoted) => {
                promoted?;
            }
            Err(e) => {
                return Err(crate::error::Error::io(
                    "moving ripe delayed jobs on",
                    std::io::Error::other(e.to_string()),
                ))
            }
        }
    }
    Ok(())
}
