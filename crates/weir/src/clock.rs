//! The engine's clock: what "now" is for item expiry (`expires_at_ms`, `max_age`),
//! enqueue times and lease timeouts (`open_timeout`).
//!
//! A store runs on the system clock unless [`StoreOptions::clock`] hands it a
//! [`ManualClock`], which stands still until a test moves it: a test of expiry or of
//! lease timeouts then says when time passes instead of sleeping and hoping the
//! machine kept up. Only those two meanings of time follow the clock. Everything that
//! paces the engine's own work stays on real time: the `periodic` fsync interval, the
//! staging buffer's delay, unmapping and closing idle files, and how long a blocking
//! take waits.
//!
//! The clock is an enum, not a trait object: the system clock costs one branch over a
//! direct call to the time source on the append and take paths.
//!
//! [`StoreOptions::clock`]: crate::StoreOptions::clock

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a store takes as the current time. `Clock::default()` is the system clock.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    manual: Option<Arc<Hands>>,
}

/// A clock for tests that moves only when told to ([`ManualClock::advance`]). It
/// starts at the real time of its creation. Clones share the same time.
#[derive(Clone, Debug)]
pub struct ManualClock {
    hands: Arc<Hands>,
}

#[derive(Debug)]
struct Hands {
    start_unix_ms: u64,
    start: Instant,
    /// How far the clock has been moved since its creation, in nanoseconds.
    advanced_ns: AtomicU64,
}

impl Hands {
    fn advanced(&self) -> Duration {
        Duration::from_nanos(self.advanced_ns.load(Ordering::Acquire))
    }
}

impl Clock {
    /// The system clock (the default).
    pub fn system() -> Clock {
        Clock { manual: None }
    }

    /// Whether this is a [`ManualClock`].
    pub fn is_manual(&self) -> bool {
        self.manual.is_some()
    }

    /// The current time in Unix milliseconds (0 if the system clock is before 1970).
    pub fn now_ms(&self) -> u64 {
        match &self.manual {
            None => system_now_ms(),
            Some(h) => h.start_unix_ms + h.advanced().as_millis() as u64,
        }
    }

    /// The current instant, for lease deadlines.
    pub(crate) fn instant(&self) -> Instant {
        self.instant_or(Instant::now)
    }

    /// The current instant; `real` gives it on the system clock (so a caller that has
    /// just read the time does not read it again).
    pub(crate) fn instant_or(&self, real: impl FnOnce() -> Instant) -> Instant {
        match &self.manual {
            None => real(),
            Some(h) => h.start + h.advanced(),
        }
    }
}

impl ManualClock {
    /// A clock standing at the current real time.
    pub fn new() -> ManualClock {
        ManualClock {
            hands: Arc::new(Hands {
                start_unix_ms: system_now_ms(),
                start: Instant::now(),
                advanced_ns: AtomicU64::new(0),
            }),
        }
    }

    /// Moves the clock forward by `by`. A store notices within one tick of its
    /// background thread (20 ms) for what it does on its own (timing out leases), and
    /// at once for what a call checks (expiry on a take).
    pub fn advance(&self, by: Duration) {
        let ns = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.hands.advanced_ns.fetch_add(ns, Ordering::AcqRel);
    }

    /// The clock to put in [`crate::StoreOptions::clock`].
    pub fn clock(&self) -> Clock {
        Clock {
            manual: Some(Arc::clone(&self.hands)),
        }
    }

    /// The current time in Unix milliseconds.
    pub fn now_ms(&self) -> u64 {
        self.clock().now_ms()
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

/// The system's current time in Unix milliseconds (the one reading every backend
/// shares, `weir_types::now_ms`).
pub(crate) fn system_now_ms() -> u64 {
    weir_types::now_ms()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_stands_still_until_advanced_and_clones_share_it() {
        let hand = ManualClock::new();
        let clock = hand.clock();
        let (ms, at) = (clock.now_ms(), clock.instant());
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(clock.now_ms(), ms);
        assert_eq!(clock.instant(), at);
        hand.clone().advance(Duration::from_millis(1500));
        assert_eq!(clock.now_ms(), ms + 1500);
        assert_eq!(clock.instant(), at + Duration::from_millis(1500));
        assert!(clock.is_manual());
    }

    #[test]
    fn the_system_clock_follows_real_time() {
        let clock = Clock::default();
        assert!(!clock.is_manual());
        let before = system_now_ms();
        let at = clock.instant();
        std::thread::sleep(Duration::from_millis(5));
        assert!(clock.now_ms() >= before + 5);
        assert!(clock.instant() >= at + Duration::from_millis(5));
        let given = Instant::now();
        assert_eq!(clock.instant_or(|| given), given);
    }
}
