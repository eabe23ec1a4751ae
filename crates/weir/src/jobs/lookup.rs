//! Jobs found by their id, wherever they stand: peek, delete and kick a job nobody
//! holds, and a job's state (beanstalkd's `peek <id>`, `delete <id>`, `kick-job`,
//! `stats-job`).
//!
//! The id names its tube by 16 bits of hash ([`super::ids`]): only tubes with that
//! hash are looked at. A plain item's id carries its seq ([`super::plain_id`]): it
//! is read where it is. A job's id is looked for in the tube's lanes, each read in
//! order (`Queue::iter`) until it turns up: a lookup reads what the tube keeps, at
//! worst; fine for the odd job an operator or a client names, not for a flow. A
//! miss is read again under the tube's wheel lock (see `Tube::find`): a job the
//! tube's own moves (promotion, kick) carry from a lane not yet read to one already
//! read is found then; one its holder moves that way at that moment can be missed.

use super::ids;
use super::lane_name;
use super::tube::{plain_seq, Job, Jobs, Tube};
use crate::error::Result;
use crate::queue::discard::Standing;
use crate::queue::Queue;

/// Where a job found by its id stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobState {
    Ready,
    Reserved,
    Buried,
    Delayed,
}

/// A job found by its id.
#[derive(Clone, Debug)]
pub struct Found {
    pub tube: String,
    pub job: Job,
    pub state: JobState,
    /// The lane holding it, and its seq there.
    lane: Queue,
    seq: u64,
}

impl Jobs {
    /// The job `id`, if it is still in some tube (ready, reserved or buried).
    pub fn find(&self, id: u64) -> Result<Option<Found>> {
        for name in self.store.queue_names() {
            if lane_name::tube_of_lane(&name).is_some() || !ids::may_be_in(id, &name) {
                continue;
            }
            let tube = self.tube(&name)?;
            if let Some(found) = tube.find(id)? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// Deletes the job `id` when nobody holds it (ready or buried); false when it is
    /// not found or reserved (a reserved job is its holder's to delete).
    pub fn delete(&self, id: u64) -> Result<bool> {
        let Some(found) = self.find(id)? else {
            return Ok(false);
        };
        if found.state == JobState::Reserved {
            return Ok(false);
        }
        // A buried or delayed job is moved (kick, kick-job, promotion) under the
        // tube's wheel lock, appended to its new lane before it leaves the old one: the
        // copy found is discarded under that lock too, or a kick-job between its look
        // and its discard would keep the job it appended while this says deleted.
        let tube = self.tube(&found.tube)?;
        let parked = matches!(found.state, JobState::Buried | JobState::Delayed);
        let _wheel = parked.then(|| tube.lanes.wheel.lock());
        if discard(&found)? {
            return Ok(true);
        }
        if !parked {
            return Ok(false);
        }
        // Moved on (kicked, promoted) between the look and the lock: with those moves
        // held back now, it is where a second look finds it.
        match tube.find_unlocked(id)? {
            Some(again) if again.state != JobState::Reserved => discard(&again),
            _ => Ok(false),
        }
    }

    /// Moves the buried or delayed job `id` to its ready lane; false when it is
    /// neither.
    pub fn kick_job(&self, id: u64) -> Result<bool> {
        let Some(found) = self.find(id)? else {
            return Ok(false);
        };
        if !matches!(found.state, JobState::Buried | JobState::Delayed) {
            return Ok(false);
        }
        let tube = self.tube(&found.tube)?;
        // Kicks and a delay bucket's emptying take the wheel's lock: under it, the
        // copy found must still be there and held by nobody (not being moved).
        let _wheel = tube.lanes.wheel.lock();
        let standing = match found.lane.core.standing("", found.seq) {
            Ok(standing) => standing,
            // Its bucket was emptied and removed since it was found: made ready.
            Err(e) if e.kind() == crate::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        if standing != Some(Standing::Ready) {
            return Ok(false);
        }
        let mut job = found.job.clone();
        job.due_ms = 0;
        tube.append(&job.data, job.flags, super::delays::meta_of(&job), true)?;
        // Appended first: a crash here leaves it in both lanes, never in neither.
        Ok(found.lane.reader("")?.discard(found.seq)?.is_some())
    }
}

impl Tube {
    /// The job `id` in this tube's lanes. A miss, or a lane deleted while it was read,
    /// is read again under the wheel lock: a promotion or a kick appends a job to a
    /// ready lane the scan may have read already and confirms it in a lane read after
    /// (or deletes that lane, emptied); with them held back, the job is where it is.
    fn find(&self, id: u64) -> Result<Option<Found>> {
        match self.find_unlocked(id) {
            Ok(Some(found)) => return Ok(Some(found)),
            Ok(None) => {}
            Err(e) if e.kind() == crate::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let _wheel = self.lanes.wheel.lock();
        self.find_unlocked(id)
    }

    /// [`Tube::find`]'s scan: the ready lanes, the buried lane, the delay buckets.
    fn find_unlocked(&self, id: u64) -> Result<Option<Found>> {
        if let Some(seq) = plain_seq(id) {
            let default = self.priority_default();
            if let Some(found) = self.found_at(&self.queue.clone(), seq, default, false)? {
                return Ok(Some(found));
            }
            // Moved since (buried, delayed, released with another priority): its
            // copy carries the id in its extension, found below.
        }
        let mut lanes: Vec<(u32, Queue, bool)> = self
            .ready_lanes()?
            .into_iter()
            .map(|(p, q)| (p, q, false))
            .collect();
        let default = self.priority_default();
        if let Some(buried) = self.buried_lane(false)? {
            lanes.push((default, buried, true));
        }
        let delayed_from = lanes.len();
        for (_, lane) in self.delay_lanes()? {
            lanes.push((default, lane, false));
        }
        for (i, (priority, lane, buried)) in lanes.into_iter().enumerate() {
            let delayed = i >= delayed_from;
            let seqs = match seqs_of(&lane, id) {
                Ok(seqs) => seqs,
                // An empty priority lane deleted to make room (under the `lanes`
                // lock, which a lookup does not hold): the job is not in it.
                Err(e) if e.kind() == crate::ErrorKind::NotFound && !delayed && !buried => continue,
                Err(e) => return Err(e),
            };
            // A job that left a lane and came back to it is there twice: the newest
            // copy is the live one (an older one was confirmed when it moved).
            for seq in seqs.into_iter().rev() {
                if let Some(mut found) = self.found_at(&lane, seq, priority, buried)? {
                    if delayed {
                        found.state = JobState::Delayed;
                    }
                    return Ok(Some(found));
                }
            }
        }
        Ok(None)
    }

    /// The job at `seq` of `lane`, if it is pending there.
    fn found_at(
        &self,
        lane: &Queue,
        seq: u64,
        priority: u32,
        buried: bool,
    ) -> Result<Option<Found>> {
        lane.reader("")?;
        let Some((item, standing)) = lane.core.inspect_seq("", seq)? else {
            return Ok(None);
        };
        let state = match (buried, standing) {
            (true, _) => JobState::Buried,
            (false, Standing::Leased) => JobState::Reserved,
            (false, Standing::Ready) => JobState::Ready,
        };
        Ok(Some(Found {
            tube: self.name.to_string(),
            job: self.job_of(item, priority),
            state,
            lane: lane.clone(),
            seq,
        }))
    }
}

/// The seqs of the copies of job `id` in `lane`, oldest first.
fn seqs_of(lane: &Queue, id: u64) -> Result<Vec<u64>> {
    let mut seqs = Vec::new();
    for item in lane.iter()? {
        let item = item?;
        if item.job.is_some_and(|j| j.id == id) {
            seqs.push(item.seq);
        }
    }
    Ok(seqs)
}

/// Discards the copy `found` names; false when it is no longer there (its delay
/// bucket emptied and removed included).
fn discard(found: &Found) -> Result<bool> {
    match found.lane.reader("").and_then(|r| r.discard(found.seq)) {
        Ok(discarded) => Ok(discarded.is_some()),
        Err(e) if e.kind() == crate::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}
