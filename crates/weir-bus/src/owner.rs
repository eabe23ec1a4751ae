//! Which instance serves the bus, when several weir instances share a JetStream cluster.
//!
//! The bus's deliveries keep one batch in flight per subscriber, in order, and its
//! metadata changes are read-modify-writes: both want one instance at a time. So one
//! instance serves the bus (its API, its workers, its retention janitor) and the others
//! stand by, answering 503 (a load balancer's health check on `/health` sends
//! clients to the one that serves). The instance that serves holds the cluster map's
//! `owner` key: it writes it again (compare-and-set) every fifth of `takeover_ms`.
//! An instance standing by reads the key as often (at least every second); when its revision has not moved for
//! `takeover_ms`, it takes the key over (compare-and-set on the revision it saw: of
//! two standing by, one wins) and starts serving. An instance that stops cleanly deletes
//! the key, so another takes over at its next read.
//!
//! The instance that serves stops serving when a write of the key is refused (another
//! took it) or has not succeeded for half of `takeover_ms`, which is before anyone
//! standing by may take over (they wait all of it, from when they saw the last
//! write): two instances deliver at once only if one is frozen (stopped, swapped out)
//! longer than that and then goes on; its next write of the key or of the metadata
//! is then refused, and it stops. Deliveries are at least once either way.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use weir_backend::{Expect, Kind, SharedMap};

use crate::bus::{Bus, OwnerHold};
use crate::meta_map::{MetaMap, OWNER_KEY};
use crate::names::BUS_MAP;

/// The longest pause between two reads of the key by an instance standing by: an instance
/// that stops cleanly gives the key up, and another serves within this.
const STANDBY_READ_MAX: Duration = Duration::from_secs(1);

/// The `owner` key's value.
#[derive(Serialize, Deserialize)]
struct Holder {
    /// Unique per instance and start.
    instance: String,
    /// The bus's address at that instance, for the logs of the others.
    listen: String,
}

/// The task renewing the hold; ended with this (the owner's task aborted at
/// shutdown, or failed), so that it never renews for an instance that no longer serves.
struct Holding(tokio::task::JoinHandle<()>);

impl Drop for Holding {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What this instance knows of the `owner` key.
pub struct Owner {
    /// Set once the cluster answered (an instance may start while it does not).
    map: std::sync::OnceLock<SharedMap>,
    me: Bytes,
    every: Duration,
    takeover: Duration,
    /// The key's revision while this instance holds it; held across a write of the
    /// key, so that two writes never race each other's revision.
    held: tokio::sync::Mutex<Option<u64>>,
    /// When this instance last wrote the key while holding it; `None` when it does not.
    renewed: parking_lot::Mutex<Option<Instant>>,
}

impl Owner {
    pub fn new(instance: String, listen: String, takeover: Duration) -> Owner {
        let me = serde_json::to_vec(&Holder { instance, listen }).unwrap_or_default();
        Owner {
            map: std::sync::OnceLock::new(),
            me: Bytes::from(me),
            every: takeover / 5,
            takeover,
            held: tokio::sync::Mutex::new(None),
            renewed: parking_lot::Mutex::new(None),
        }
    }

    /// Opens the cluster's map (retrying while the cluster cannot be reached), then
    /// stands by until this instance holds the key, serves while it does, and again,
    /// until the bus stops.
    pub async fn run(self: Arc<Self>, bus: Arc<Bus>) {
        let Some(map) = self.open(&bus).await else {
            return;
        };
        bus.set_map(MetaMap::new(map.clone()));
        let _ = self.map.set(map);
        bus.set_owner(Arc::<Owner>::clone(&self));
        while !bus.is_shutting_down() {
            let Some(revision) = self.stand_by(&bus).await else {
                return;
            };
            {
                let mut held = self.held.lock().await;
                // Standing by follows a hold lost (`serve` returns once `hold(None)`),
                // given up (`resign`), or none yet.
                assert!(held.is_none(), "took the owner key over while holding it");
                self.hold(Some(revision), &mut held);
            }
            tracing::info!("this instance now serves the bus");
            // The hold is renewed from now on, while the metadata is read and the
            // queues brought in line (which can take longer than `takeover_ms` with
            // many topics).
            let mut holding = {
                let (owner, bus) = (Arc::clone(&self), Arc::clone(&bus));
                Holding(tokio::spawn(async move { owner.serve(&bus).await }))
            };
            if let Err(e) = bus.activate().await {
                tracing::error!(error = %format!("{e:#}"), "could not start serving the bus; letting another instance try");
                drop(holding);
                bus.deactivate().await;
                self.resign().await;
                tokio::time::sleep(self.takeover).await;
                continue;
            }
            // Returns when the hold is lost (at once if it was lost while activating).
            let _ = (&mut holding.0).await;
            bus.deactivate().await;
            if !bus.is_shutting_down() {
                tracing::warn!("this instance no longer serves the bus; standing by");
            }
        }
    }

    /// The bus's map; `None` when the bus stops first.
    async fn open(&self, bus: &Bus) -> Option<SharedMap> {
        let mut warned = false;
        while !bus.is_shutting_down() {
            match bus.backend.shared_map(BUS_MAP).await {
                Ok(map) => return Some(map),
                Err(e) => {
                    if !std::mem::replace(&mut warned, true) {
                        tracing::warn!(error = %e, "the bus cannot reach its metadata in the cluster; retrying");
                    }
                }
            }
            tokio::time::sleep(self.every).await;
        }
        None
    }

    fn map(&self) -> Option<&SharedMap> {
        self.map.get()
    }

    /// Reads the key every `every` until this instance takes it: when it is absent, or
    /// its revision has not moved for `takeover`. `None` when the bus stops first.
    async fn stand_by(&self, bus: &Bus) -> Option<u64> {
        let mut seen: Option<(u64, Instant)> = None;
        let mut warned = false;
        loop {
            if bus.is_shutting_down() {
                return None;
            }
            let map = self.map()?;
            let expect = match map.get(OWNER_KEY).await {
                Ok(None) => Some(Expect::Absent),
                Ok(Some(e)) => match seen {
                    Some((r, since)) if r == e.revision => {
                        (since.elapsed() >= self.takeover).then_some(Expect::Revision(r))
                    }
                    _ => {
                        if seen.is_none() {
                            let holder = serde_json::from_slice::<Holder>(&e.value)
                                .map(|h| h.listen)
                                .unwrap_or_default();
                            tracing::info!(serving = %holder, "another instance serves the bus; this one stands by");
                        }
                        seen = Some((e.revision, Instant::now()));
                        None
                    }
                },
                Err(e) => {
                    if !std::mem::replace(&mut warned, true) {
                        tracing::warn!(error = %e, "the bus cannot read who serves it; retrying");
                    }
                    None
                }
            };
            if let Some(expect) = expect {
                match map.put(OWNER_KEY, self.me.clone(), expect).await {
                    Ok(revision) => return Some(revision),
                    Err(e) if e.kind() == Kind::Conflict => seen = None,
                    Err(e) => tracing::warn!(error = %e, "taking over the bus failed; retrying"),
                }
            }
            tokio::time::sleep(self.every.min(STANDBY_READ_MAX)).await;
        }
    }

    /// Writes the key every `every` while this instance holds it; returns when it no
    /// longer does (refused, or no write for half of `takeover`, a renewal in flight
    /// included) or the bus stops.
    async fn serve(&self, bus: &Bus) {
        loop {
            tokio::time::sleep(self.every).await;
            if bus.is_shutting_down() {
                return;
            }
            let Some(last) = *self.renewed.lock() else {
                return;
            };
            let renewing = tokio::time::timeout_at(last + self.takeover / 2, self.renew());
            match renewing.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) if e.kind() == Kind::Conflict => {
                    tracing::warn!("another instance took the bus over");
                    return;
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "the bus could not renew its hold"),
                Err(_) => {
                    tracing::warn!("the bus could not renew its hold within half of takeover_ms; another instance may take over");
                    self.hold(None, &mut *self.held.lock().await);
                    return;
                }
            }
        }
    }

    /// Whether this instance holds the key and wrote it less than half of `takeover`
    /// ago: before that, no other instance may take it. Checked before every write of
    /// the metadata and every deletion of a queue or reader.
    pub fn holds_fresh(&self) -> bool {
        self.renewed
            .lock()
            .is_some_and(|at| at.elapsed() < self.takeover / 2)
    }

    /// Writes the key again (compare-and-set on the revision this instance holds):
    /// [`Kind::Conflict`] when this instance does not hold it (any more). Before every
    /// change of the metadata too, so that an instance another has taken over from
    /// changes nothing.
    pub async fn renew(&self) -> weir_backend::Result<()> {
        let mut held = self.held.lock().await;
        // Both are written together, by `hold`, under this lock.
        assert_eq!(
            held.is_some(),
            self.renewed.lock().is_some(),
            "the owner key's revision and its renewal time disagree"
        );
        let (Some(revision), Some(map)) = (*held, self.map()) else {
            return Err(weir_backend::Error::new(
                Kind::Conflict,
                "this instance does not serve the bus",
            ));
        };
        match map
            .put(OWNER_KEY, self.me.clone(), Expect::Revision(revision))
            .await
        {
            Ok(r) => {
                self.hold(Some(r), &mut held);
                Ok(())
            }
            Err(e) => {
                if e.kind() == Kind::Conflict {
                    self.hold(None, &mut held);
                }
                Err(e)
            }
        }
    }

    /// Records the revision this instance holds (now written), or that it holds none.
    fn hold(&self, revision: Option<u64>, held: &mut Option<u64>) {
        *held = revision;
        *self.renewed.lock() = revision.map(|_| Instant::now());
    }

    /// Gives the key up (at a clean stop): an instance standing by takes over at its next
    /// read rather than after `takeover`.
    pub async fn resign(&self) {
        let held = {
            let mut held = self.held.lock().await;
            let revision = *held;
            self.hold(None, &mut held);
            revision
        };
        if let (Some(revision), Some(map)) = (held, self.map()) {
            if let Err(e) = map.delete(OWNER_KEY, revision).await {
                tracing::warn!(error = %e, "could not give the bus up; another instance takes over after takeover_ms");
            }
        }
    }
}

impl OwnerHold for Owner {
    fn holds_fresh(&self) -> bool {
        Owner::holds_fresh(self)
    }

    fn renew(&self) -> Pin<Box<dyn Future<Output = weir_backend::Result<()>> + Send + '_>> {
        Box::pin(Owner::renew(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hold is fresh for half of `takeover` after its last write, and never once
    /// given up: what fences an instance that may have been taken over from.
    #[tokio::test(start_paused = true)]
    async fn a_hold_goes_stale_at_half_the_takeover_time() {
        let owner = Owner::new("d".into(), "127.0.0.1:1".into(), Duration::from_secs(10));
        assert!(!owner.holds_fresh(), "nothing held yet");
        owner.hold(Some(7), &mut *owner.held.lock().await);
        assert!(owner.holds_fresh());
        tokio::time::advance(Duration::from_millis(4_900)).await;
        assert!(owner.holds_fresh());
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(!owner.holds_fresh(), "5.1 s after the last write");
        owner.hold(Some(8), &mut *owner.held.lock().await);
        assert!(owner.holds_fresh(), "written again");
        owner.hold(None, &mut *owner.held.lock().await);
        assert!(!owner.holds_fresh(), "given up");
        let e = owner.renew().await.unwrap_err();
        assert_eq!(e.kind(), Kind::Conflict, "nothing to renew: {e}");
    }
}
