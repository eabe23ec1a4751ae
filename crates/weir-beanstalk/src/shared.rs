//! What every connection of the door shares: the backend, the settings, the stop
//! signal, the counters `stats` shows, and the tubes' in-memory state (pauses, and
//! how many connections use, watch and wait on each).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use weir_backend::Backend;

use crate::command::Command;
use crate::settings::BeanstalkSettings;

/// The door's shared state.
pub struct Shared {
    pub backend: Arc<Backend>,
    pub settings: BeanstalkSettings,
    /// `true` once the stop has begun.
    pub stopping: watch::Sender<bool>,
    pub counters: Counters,
    tubes: Mutex<HashMap<String, TubeState>>,
    pub started: Instant,
    /// A random id for this process's run (`stats` `id`).
    pub instance_id: String,
    /// Woken when a tube is paused or unpaused: waiting reserves look again.
    pub pauses_changed: tokio::sync::Notify,
}

/// Counters of the whole door.
#[derive(Default)]
pub struct Counters {
    /// Requests per command, in [`Command::all`]'s order.
    commands: [AtomicU64; 25],
    pub connections_current: AtomicU64,
    pub connections_total: AtomicU64,
    /// Connections that have put a job / reserved one, now open.
    pub producers: AtomicU64,
    pub workers: AtomicU64,
    /// Connections waiting in a reserve now.
    pub waiting: AtomicU64,
}

impl Counters {
    pub fn count(&self, command: Command) {
        if let Some(i) = Command::all().position(|c| c == command) {
            self.commands[i].fetch_add(1, Relaxed);
        }
    }

    pub fn of(&self, command: Command) -> u64 {
        Command::all()
            .position(|c| c == command)
            .map_or(0, |i| self.commands[i].load(Relaxed))
    }
}

/// A tube's in-memory state, kept while some connection refers to it or it is paused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TubeState {
    pub using: u64,
    pub watching: u64,
    pub waiting: u64,
    pub paused_until: Option<Instant>,
    pub pause: Duration,
    pub pauses: u64,
}

/// Which count of a tube a connection changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Using,
    Watching,
    Waiting,
}

impl Shared {
    pub fn new(backend: Arc<Backend>, settings: BeanstalkSettings) -> Shared {
        let started = Instant::now();
        let seed = std::process::id() as u128
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
        Shared {
            backend,
            settings,
            stopping: watch::Sender::new(false),
            counters: Counters::default(),
            tubes: Mutex::new(HashMap::new()),
            started,
            instance_id: format!("{:016x}", seed as u64),
            pauses_changed: tokio::sync::Notify::new(),
        }
    }

    pub fn is_stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    /// Resolves once the stop has begun.
    pub async fn stopped(&self) {
        let mut rx = self.stopping.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    fn tubes(&self) -> MutexGuard<'_, HashMap<String, TubeState>> {
        match self.tubes.lock() {
            Ok(map) => map,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Adds `delta` (+1 or -1) to `tube`'s count of `role`; forgets a tube nobody
    /// refers to and that is not paused.
    pub fn refer(&self, tube: &str, role: Role, add: bool) {
        let mut tubes = self.tubes();
        let state = tubes.entry(tube.to_owned()).or_default();
        let count = match role {
            Role::Using => &mut state.using,
            Role::Watching => &mut state.watching,
            Role::Waiting => &mut state.waiting,
        };
        *count = if add {
            count.saturating_add(1)
        } else {
            count.saturating_sub(1)
        };
        let now = Instant::now();
        let idle = state.using == 0
            && state.watching == 0
            && state.waiting == 0
            && state.paused_until.is_none_or(|u| u <= now);
        if idle {
            tubes.remove(tube);
        }
    }

    /// `tube`'s state now (a paused tube whose pause has ended shows no pause).
    pub fn tube_state(&self, tube: &str) -> TubeState {
        let mut state = self.tubes().get(tube).copied().unwrap_or_default();
        if state.paused_until.is_some_and(|u| u <= Instant::now()) {
            state.paused_until = None;
        }
        state
    }

    /// Holds reserves on `tube` for `delay` (0 ends a pause).
    pub fn pause(&self, tube: &str, delay: Duration) {
        let mut tubes = self.tubes();
        let state = tubes.entry(tube.to_owned()).or_default();
        state.pause = delay;
        state.paused_until = (!delay.is_zero()).then(|| Instant::now() + delay);
        state.pauses += 1;
        drop(tubes);
        self.pauses_changed.notify_waiters();
    }

    /// The tubes some connection uses, watches or waits on, or that are paused.
    pub fn known_tubes(&self) -> Vec<String> {
        self.tubes().keys().cloned().collect()
    }

    /// When `tube`'s pause ends, if it is paused now.
    pub fn paused_until(&self, tube: &str) -> Option<Instant> {
        self.tube_state(tube).paused_until
    }
}
