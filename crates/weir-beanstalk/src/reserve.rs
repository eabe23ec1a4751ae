//! `reserve` and `reserve-with-timeout`: the one wait of the door.
//!
//! Before waiting: a connection at its `reserved_max` gets `OUT_OF_MEMORY`, one
//! holding a job whose ttr ends within a second gets `DEADLINE_SOON` (beanstalkd's
//! rule). Then the most urgent ready job of the watched tubes that are not paused is
//! reserved, waiting until the timeout, a paused tube's pause ending, or a held job
//! entering its last second (`DEADLINE_SOON`), whichever comes first; a tube paused
//! or unpaused meanwhile makes it look again. While it waits
//! the socket is still read: a client that goes away ends the wait (dropping the
//! backend's wait reserves nothing), and requests it sends meanwhile wait their turn
//! in the buffer. A stop ends the wait too.

use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use weir_backend::jobs::{Reserved, Tube};

use crate::cmd::{error_reply, Flow};
use crate::connection::Connection;
use crate::reply;
use crate::session::{Held, Session};
use crate::shared::{Role, Shared};

/// A wait without a timeout, in steps of this.
const WAIT_STEP: Duration = Duration::from_secs(24 * 3600);

/// Counts the connection among the waiting while it lives.
struct Waiting<'a> {
    shared: &'a Shared,
    tubes: Vec<String>,
}

impl<'a> Waiting<'a> {
    fn new(shared: &'a Shared, tubes: Vec<String>) -> Waiting<'a> {
        shared.counters.waiting.fetch_add(1, Relaxed);
        for tube in &tubes {
            shared.refer(tube, Role::Waiting, true);
        }
        Waiting { shared, tubes }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.shared.counters.waiting.fetch_sub(1, Relaxed);
        for tube in &self.tubes {
            self.shared.refer(tube, Role::Waiting, false);
        }
    }
}

/// Reserves a job for the connection, waiting up to `timeout` (`None`: no end).
pub async fn reserve(
    shared: &Shared,
    conn: &mut Connection,
    session: &mut Session,
    timeout: Option<Duration>,
) -> io::Result<Flow> {
    let tubes = match watched_tubes(shared, session).await {
        Ok(tubes) => tubes,
        Err(refusal) => {
            conn.out.extend_from_slice(refusal);
            return Ok(Flow::Continue);
        }
    };
    session.mark_worker(shared);
    conn.flush().await?;
    let deadline = timeout.map(|t| Instant::now() + t);
    let _waiting = Waiting::new(shared, tubes.iter().map(|(n, _)| n.clone()).collect());
    loop {
        // Registered before the look, so a pause in between is not missed.
        let pauses_changed = shared.pauses_changed.notified();
        tokio::pin!(pauses_changed);
        pauses_changed.as_mut().enable();
        let (open, unpause) = open_tubes(shared, &tubes);
        let wake = [deadline, unpause, session.next_deadline_soon()]
            .into_iter()
            .flatten()
            .min();
        let wait = wake.map_or(WAIT_STEP, |w| w.saturating_duration_since(Instant::now()));
        let got = tokio::select! {
            got = reserve_open(shared, &open, wait) => got,
            read = conn.read(), if conn.buf.len() < read_while_waiting_max(shared) => match read {
                Ok(0) | Err(_) => return Ok(Flow::Close),
                Ok(_) => continue,
            },
            () = shared.stopped() => return Ok(Flow::Close),
            () = &mut pauses_changed => continue,
        };
        match got {
            Ok(Some(reserved)) => {
                hold(shared, conn, session, &tubes, reserved).await;
                return Ok(Flow::Continue);
            }
            Ok(None) if deadline.is_some_and(|d| Instant::now() >= d) => {
                conn.out.extend_from_slice(reply::TIMED_OUT);
                return Ok(Flow::Continue);
            }
            Ok(None) if session.deadline_soon() => {
                conn.out.extend_from_slice(reply::DEADLINE_SOON);
                return Ok(Flow::Continue);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "beanstalk reserve");
                conn.out.extend_from_slice(error_reply(&e));
                return Ok(Flow::Continue);
            }
        }
    }
}

/// The watched tubes' handles, or the reply that refuses the reserve before it
/// waits: `OUT_OF_MEMORY` at `reserved_max`, `DEADLINE_SOON`, a storage failure.
async fn watched_tubes(
    shared: &Shared,
    session: &mut Session,
) -> Result<Vec<(String, Tube)>, &'static [u8]> {
    session.forget_ended();
    if session.held.len() >= shared.settings.reserved_max {
        return Err(reply::OUT_OF_MEMORY);
    }
    if session.deadline_soon() {
        return Err(reply::DEADLINE_SOON);
    }
    let mut tubes = Vec::with_capacity(session.watched.len());
    for named in &session.watched {
        match shared.backend.tube(&named.queue).await {
            Ok(tube) => tubes.push((named.tube.clone(), tube)),
            Err(e) => {
                tracing::warn!(error = %e, "beanstalk reserve");
                return Err(error_reply(&e));
            }
        }
    }
    Ok(tubes)
}

/// Bytes a waiting connection buffers before it stops reading (one whole `put`).
fn read_while_waiting_max(shared: &Shared) -> usize {
    let parse = &shared.settings.parse;
    parse.line_bytes_max + parse.job_bytes_max as usize + 2
}

/// The watched tubes not paused now, and when the first pause ends.
fn open_tubes(shared: &Shared, tubes: &[(String, Tube)]) -> (Vec<Tube>, Option<Instant>) {
    let mut open = Vec::with_capacity(tubes.len());
    let mut unpause: Option<Instant> = None;
    for (name, tube) in tubes {
        match shared.paused_until(name) {
            Some(until) => unpause = Some(unpause.map_or(until, |u| u.min(until))),
            None => open.push(tube.clone()),
        }
    }
    (open, unpause)
}

async fn reserve_open(
    shared: &Shared,
    open: &[Tube],
    wait: Duration,
) -> weir_backend::Result<Option<Reserved>> {
    if open.is_empty() {
        tokio::time::sleep(wait).await;
        return Ok(None);
    }
    shared.backend.reserve(open, wait).await
}

/// Keeps the reserved job and answers it.
async fn hold(
    shared: &Shared,
    conn: &mut Connection,
    session: &mut Session,
    tubes: &[(String, Tube)],
    reserved: Reserved,
) {
    let id = reserved.job.id;
    let tube = match tube_of_job(shared, tubes, id).await {
        Some(tube) => tube,
        None => {
            // Cannot happen (the job came from one of `tubes`); give it back.
            tracing::warn!(id, "beanstalk reserve: the job's tube is not known");
            if let Some((_, first)) = tubes.first() {
                let priority = reserved.job.priority;
                let _ = first.release(&reserved, priority, Duration::ZERO).await;
            }
            conn.out.extend_from_slice(reply::INTERNAL_ERROR);
            return;
        }
    };
    reply::reserved(&mut conn.out, id, &reserved.job.data);
    session.held.insert(id, Held { tube, reserved });
}

/// The tube of `tubes` the job `id` came from. A job's id carries 16 bits of its
/// queue name's CRC-32C (`weir::jobs`, "Finding a job by its id"): the one watched
/// tube with those bits, or, when two share them, the one the backend finds it in.
async fn tube_of_job(shared: &Shared, tubes: &[(String, Tube)], id: u64) -> Option<Tube> {
    let low = (id & 0xFFFF) as u32;
    let mut matching = tubes
        .iter()
        .map(|(_, t)| t)
        .filter(|t| crc32c::crc32c(t.name().as_bytes()) & 0xFFFF == low);
    let first = matching.next()?;
    if matching.next().is_none() {
        return Some(first.clone());
    }
    let found = shared.backend.find_job(id).await.ok().flatten()?;
    tubes
        .iter()
        .map(|(_, t)| t)
        .find(|t| t.name() == found.tube)
        .cloned()
}
