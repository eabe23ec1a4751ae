//! Lease records written together: the part of [`super::instances`] on a lease's path.
//!
//! An instance records each lease it hands out in the instances' stream before the client gets
//! the item, so that another instance can give it back at once if this one is killed.
//! One replicated write per lease, and another when it ends, cost about 40 % of lease
//! throughput on a small cluster whose servers are the bottleneck (docs/benchmarks.md).
//! So the leases being recorded at the same moment share one record (group commit):
//!
//! - **One write in flight per instance** ([`WRITES_MAX`]). A lease to record joins the
//!   batch being gathered; a waiter that finds no write in flight takes the oldest
//!   batch, writes it (one publish, one line per lease: `<ack subject> <expires
//!   ms>`) and tells its waiters. Alone, a lease waits one round trip; under load,
//!   the leases that arrive during one write go in the next. (Measured on a 2-core
//!   test cluster, docs/benchmarks.md: with 100 concurrent leases, lease + confirm
//!   26 to 31 % faster than with one write per lease; with 10, no gain; 4, 8 and 16
//!   writes in flight were no better.)
//! - **A confirmed lease writes nothing.** Its line stays in the stored record: a
//!   `-NAK` of an acknowledged item finds it no longer pending and does nothing.
//!   Before a reader is moved (which can make the item pending again), the instance
//!   writes such records again without those lines ([`Record::refresh`]).
//! - **A released lease rewrites its record** without its line before its `-NAK` is
//!   sent (otherwise a killed instance's give-back could take the item back from its next
//!   holder). Rewrites of one record go out in order.
//! - **The last lease of a record to end** replaces it with a tombstone that goes by
//!   itself, as a single lease's record did.
//!
//! A record written by older builds is the one-line case of the same format.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_nats::HeaderMap;
use bytes::Bytes;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::api::{Api, Sent};
use super::pub_ack::PubAck;

/// A tombstone's life: it replaces a record whose leases all ended, then goes.
const TOMBSTONE_TTL: &str = "1s";
/// A record goes by itself after this long (if its tombstone was lost): a lease held
/// longer comes back after AckWait if its instance is killed.
pub(crate) const RECORD_TTL: &str = "86400s";
/// Records being written at once, at most; the leases to record meanwhile gather.
pub(crate) const WRITES_MAX: usize = 1;
/// Leases in one record, at most (about 150 bytes each: far below a message's 1 MiB).
const LINES_MAX: usize = 256;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One record in the instances' stream, and the leases in it not yet ended.
pub(crate) struct Record {
    subject: Arc<str>,
    /// `(ack subject, expires ms)` of the leases in it still open.
    open: Mutex<Vec<(Arc<str>, u64)>>,
    /// Rewrites and the tombstone go out one at a time, in order.
    writing: tokio::sync::Mutex<()>,
    /// The stored record may list leases no longer open (see [`Record::refresh`]);
    /// set with every line taken out, cleared (under the `open` lock) when what is
    /// open is taken for a write.
    stale: AtomicBool,
}

impl std::fmt::Debug for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Record").field(&self.subject).finish()
    }
}

impl PartialEq for Record {
    fn eq(&self, other: &Record) -> bool {
        self.subject == other.subject
    }
}

impl Eq for Record {}

impl Record {
    pub fn new(subject: impl Into<Arc<str>>) -> Record {
        Record {
            subject: subject.into(),
            open: Mutex::new(Vec::new()),
            writing: tokio::sync::Mutex::new(()),
            stale: AtomicBool::new(false),
        }
    }

    pub fn subject(&self) -> &str {
        &self.subject
    }

    fn add(&self, reply: &str, expires_at_ms: u64) -> usize {
        let mut open = lock(&self.open);
        // A lease is recorded once: a second line would outlive its lease's end.
        debug_assert!(
            !open.iter().any(|(r, _)| &**r == reply),
            "a lease recorded twice"
        );
        open.push((reply.into(), expires_at_ms));
        // `Batcher::join` starts a new record when one is full.
        debug_assert!(open.len() <= LINES_MAX, "a record over LINES_MAX leases");
        open.len()
    }

    /// Takes `reply` out of the record in memory only (its lease never went out, or
    /// was not kept).
    pub fn withdraw(&self, reply: &str) {
        let mut open = lock(&self.open);
        open.retain(|(r, _)| &**r != reply);
        self.stale.store(true, Ordering::Release);
    }

    /// Whether the stored record may list leases no longer open.
    pub fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Acquire)
    }

    /// The record's body: a line per open lease.
    fn body(&self) -> String {
        lines(&lock(&self.open))
    }

    /// The lease ended by a confirmation: nothing is written unless it was the
    /// record's last (then the tombstone).
    pub async fn confirmed(&self, api: &Api, reply: &str) {
        self.end(api, &[reply], false).await;
    }

    /// The leases ended without a confirmation (released, or their reader moved):
    /// the stored record loses their lines (or becomes a tombstone; sent, without
    /// waiting for the stream's answer) before this returns, so a give-back does not
    /// send their `-NAK` after the caller's.
    pub async fn ended(&self, api: &Api, replies: &[&str]) {
        self.end(api, replies, true).await;
    }

    /// Rewrites the stored record if it may list leases no longer open: a `-NAK`
    /// of a confirmed item does nothing, unless its reader was moved back before it
    /// since and the item pending again (the server checks only that the stream
    /// sequence is pending and the delivery sequence within what it delivered, which
    /// a move starts again). So before a move the instance's records lose such lines.
    pub async fn refresh(&self, api: &Api) {
        if self.stale.load(Ordering::Acquire) {
            self.write_current(api, true).await;
        }
    }

    async fn end(&self, api: &Api, replies: &[&str], rewrite: bool) {
        // Taken out at once (a caller dropped while waiting below still leaves
        // the lines out); what is written is the latest state, whoever settled last.
        if self.settle(replies, rewrite).is_some() {
            self.write_current(api, rewrite).await;
        }
    }

    /// Writes what the record now holds, in order with its other writes: the
    /// tombstone when it is empty, else (with `rewrite`) its open lines.
    async fn write_current(&self, api: &Api, rewrite: bool) {
        let _in_order = self.writing.lock().await;
        let write = {
            let open = lock(&self.open);
            let write = if open.is_empty() {
                Some(Write::Tombstone)
            } else {
                rewrite.then(|| Write::Rewrite(lines(&open)))
            };
            if write.is_some() {
                // What is written is what is open now; a line taken out after
                // this sets it again.
                self.stale.store(false, Ordering::Release);
            }
            write
        };
        match write {
            Some(Write::Tombstone) => {
                publish(api, &self.subject, TOMBSTONE_TTL, Bytes::new()).await;
            }
            Some(Write::Rewrite(body)) => {
                publish(api, &self.subject, RECORD_TTL, Bytes::from(body)).await;
            }
            None => {}
        }
    }

    /// Takes `replies` out; what the stored record needs then.
    fn settle(&self, replies: &[&str], rewrite: bool) -> Option<Write> {
        let mut open = lock(&self.open);
        let before = open.len();
        open.retain(|(r, _)| !replies.contains(&&**r));
        if open.len() == before {
            return None;
        }
        self.stale.store(true, Ordering::Release);
        if open.is_empty() {
            return Some(Write::Tombstone);
        }
        rewrite.then(|| Write::Rewrite(lines(&open)))
    }
}

/// A write a record needs when leases in it end.
#[derive(Debug, PartialEq, Eq)]
enum Write {
    Tombstone,
    Rewrite(String),
}

/// A publish without a reply (a rewrite or a tombstone): the connection keeps its
/// order to the server, so the stream stores a record's versions in the order sent.
async fn publish(api: &Api, subject: &str, ttl: &'static str, body: Bytes) {
    let mut headers = HeaderMap::new();
    headers.insert("Nats-TTL", ttl);
    let sent = api
        .client
        .publish_with_headers(subject.to_owned(), headers, body);
    let _ = tokio::time::timeout(api.request_timeout, sent).await;
}

/// The body of a record whose open leases are `open`.
fn lines(open: &[(Arc<str>, u64)]) -> String {
    render(open.iter().map(|(r, e)| (&**r, *e)))
}

/// `<ack subject> <expires ms>` a line.
fn render<'a>(lines: impl Iterator<Item = (&'a str, u64)>) -> String {
    let mut body = String::new();
    for (reply, expires) in lines {
        if !body.is_empty() {
            body.push('\n');
        }
        body.push_str(reply);
        body.push(' ');
        body.push_str(&expires.to_string());
    }
    body
}

/// The leases of a record, `(ack subject, expires ms)`; a line that is not one
/// (a tombstone is empty) is skipped.
pub(crate) fn parse(record: &[u8]) -> Vec<(&str, u64)> {
    let Ok(text) = std::str::from_utf8(record) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let (reply, expires) = line.split_once(' ')?;
            super::layout::Delivery::parse(reply)?;
            Some((reply, expires.parse().ok()?))
        })
        .collect()
}

/// What became of a record's write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stored {
    /// The stream acknowledged it.
    Yes,
    /// Nothing is known (no reply in time): it may be stored, so it is treated as
    /// stored (tombstoned when its leases end).
    Maybe,
    /// Refused, or nobody there: not stored.
    No,
}

impl Stored {
    /// What became of a record's write, from what `Api::send` answered: a PubAck
    /// that says stored, no reply in time (maybe), anything else (no).
    pub fn from_sent(sent: &Sent) -> Stored {
        match sent {
            Sent::Reply(m) if PubAck::stored(&m.payload) => Stored::Yes,
            Sent::Failed(_) => Stored::Maybe,
            _ => Stored::No,
        }
    }
}

/// A record being gathered or written.
struct Pending {
    /// Its number among this instance's records.
    n: u64,
    record: Arc<Record>,
    done: watch::Sender<Option<Stored>>,
}

#[derive(Default)]
struct State {
    /// Records gathered and not yet taken for writing, oldest first.
    gathering: VecDeque<Pending>,
    /// Writes in flight.
    writing: usize,
    next: u64,
}

/// Gathers the leases recorded at the same moment into one record each write.
#[derive(Default)]
pub(crate) struct Batcher {
    state: Mutex<State>,
    /// A write ended: a waiter may take the next batch.
    written: Notify,
}

/// A lease's place in a record, until [`Batcher::record`] answers.
struct Joined<'a> {
    record: &'a Arc<Record>,
    reply: &'a str,
    answered: bool,
}

impl Drop for Joined<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.record.withdraw(self.reply);
        }
    }
}

/// Ends the write in flight, even when its writer was dropped part-way.
struct Writing<'a>(&'a Batcher);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let mut state = lock(&self.0.state);
        // One `Writing` per write `Batcher::take` counted.
        debug_assert!(state.writing > 0, "a record write ended twice");
        state.writing = state.writing.saturating_sub(1);
        drop(state);
        self.0.written.notify_waiters();
    }
}

impl Batcher {
    /// Records a lease (`reply`, expiring by itself at `expires_at_ms`, 0 for never)
    /// in a record named `subject(n)` for a new record `n`, written by `write`; the
    /// record, once stored or maybe stored, or `None` when it was refused or not
    /// written by `deadline`.
    pub async fn record<W, F>(
        &self,
        reply: &str,
        expires_at_ms: u64,
        subject: impl Fn(u64) -> String,
        deadline: Instant,
        write: W,
    ) -> Option<Arc<Record>>
    where
        W: Fn(Arc<Record>, String) -> F,
        F: Future<Output = Stored>,
    {
        let (record, mut done) = self.join(reply, expires_at_ms, subject);
        // Dropped before it answers (the client went away): the lease never goes
        // out, so its line leaves the record in memory (the stored record keeps it
        // until the record's next write; a give-back in between sends a -NAK that
        // finds the item pending, or another client's: delivered once more).
        let mut joined = Joined {
            record: &record,
            reply,
            answered: false,
        };
        loop {
            let written = self.written.notified();
            if let Some(stored) = *done.borrow() {
                joined.answered = true;
                return (stored != Stored::No).then(|| record.clone());
            }
            if Instant::now() >= deadline {
                joined.answered = true;
                return self.give_up(&record, reply);
            }
            if let Some((batch, guard)) = self.take() {
                let body = batch.record.body();
                let stored = write(batch.record.clone(), body).await;
                batch.done.send_replace(Some(stored));
                drop(guard);
                continue;
            }
            tokio::select! {
                changed = done.changed() => {
                    if changed.is_err() {
                        // Its writer was dropped part-way: it may be stored.
                        joined.answered = true;
                        return Some(record.clone());
                    }
                }
                () = written => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// Adds the lease to the newest record being gathered, or to a new one (when
    /// that one is full, or named otherwise: the instance registered again under a new
    /// key meanwhile).
    fn join(
        &self,
        reply: &str,
        expires_at_ms: u64,
        subject: impl Fn(u64) -> String,
    ) -> (Arc<Record>, watch::Receiver<Option<Stored>>) {
        let mut state = lock(&self.state);
        if let Some(last) = state.gathering.back() {
            let room = lock(&last.record.open).len() < LINES_MAX;
            if room && *last.record.subject == subject(last.n) {
                last.record.add(reply, expires_at_ms);
                return (last.record.clone(), last.done.subscribe());
            }
        }
        let n = state.next;
        state.next += 1;
        let record = Arc::new(Record::new(subject(n)));
        record.add(reply, expires_at_ms);
        let (done, receiver) = watch::channel(None);
        state.gathering.push_back(Pending {
            n,
            record: record.clone(),
            done,
        });
        (record, receiver)
    }

    /// The oldest record gathered, to write now, when no write is in flight.
    fn take(&self) -> Option<(Pending, Writing<'_>)> {
        let mut state = lock(&self.state);
        if state.writing >= WRITES_MAX {
            return None;
        }
        // A record all of whose leases went away before it was written is not.
        while state
            .gathering
            .front()
            .is_some_and(|p| lock(&p.record.open).is_empty())
        {
            state.gathering.pop_front();
        }
        let batch = state.gathering.pop_front()?;
        state.writing += 1;
        assert!(
            state.writing <= WRITES_MAX,
            "more record writes at once than WRITES_MAX"
        );
        Some((batch, Writing(self)))
    }

    /// Out of time: a lease whose record was not taken for writing yet leaves it (it
    /// goes out unrecorded); one being written is taken as maybe stored.
    fn give_up(&self, record: &Arc<Record>, reply: &str) -> Option<Arc<Record>> {
        let mut state = lock(&self.state);
        let Some(at) = state
            .gathering
            .iter()
            .position(|p| Arc::ptr_eq(&p.record, record))
        else {
            return Some(record.clone());
        };
        record.withdraw(reply);
        if lock(&record.open).is_empty() {
            state.gathering.remove(at);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    const REPLY: &str = "$JS.ACK.WEIR.q~.1.42.7.1700000000123456789.0";

    #[test]
    fn records_read_back_line_by_line() {
        let other = "$JS.ACK.WEIR.q~r.1.43.8.1700000000123456789.0";
        let body = render([(REPLY, 0), (other, 1_700_000_005_000)].into_iter());
        assert_eq!(
            parse(body.as_bytes()),
            vec![(REPLY, 0), (other, 1_700_000_005_000)]
        );
        // The one-line record of older builds.
        assert_eq!(parse(format!("{REPLY} 0").as_bytes()), vec![(REPLY, 0)]);
        // Tombstones and anything else: no leases, no panic.
        assert!(parse(b"").is_empty());
        assert!(parse(b"_INBOX.x 0").is_empty());
        assert!(parse(format!("{REPLY} soon").as_bytes()).is_empty());
        assert!(parse(&[0xff, 0xfe, b' ', b'1']).is_empty());
        // A bad line among good ones costs only itself.
        let mixed = format!("{REPLY} 0\ngarbage\n{other} 5");
        assert_eq!(parse(mixed.as_bytes()), vec![(REPLY, 0), (other, 5)]);
    }

    #[test]
    fn a_record_is_rewritten_for_a_release_and_goes_with_its_last_lease() {
        let other = "$JS.ACK.WEIR.q~.1.43.8.1700000000123456789.0";
        let third = "$JS.ACK.WEIR.q~.1.44.9.1700000000123456789.0";
        let record = Record::new("rec.0");
        for reply in [REPLY, other, third] {
            record.add(reply, 0);
        }
        // A confirmation writes nothing: its line may stay, and the record is
        // marked for a rewrite before its reader is moved (`refresh`).
        assert!(!record.stale.load(Ordering::Acquire));
        assert_eq!(record.settle(&[REPLY], false), None);
        assert!(record.stale.load(Ordering::Acquire));
        // A release rewrites the record without its line.
        assert_eq!(
            record.settle(&[other], true),
            Some(Write::Rewrite(format!("{third} 0")))
        );
        // A lease not in it (ended already) changes nothing.
        assert_eq!(record.settle(&[other], true), None);
        // The last one, however it ends: the tombstone.
        assert_eq!(record.settle(&[third], false), Some(Write::Tombstone));
        assert_eq!(record.body(), "");
    }

    #[tokio::test]
    async fn leases_recorded_at_once_share_a_record() {
        let batcher = Arc::new(Batcher::default());
        let writes = Arc::new(AtomicUsize::new(0));
        // The first writes are held until every other lease has joined a record.
        let (release, held) = watch::channel(false);
        let mut tasks = Vec::new();
        for i in 0..(WRITES_MAX + 8) as u64 {
            let batcher = batcher.clone();
            let writes = writes.clone();
            let held = held.clone();
            tasks.push(tokio::spawn(async move {
                let reply = format!("$JS.ACK.WEIR.q~.1.{i}.{i}.1700000000123456789.0");
                let deadline = Instant::now() + Duration::from_secs(10);
                let write = |record: Arc<Record>, body: String| {
                    let writes = writes.clone();
                    let mut held = held.clone();
                    async move {
                        writes.fetch_add(1, Ordering::SeqCst);
                        let _ = held.wait_for(|go| *go).await;
                        assert_eq!(parse(body.as_bytes()).len(), lock(&record.open).len());
                        Stored::Yes
                    }
                };
                let record = batcher
                    .record(&reply, 0, |n| format!("rec.{n}"), deadline, write)
                    .await;
                record.map(|r| r.subject().to_owned())
            }));
            // The first ones are being written before the others arrive.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = release.send(true);
        let mut subjects = Vec::new();
        for task in tasks {
            subjects.push(task.await.ok().flatten());
        }
        // The first ones alone, the eight gathered meanwhile in one more write.
        assert_eq!(writes.load(Ordering::SeqCst), WRITES_MAX + 1);
        for (i, subject) in subjects[..WRITES_MAX].iter().enumerate() {
            assert_eq!(subject.as_deref(), Some(format!("rec.{i}").as_str()));
        }
        let gathered = format!("rec.{WRITES_MAX}");
        assert!(subjects[WRITES_MAX..]
            .iter()
            .all(|s| s.as_deref() == Some(gathered.as_str())));
    }

    #[test]
    fn a_lease_joins_a_gathering_record_only_under_the_same_name() {
        let batcher = Batcher::default();
        let other = "$JS.ACK.WEIR.q~.1.43.8.1700000000123456789.0";
        let (first, _) = batcher.join(REPLY, 0, |n| format!("a.{n}"));
        let (same, _) = batcher.join(other, 0, |n| format!("a.{n}"));
        assert!(Arc::ptr_eq(&first, &same));
        // Registered again under a new key: a record of its own.
        let (renamed, _) = batcher.join(other, 0, |n| format!("b.{n}"));
        assert_eq!(renamed.subject(), "b.1");
        assert_eq!(first.body(), format!("{REPLY} 0\n{other} 0"));
    }

    #[tokio::test]
    async fn a_refused_or_late_record_is_none_and_a_dropped_writer_frees_the_next() {
        let batcher = Batcher::default();
        let soon = || Instant::now() + Duration::from_millis(200);
        let refused = batcher
            .record(
                REPLY,
                0,
                |n| format!("rec.{n}"),
                soon(),
                |_, _| async { Stored::No },
            )
            .await;
        assert_eq!(refused, None);
        let maybe = batcher
            .record(
                REPLY,
                0,
                |n| format!("rec.{n}"),
                soon(),
                |_, _| async { Stored::Maybe },
            )
            .await;
        assert_eq!(
            maybe.map(|r| r.subject().to_owned()).as_deref(),
            Some("rec.1")
        );
        // Writers dropped part-way (their clients went away) leave no write in flight.
        for _ in 0..WRITES_MAX {
            let stuck = batcher.record(
                REPLY,
                0,
                |n| format!("rec.{n}"),
                soon(),
                |_, _| std::future::pending::<Stored>(),
            );
            assert!(tokio::time::timeout(Duration::from_millis(50), stuck)
                .await
                .is_err());
        }
        assert_eq!(lock(&batcher.state).writing, 0);
        let next = batcher
            .record(
                REPLY,
                0,
                |n| format!("rec.{n}"),
                soon(),
                |_, _| async { Stored::Yes },
            )
            .await;
        let expected = format!("rec.{}", 2 + WRITES_MAX);
        assert_eq!(
            next.map(|r| r.subject().to_owned()).as_deref(),
            Some(expected.as_str())
        );
    }

    #[tokio::test]
    async fn a_waiter_dropped_before_its_answer_leaves_its_record() {
        let batcher = Batcher::default();
        let far = || Instant::now() + Duration::from_secs(10);
        let mut stuck = Box::pin(batcher.record(
            REPLY,
            0,
            |n| format!("rec.{n}"),
            far(),
            |_, _| std::future::pending::<Stored>(),
        ));
        // Polled once: it takes rec.0 and writes it, forever.
        assert!(tokio::time::timeout(Duration::from_millis(20), &mut stuck)
            .await
            .is_err());
        let other = "$JS.ACK.WEIR.q~.1.43.8.1700000000123456789.0";
        let waiting = batcher.record(
            other,
            0,
            |n| format!("rec.{n}"),
            far(),
            |_, _| async { Stored::Yes },
        );
        // Its client went away while it waited for rec.1 to be written.
        assert!(tokio::time::timeout(Duration::from_millis(20), waiting)
            .await
            .is_err());
        let gathered = lock(&batcher.state)
            .gathering
            .front()
            .map(|p| p.record.body());
        assert_eq!(gathered.as_deref(), Some(""), "its line left");
        // The empty record is never written: a lease under another name (the instance
        // registered again) gets a record of its own, and rec.1 is skipped.
        drop(stuck);
        let next = batcher
            .record(
                REPLY,
                0,
                |n| format!("new.{n}"),
                far(),
                |_, _| async { Stored::Yes },
            )
            .await;
        assert_eq!(
            next.map(|r| r.subject().to_owned()).as_deref(),
            Some("new.2")
        );
        assert!(lock(&batcher.state).gathering.is_empty());
    }

    #[tokio::test]
    async fn a_lease_still_gathered_at_its_deadline_leaves_its_record() {
        let batcher = Batcher::default();
        // Writes in flight that never end (but are not dropped) keep the next
        // record gathering.
        let first = futures_util::future::join_all((0..WRITES_MAX).map(|_| {
            batcher.record(
                REPLY,
                0,
                |n| format!("rec.{n}"),
                Instant::now() + Duration::from_secs(10),
                |_, _| std::future::pending::<Stored>(),
            )
        }));
        let other = "$JS.ACK.WEIR.q~.1.43.8.1700000000123456789.0";
        let second = batcher.record(
            other,
            0,
            |n| format!("rec.{n}"),
            Instant::now() + Duration::from_millis(100),
            |_, _| async { Stored::Yes },
        );
        tokio::pin!(first);
        let late = tokio::select! {
            biased;
            _ = &mut first => panic!("those writes never end"),
            late = second => late,
        };
        assert_eq!(late, None);
        // Its record, empty, is not written at all.
        assert!(lock(&batcher.state).gathering.is_empty());
    }

    /// A lease recorded twice in one record is a bug (its second line would
    /// outlive the lease); caught in debug builds.
    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "a lease recorded twice")]
    fn a_lease_recorded_twice_is_a_bug() {
        let record = Record::new("rec");
        record.add(REPLY, 0);
        record.add(REPLY, 0);
    }
}
