//! Open leases: keeping them alive while their connection holds them, and giving them
//! back when it lets go.
//!
//! In JetStream a lease is a delivered, unacknowledged message; the consumer's AckWait
//! is its timeout. For queues without `open_timeout`, AckWait is `lease_timeout_ms`
//! (how soon the leases of a killed weir instance come back when no other instance gives
//! them back first, see [`super::instances`]), and the
//! keep-alive pump sends `+WPI` (work in progress: AckWait starts again) for every
//! lease this instance holds, every third of its AckWait. So a lease lives as long as the
//! client connection that holds it, whatever the AckWait, and no longer than
//! AckWait after its instance died. Queues with `open_timeout` get it as AckWait and no
//! keep-alive: the engine's timeout exactly.
//!
//! `Reader::release` must not await (it runs in `Drop`), so it hands `-NAK` to the
//! nak pump through a channel. The channel is unbounded, but its producer is bounded:
//! each lease is released at most once, and the leases an instance holds are bounded by
//! its own limits (`open_reads_max` per connection, connections) and by
//! `ack_pending_max` per reader on the cluster. The keep-alive registry is bounded by
//! [`KEPT_ALIVE_MAX`]; a lease past it is simply not renewed (it comes back after
//! AckWait), with a warning.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use super::api::Api;
use super::records::Record;

/// Leases one instance keeps alive at once (about 150 bytes each).
pub(crate) const KEPT_ALIVE_MAX: usize = 262_144;

/// The longest consumer leader election planned for (JetStream's Raft timeouts give 4
/// to 9 s).
const ELECTION_MAX: Duration = Duration::from_secs(10);
/// How long a `-NAK` nobody received is tried again, at most.
const NAK_RETRY_MAX: Duration = Duration::from_secs(15);
/// `-NAK`s being tried again at once, at most; past it, AckWait gives the item back.
const NAK_RETRIES_MAX: usize = 256;

/// How often the keep-alive pump looks for leases to renew, at most.
const TICK_MAX: Duration = Duration::from_millis(500);
const TICK_MIN: Duration = Duration::from_millis(20);

struct Held {
    /// The lease's record in the instances' stream ([`super::instances`]), if stored.
    record: Option<Arc<Record>>,
    next: Instant,
    every: Duration,
    ack_wait: Duration,
    /// Renewed by the pump (false: the queue's `open_timeout` is its AckWait).
    renew: bool,
}

impl Held {
    /// Until when a `-NAK` for this lease released now may be sent again, if nobody
    /// received it: half a renewal period past the next renewal, and at most
    /// [`NAK_RETRY_MAX`] from now. The lease's AckWait (three periods) runs from its
    /// last renewal that arrived. An election (at most [`ELECTION_MAX`]) loses at most
    /// one renewal when a period is at least that long, so AckWait lasts at least one
    /// period past `next`: half a period is the margin. With shorter periods (a
    /// `lease_timeout_ms` under 30 s) or no renewals (`open_timeout`) nothing bounds
    /// the lease's end from here: `None`, the `-NAK` goes once. A retry past the
    /// lease's end could take the item back from a new holder.
    fn nak_by(&self, now: Instant) -> Option<Instant> {
        let nak_by = (self.renew && self.every >= ELECTION_MAX)
            .then(|| (self.next + self.every / 2).min(now + NAK_RETRY_MAX));
        // The retries end while the lease surely lasts: past it, a -NAK could take
        // the item back from a new holder.
        debug_assert!(
            nak_by.is_none_or(|by| by <= self.sure_until()),
            "a -NAK retried past the lease's sure end"
        );
        nak_by
    }

    /// Until when the lease surely lasts, as far as this instance knows, so that a
    /// `-NAK` sent later may find the item another client's and is not sent (AckWait
    /// gives it back then, if it has not already). A renewed lease: half a renewal
    /// period past its next renewal (one renewal lost, and a margin; an election
    /// that loses more can end it sooner, and nothing tells that here). A lease with
    /// a fixed AckWait (`open_timeout`): five sixths of it from when it was taken.
    fn sure_until(&self) -> Instant {
        if self.renew {
            self.next + self.every / 2
        } else {
            let taken = self.next.checked_sub(self.every).unwrap_or(self.next);
            taken + self.ack_wait - self.ack_wait / 6
        }
    }
}

/// A lease's end, as the registry saw it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Forgot {
    /// This instance held it: its record (if any) is to lose it; and until when a `-NAK`
    /// for it may still be retried ([`Held::nak_by`]).
    Held {
        record: Option<Arc<Record>>,
        nak_by: Option<Instant>,
        /// [`Held::sure_until`].
        sure_until: Instant,
    },
    /// Other instances took this instance for dead and gave it back already: it must not be
    /// given back again (it may be another client's by now).
    Lost,
    /// Its reader was moved ([`Leases::end_consumer`]): the item may be pending
    /// again under a new delivery, which acknowledging this one would confirm.
    Ended,
    /// Not kept (past [`KEPT_ALIVE_MAX`]).
    Unknown,
}

/// A release for the nak pump.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Release {
    /// The lease's ack subject.
    pub reply: Arc<str>,
    /// Its record in the instances' stream, to lose it first.
    pub record: Option<Arc<Record>>,
    /// Until when a `-NAK` nobody received (no consumer leader: an election) is
    /// tried again; `None`: once.
    pub nak_by: Option<Instant>,
    /// Past this the `-NAK` is not sent at all ([`Held::sure_until`]); `None`: not
    /// known (a lease not kept).
    pub sure_until: Option<Instant>,
}

/// The leases this instance keeps alive, and the way to the nak pump.
pub(crate) struct Leases {
    held: Mutex<HashMap<Arc<str>, Held>>,
    /// Leases given back by other instances while this one was cut off (bounded as `held`).
    lost: Mutex<std::collections::HashSet<Arc<str>>>,
    /// Leases whose reader was moved (bounded as `held`).
    ended: Mutex<std::collections::HashSet<Arc<str>>>,
    naks: Mutex<Option<mpsc::UnboundedSender<Release>>>,
    /// Releases queued and not yet handed to the client.
    unsent: AtomicU64,
    sent: Notify,
    warned: AtomicBool,
    /// How often the keep-alive pump looks.
    pub tick: Duration,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Leases {
    /// The registry, and the receiving end for [`nak_pump`].
    pub fn new(lease_timeout: Duration) -> (Leases, mpsc::UnboundedReceiver<Release>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let leases = Leases {
            held: Mutex::new(HashMap::new()),
            lost: Mutex::new(std::collections::HashSet::new()),
            ended: Mutex::new(std::collections::HashSet::new()),
            naks: Mutex::new(Some(tx)),
            unsent: AtomicU64::new(0),
            sent: Notify::new(),
            warned: AtomicBool::new(false),
            tick: (lease_timeout / 6).clamp(TICK_MIN, TICK_MAX),
        };
        (leases, rx)
    }

    /// Remembers an open lease (its ack subject, and its record), taken (delivered)
    /// at `taken`, and renews it every third of `ack_wait` from then on when `renew`.
    pub fn keep(
        &self,
        reply: Arc<str>,
        ack_wait: Duration,
        renew: bool,
        record: Option<Arc<Record>>,
        taken: Instant,
    ) {
        let every = (ack_wait / 3).max(TICK_MIN);
        let mut held = lock(&self.held);
        if held.len() >= KEPT_ALIVE_MAX {
            drop(held);
            // Not kept, so never ended here: out of its record.
            if let Some(record) = &record {
                record.withdraw(&reply);
            }
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    max = KEPT_ALIVE_MAX,
                    "jetstream: too many open leases to keep alive; the newest come back after AckWait"
                );
            }
            return;
        }
        let next = taken + every;
        let held_before = held.insert(
            reply,
            Held {
                record,
                next,
                every,
                ack_wait,
                renew,
            },
        );
        // An ack subject names one delivery: kept twice, the first keep's record
        // would never lose its line.
        debug_assert!(held_before.is_none(), "a lease kept twice");
    }

    /// The stream sequences of the leases this instance holds on `consumer` (what a peek
    /// must not show).
    pub fn leased_seqs(&self, consumer: &str) -> std::collections::HashSet<u64> {
        let token = format!(".{consumer}.");
        lock(&self.held)
            .keys()
            .filter(|reply| reply.contains(&token))
            .filter_map(|reply| super::layout::Delivery::parse(reply))
            .map(|d| d.stream_seq)
            .collect()
    }

    /// Whether this instance holds the lease and renews it itself (`Some(true)`), or
    /// holds it under a fixed AckWait (`Some(false)`, `open_timeout`); `None`: not held.
    pub fn renewed(&self, reply: &str) -> Option<bool> {
        lock(&self.held).get(reply).map(|h| h.renew)
    }

    /// A lease with a fixed AckWait got `+WPI` sent at `sent_at`: its AckWait runs
    /// from then (what [`Held::sure_until`] goes by).
    pub fn touched(&self, reply: &str, sent_at: Instant) {
        if let Some(h) = lock(&self.held).get_mut(reply).filter(|h| !h.renew) {
            h.next = sent_at + h.every;
        }
    }

    /// The lease ended (confirmed or released): no more renewals.
    pub fn forget(&self, reply: &str) -> Forgot {
        if let Some(held) = lock(&self.held).remove(reply) {
            let nak_by = held.nak_by(Instant::now());
            return Forgot::Held {
                nak_by,
                sure_until: held.sure_until(),
                record: held.record,
            };
        }
        if lock(&self.lost).remove(reply) {
            return Forgot::Lost;
        }
        if lock(&self.ended).remove(reply) {
            return Forgot::Ended;
        }
        Forgot::Unknown
    }

    /// Other instances gave every lease of this instance back (they took it for dead): none
    /// is renewed or given back again. How many.
    pub fn lose_all(&self) -> usize {
        let held: Vec<Arc<str>> = lock(&self.held).drain().map(|(reply, _)| reply).collect();
        let n = held.len();
        let mut lost = lock(&self.lost);
        lost.extend(held);
        if lost.len() > KEPT_ALIVE_MAX {
            // Forgotten: their release sends a -NAK that finds them no longer pending
            // at worst (or takes one back from its new holder: delivered once more).
            lost.clear();
        }
        n
    }

    /// The reader `consumer` is being moved: the leases this instance holds on it end
    /// (no renewal; their confirm and release do nothing). Those recorded, with their
    /// records, which are to lose them.
    pub fn end_consumer(&self, consumer: &str) -> Vec<(Arc<Record>, Arc<str>)> {
        let token = format!(".{consumer}.");
        let mut held = lock(&self.held);
        let replies: Vec<Arc<str>> = held
            .keys()
            .filter(|reply| reply.contains(&token))
            .cloned()
            .collect();
        let mut records = Vec::new();
        let mut ended = lock(&self.ended);
        if ended.len() + replies.len() > KEPT_ALIVE_MAX {
            // Forgotten: their confirm acknowledges what may be a new delivery at
            // worst (delivered once), as without this registry.
            ended.clear();
        }
        for reply in replies {
            if let Some(record) = held.remove(&reply).and_then(|h| h.record) {
                records.push((record, reply.clone()));
            }
            ended.insert(reply);
        }
        records
    }

    /// Queues `-NAK` for the lease (after its record lost it); false once the
    /// backend is closed.
    pub fn nak(&self, release: Release) -> bool {
        // A -NAK retried (`nak_by`) is one of a lease kept here, whose sure end is
        // known ([`Forgot::Held`]), and the retries stop before it.
        if let Some(nak_by) = release.nak_by {
            debug_assert!(
                release.sure_until.is_some(),
                "a retried -NAK without its lease's end"
            );
            debug_assert!(
                release.sure_until.is_some_and(|sure| nak_by <= sure),
                "a -NAK retried past its lease's sure end"
            );
        }
        let naks = lock(&self.naks);
        let Some(tx) = naks.as_ref() else {
            return false;
        };
        self.unsent.fetch_add(1, Ordering::AcqRel);
        let queued = tx.send(release).is_ok();
        if !queued {
            self.unsent.fetch_sub(1, Ordering::AcqRel);
        }
        queued
    }

    /// Waits (up to `at_most`) until the releases queued so far are handed to the
    /// client, so that a take after a release goes on the wire after its `-NAK` and
    /// gets the released item first, as with the engine.
    pub async fn released(&self, at_most: Duration) {
        let until = Instant::now() + at_most;
        loop {
            let sent = self.sent.notified();
            if self.unsent.load(Ordering::Acquire) == 0 {
                return;
            }
            if tokio::time::timeout_at(until, sent).await.is_err() {
                return;
            }
        }
    }

    fn nak_sent(&self) {
        let unsent = self.unsent.fetch_sub(1, Ordering::AcqRel);
        // One call per release that `nak` queued: more would make `released` stop
        // waiting for releases still queued.
        assert!(unsent > 0, "a release counted as sent twice");
        self.sent.notify_waiters();
    }

    /// Ends the nak pump once it has sent what is queued.
    pub fn close(&self) {
        lock(&self.naks).take();
    }

    /// The records of the leases this instance holds whose stored version lists leases
    /// no longer open ([`Record::is_stale`]), each once.
    pub fn stale_records(&self) -> Vec<Arc<Record>> {
        let mut seen = std::collections::HashSet::new();
        lock(&self.held)
            .values()
            .filter_map(|h| h.record.as_ref())
            .filter(|r| r.is_stale() && seen.insert(Arc::as_ptr(r)))
            .cloned()
            .collect()
    }

    /// The leases due for renewal now (their next renewal moved on).
    fn due(&self) -> Vec<Arc<str>> {
        let now = Instant::now();
        let mut held = lock(&self.held);
        let mut due = Vec::new();
        for (reply, h) in held.iter_mut() {
            if h.renew && h.next <= now {
                h.next = now + h.every;
                due.push(reply.clone());
            }
        }
        due
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.held).len()
    }
}

/// Sends `-NAK` for each released lease: JetStream redelivers it, ahead of newer items.
/// Each is a request, and the pump waits for the consumer's reply (it answers once the
/// message is queued for redelivery), so a take that waited for [`Leases::released`]
/// gets the released item first, as with the engine. One that nobody received (no
/// consumer leader, during an election) is tried again by a task of its own until its
/// `nak_by`; one otherwise unconfirmed (it may have been received) comes back after
/// AckWait.
pub(crate) async fn nak_pump(
    api: Api,
    leases: Arc<Leases>,
    mut released: mpsc::UnboundedReceiver<Release>,
) {
    let retries = Arc::new(tokio::sync::Semaphore::new(NAK_RETRIES_MAX));
    while let Some(first) = released.recv().await {
        let mut batch = vec![first];
        while batch.len() < RELEASES_AT_ONCE {
            match released.try_recv() {
                Ok(release) => batch.push(release),
                Err(_) => break,
            }
        }
        // The records first: an instance killed between the two leaves the lease to
        // AckWait, rather than to another instance's -NAK after it went to a new
        // holder. One write per record for all its leases released together.
        for (record, replies) in by_record(&batch) {
            record.ended(&api, &replies).await;
        }
        for release in batch {
            give_back(&api, &retries, release).await;
            leases.nak_sent();
        }
    }
}

/// Releases handled together by the nak pump, at most.
const RELEASES_AT_ONCE: usize = 256;

/// The released leases' ack subjects, by record.
fn by_record(batch: &[Release]) -> Vec<(Arc<Record>, Vec<&str>)> {
    let mut groups: Vec<(Arc<Record>, Vec<&str>)> = Vec::new();
    for release in batch {
        let Some(record) = &release.record else {
            continue;
        };
        match groups.iter_mut().find(|(r, _)| Arc::ptr_eq(r, record)) {
            Some((_, replies)) => replies.push(&release.reply),
            None => groups.push((record.clone(), vec![&release.reply])),
        }
    }
    groups
}

/// One release's `-NAK` (its record already lost it), unless it waited too long.
async fn give_back(api: &Api, retries: &Arc<tokio::sync::Semaphore>, release: Release) {
    let reply = &release.reply;
    if release.sure_until.is_some_and(|t| Instant::now() >= t) {
        // Queued for too long (a burst of releases): the lease may have ended
        // and its item gone to another client, whom a -NAK would take it from.
        tracing::debug!(%reply, "jetstream: a release waited past its lease; AckWait gives it back");
        return;
    }
    let deadline = Instant::now() + api.request_timeout;
    match (nak(api, reply, deadline).await, release.nak_by) {
        (Nak::Confirmed, _) => {}
        (Nak::NoResponders, Some(nak_by)) if Instant::now() < nak_by => {
            match retries.clone().try_acquire_owned() {
                Ok(permit) => {
                    let api = api.clone();
                    tokio::spawn(async move {
                        nak_until(api, release.reply, nak_by).await;
                        drop(permit);
                    });
                }
                Err(_) => tracing::debug!("jetstream: too many releases waiting for a consumer leader; AckWait gives this one back"),
            }
        }
        _ => {
            tracing::debug!(%reply, "jetstream: a release was not confirmed; AckWait gives it back");
        }
    }
}

/// What a `-NAK` came to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Nak {
    /// The consumer confirmed it.
    Confirmed,
    /// Nobody received it (the consumer has no leader, or is gone): safe to send again.
    NoResponders,
    /// No reply in time: it may have been received.
    Unknown,
}

/// `-NAK` as a request, one attempt until `deadline`.
pub(crate) async fn nak(api: &Api, reply: &str, deadline: Instant) -> Nak {
    let request = async_nats::Request::new()
        .payload(bytes::Bytes::from_static(b"-NAK"))
        .inbox(api.client.new_inbox());
    match api.send(reply.to_owned(), request, deadline).await {
        super::api::Sent::Reply(_) => Nak::Confirmed,
        super::api::Sent::NoResponders => Nak::NoResponders,
        _ => Nak::Unknown,
    }
}

/// `-NAK` again while nobody receives it, until `nak_by`: a lease released during its
/// consumer's leader election comes back once a leader is elected, not after AckWait.
async fn nak_until(api: Api, reply: Arc<str>, nak_by: Instant) {
    let mut backoff = super::api::Backoff::new(nak_by);
    while backoff.pause(&api.metrics).await {
        match nak(&api, &reply, nak_by).await {
            Nak::NoResponders => continue,
            Nak::Confirmed => {
                tracing::debug!(%reply, "jetstream: a release went through after a leader election")
            }
            Nak::Unknown => {
                tracing::debug!(%reply, "jetstream: a retried release was not confirmed; AckWait gives it back")
            }
        }
        return;
    }
    tracing::debug!(%reply, "jetstream: no consumer leader to take a release; AckWait gives it back");
}

/// Sends `+WPI` for each held lease every third of its AckWait, until the backend is
/// dropped.
pub(crate) async fn keepalive_pump(api: Api, leases: std::sync::Weak<Leases>) {
    loop {
        let Some(leases) = leases.upgrade() else {
            return;
        };
        let tick = leases.tick;
        let due = leases.due();
        drop(leases);
        for reply in due {
            api.publish(reply.to_string(), b"+WPI").await;
        }
        tokio::time::sleep(tick).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keeps_forgets_and_closes() {
        let (leases, mut rx) = Leases::new(Duration::from_millis(300));
        leases.keep(
            "a".into(),
            Duration::from_millis(60),
            true,
            None,
            Instant::now(),
        );
        leases.keep(
            "b".into(),
            Duration::from_secs(60),
            true,
            Some(Arc::new(Record::new("rec"))),
            Instant::now(),
        );
        assert!(leases.due().is_empty());
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(leases.due(), vec![Arc::<str>::from("a")]);
        let Forgot::Held {
            record,
            nak_by,
            sure_until,
        } = leases.forget("a")
        else {
            panic!("a was held");
        };
        assert_eq!(record, None);
        // Renewed every 20 ms, the next renewal due 20 ms on: sure 10 ms past it.
        assert!(sure_until <= Instant::now() + Duration::from_millis(30));
        // Renewed every 20 ms: too short to outlast an election, so no retries.
        assert_eq!(nak_by, None);
        assert_eq!(leases.forget("a"), Forgot::Unknown);
        assert_eq!(leases.len(), 1);
        let release = |reply: &str, record: Option<&str>| Release {
            reply: reply.into(),
            record: record.map(|r| Arc::new(Record::new(r))),
            nak_by: None,
            sure_until: None,
        };
        assert!(leases.nak(release("b", Some("rec"))));
        leases.close();
        assert!(!leases.nak(release("c", None)));
        assert_eq!(rx.recv().await, Some(release("b", Some("rec"))));
        assert_eq!(rx.recv().await, None);
    }

    #[test]
    fn a_release_is_retried_only_while_the_lease_surely_lasts() {
        let (leases, _rx) = Leases::new(Duration::from_secs(30));
        let start = Instant::now();
        // Renewed every 10 s, next at +10 s: retried until +15 s.
        leases.keep(
            "renewed".into(),
            Duration::from_secs(30),
            true,
            None,
            Instant::now(),
        );
        let Forgot::Held {
            nak_by, sure_until, ..
        } = leases.forget("renewed")
        else {
            panic!("held");
        };
        let nak_by = nak_by.expect("a 30 s lease outlasts an election");
        assert!(nak_by >= start + Duration::from_secs(15) - Duration::from_millis(1));
        assert!(nak_by <= Instant::now() + NAK_RETRY_MAX);
        // Not sent at all past the same point (one renewal lost, half a period).
        assert!(sure_until >= start + Duration::from_secs(15));
        assert!(sure_until <= Instant::now() + Duration::from_secs(15));
        // An open_timeout lease is not renewed: nothing bounds it from here.
        leases.keep(
            "fixed".into(),
            Duration::from_secs(60),
            false,
            None,
            Instant::now(),
        );
        let Forgot::Held {
            nak_by, sure_until, ..
        } = leases.forget("fixed")
        else {
            panic!("held");
        };
        assert_eq!(nak_by, None);
        // But its end is known: its AckWait from when it was taken; sent until
        // five sixths of it.
        assert!(sure_until >= start + Duration::from_secs(50));
        assert!(sure_until <= Instant::now() + Duration::from_secs(50));
        // A lease of 10 s (renewed every 3.3 s) can lose two renewals in an election.
        leases.keep(
            "short".into(),
            Duration::from_secs(10),
            true,
            None,
            Instant::now(),
        );
        let Forgot::Held { nak_by, .. } = leases.forget("short") else {
            panic!("held");
        };
        assert_eq!(nak_by, None);
    }

    #[test]
    fn releases_together_cost_one_write_per_record() {
        let (a, b) = (Arc::new(Record::new("a")), Arc::new(Record::new("b")));
        let release = |reply: &str, record: Option<&Arc<Record>>| Release {
            reply: reply.into(),
            record: record.cloned(),
            nak_by: None,
            sure_until: None,
        };
        let batch = [
            release("1", Some(&a)),
            release("2", Some(&b)),
            release("3", None),
            release("4", Some(&a)),
        ];
        let groups = by_record(&batch);
        assert_eq!(groups.len(), 2);
        assert!(Arc::ptr_eq(&groups[0].0, &a));
        assert_eq!(groups[0].1, ["1", "4"]);
        assert!(Arc::ptr_eq(&groups[1].0, &b));
        assert_eq!(groups[1].1, ["2"]);
    }

    #[test]
    fn lost_leases_are_neither_renewed_nor_given_back() {
        let (leases, _rx) = Leases::new(Duration::from_millis(300));
        leases.keep(
            "a".into(),
            Duration::from_millis(30),
            true,
            Some(Arc::new(Record::new("ra"))),
            Instant::now(),
        );
        leases.keep(
            "b".into(),
            Duration::from_millis(30),
            true,
            None,
            Instant::now(),
        );
        assert_eq!(leases.lose_all(), 2);
        assert_eq!(leases.len(), 0);
        std::thread::sleep(Duration::from_millis(20));
        assert!(leases.due().is_empty());
        assert_eq!(leases.forget("a"), Forgot::Lost);
        assert_eq!(leases.forget("a"), Forgot::Unknown);
        assert_eq!(leases.forget("b"), Forgot::Lost);
    }

    #[test]
    fn a_moved_readers_leases_end_and_no_others() {
        let (leases, _rx) = Leases::new(Duration::from_millis(300));
        let reply = |consumer: &str, seq: u64| -> Arc<str> {
            format!("$JS.ACK.S.{consumer}.1.{seq}.{seq}.1700000000000000000.0").into()
        };
        leases.keep(
            reply("q~r", 5),
            Duration::from_secs(30),
            true,
            Some(Arc::new(Record::new("r5"))),
            Instant::now(),
        );
        leases.keep(
            reply("q~r", 6),
            Duration::from_secs(30),
            true,
            None,
            Instant::now(),
        );
        leases.keep(
            reply("q~rr", 7),
            Duration::from_secs(30),
            true,
            None,
            Instant::now(),
        );
        leases.keep(
            reply("q~", 8),
            Duration::from_secs(30),
            true,
            None,
            Instant::now(),
        );
        let records = leases.end_consumer("q~r");
        assert_eq!(
            records,
            vec![(Arc::new(Record::new("r5")), reply("q~r", 5))]
        );
        assert_eq!(leases.len(), 2);
        assert_eq!(leases.forget(&reply("q~r", 5)), Forgot::Ended);
        assert_eq!(leases.forget(&reply("q~r", 5)), Forgot::Unknown);
        assert_eq!(leases.forget(&reply("q~r", 6)), Forgot::Ended);
        assert!(matches!(
            leases.forget(&reply("q~rr", 7)),
            Forgot::Held { .. }
        ));
        assert!(matches!(
            leases.forget(&reply("q~", 8)),
            Forgot::Held { .. }
        ));
        assert!(leases.end_consumer("q~r").is_empty());
    }

    /// A release the nak pump counts as sent more often than it was queued is a bug
    /// (`released` would stop waiting for releases still queued): it crashes.
    #[test]
    #[should_panic(expected = "a release counted as sent twice")]
    fn a_release_sent_twice_is_a_bug() {
        let (leases, _rx) = Leases::new(Duration::from_millis(300));
        leases.nak_sent();
    }

    /// Keeping one delivery's lease twice is a bug (the first keep's record would
    /// never lose its line); caught in debug builds.
    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "a lease kept twice")]
    fn a_lease_kept_twice_is_a_bug() {
        let (leases, _rx) = Leases::new(Duration::from_millis(300));
        let ack_wait = Duration::from_secs(30);
        leases.keep("a".into(), ack_wait, true, None, Instant::now());
        leases.keep("a".into(), ack_wait, true, None, Instant::now());
    }
}
