//! One connection's state, as in beanstalkd: the tube it uses, the tubes it watches,
//! and the jobs it holds reserved (by id, at most `reserved_max`). When the
//! connection ends, every job it still holds is released, ready again.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use weir_backend::jobs::{Reserved, Tube};

use crate::names;
use crate::shared::{Role, Shared};

/// beanstalkd's safety margin: a reserved job whose ttr ends within it makes the
/// next reserve of its holder answer `DEADLINE_SOON`.
pub const DEADLINE_MARGIN: Duration = Duration::from_secs(1);

/// A tube by its beanstalkd name and its weir queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub tube: String,
    pub queue: String,
}

impl Named {
    /// The tube `tube` (a name the parser accepted), if it fits weir's names.
    pub fn new(tube: &str) -> Option<Named> {
        Some(Named {
            tube: tube.to_owned(),
            queue: names::queue_of(tube)?,
        })
    }

    pub fn default_tube() -> Named {
        Named {
            tube: "default".to_owned(),
            queue: "default".to_owned(),
        }
    }
}

/// A job this connection holds.
pub struct Held {
    pub tube: Tube,
    pub reserved: Reserved,
}

pub struct Session {
    pub used: Named,
    pub watched: Vec<Named>,
    pub held: HashMap<u64, Held>,
    /// Counted once among `stats`' producers / workers.
    pub producer: bool,
    pub worker: bool,
}

impl Session {
    /// A new connection's state: using and watching `default`.
    pub fn new(shared: &Shared) -> Session {
        shared.refer("default", Role::Using, true);
        shared.refer("default", Role::Watching, true);
        Session {
            used: Named::default_tube(),
            watched: vec![Named::default_tube()],
            held: HashMap::new(),
            producer: false,
            worker: false,
        }
    }

    pub fn mark_producer(&mut self, shared: &Shared) {
        if !std::mem::replace(&mut self.producer, true) {
            shared.counters.producers.fetch_add(1, Relaxed);
        }
    }

    pub fn mark_worker(&mut self, shared: &Shared) {
        if !std::mem::replace(&mut self.worker, true) {
            shared.counters.workers.fetch_add(1, Relaxed);
        }
    }

    /// Forgets held jobs whose reservation has ended (their ttr passed).
    pub fn forget_ended(&mut self) {
        self.held
            .retain(|_, h| h.tube.time_left(&h.reserved).is_some());
    }

    /// Whether a held job's ttr ends within [`DEADLINE_MARGIN`].
    pub fn deadline_soon(&self) -> bool {
        self.held.values().any(|h| {
            h.tube
                .time_left(&h.reserved)
                .is_some_and(|left| left <= DEADLINE_MARGIN)
        })
    }

    /// When the next held job enters its deadline margin.
    pub fn next_deadline_soon(&self) -> Option<Instant> {
        let now = Instant::now();
        self.held
            .values()
            .filter_map(|h| h.tube.time_left(&h.reserved))
            .map(|left| now + left.saturating_sub(DEADLINE_MARGIN))
            .min()
    }

    /// The connection ends: jobs still held go back, ready; the tube counts drop.
    pub async fn end(mut self, shared: &Shared) {
        for (id, held) in self.held.drain() {
            let priority = held.reserved.job.priority;
            let now = Duration::ZERO;
            if let Err(e) = held.tube.release(&held.reserved, priority, now).await {
                tracing::warn!(id, error = %e, "releasing a job at disconnect");
            }
        }
        shared.refer(&self.used.tube, Role::Using, false);
        for named in &self.watched {
            shared.refer(&named.tube, Role::Watching, false);
        }
        if self.producer {
            shared.counters.producers.fetch_sub(1, Relaxed);
        }
        if self.worker {
            shared.counters.workers.fetch_sub(1, Relaxed);
        }
    }
}
