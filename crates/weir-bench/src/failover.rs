//! Failover under load, for `weir-bench cluster`: writers doing acknowledged writes in
//! a loop (one in flight each) while the bench SIGKILLs the stream leader's
//! nats-server; the figure is the gap from the kill to the first acknowledgement that
//! completes more than [`IN_FLIGHT`] after it (acks completing sooner were already on
//! their way and say nothing about the new leader).
//!
//! Two kinds of writers, measured the same way in the same run: weir connections
//! sending `set` and waiting for `STORED` (weir retries through an election for up to
//! its `unavailable_retry_ms`, 10 s by default, then answers `SERVER_ERROR`, which is
//! counted as a refusal), and raw async-nats JetStream publishers awaiting each PubAck
//! (a failed publish, typically 503 no responders during the election or an ack
//! timeout, is a refusal; the publisher retries after 10 ms). The raw publishers give
//! NATS's own election time on this machine: the floor weir's figure is held against.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use async_nats::jetstream;
use bytes::Bytes;
use tokio::task::JoinSet;

use crate::proto::{payload, set_request, Conn, SetReply};

/// Acks completing within this long after the kill were in flight before it.
pub const IN_FLIGHT: Duration = Duration::from_millis(100);
/// How long a writer waits after a refusal before the next try.
const RETRY_AFTER: Duration = Duration::from_millis(10);

/// One write's completion.
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub at: Instant,
    pub acked: bool,
}

/// What the writers share with the bench: when the kill happened, whether a write
/// has been acknowledged since, and when to stop.
#[derive(Default)]
pub struct Recorder {
    kill_at: OnceLock<Instant>,
    recovered: AtomicBool,
    stop: AtomicBool,
}

impl Recorder {
    fn note(&self, events: &mut Vec<Event>, acked: bool) {
        let at = Instant::now();
        events.push(Event { at, acked });
        if acked && self.kill_at.get().is_some_and(|k| at > *k + IN_FLIGHT) {
            self.recovered.store(true, Ordering::Relaxed);
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub fn set_kill(&self, at: Instant) {
        let _ = self.kill_at.set(at);
    }

    pub fn recovered(&self) -> bool {
        self.recovered.load(Ordering::Relaxed)
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The writers of one measurement; each returns its events.
pub type Writers = JoinSet<Result<Vec<Event>>>;

/// `conns` weir connections, each `set`ting `item_bytes` items on `queue` in a loop.
/// All connect before any writes.
pub async fn weir_writers(
    addr: SocketAddr,
    conns: usize,
    queue: &str,
    item_bytes: usize,
    rec: &Arc<Recorder>,
) -> Result<Writers> {
    let request = Arc::new(set_request(queue, &payload(item_bytes)));
    let mut tasks = JoinSet::new();
    for i in 0..conns {
        let mut conn = Conn::connect(addr, 4096)
            .await
            .with_context(|| format!("failover writer {} of {conns}", i + 1))?;
        let (rec, request) = (Arc::clone(rec), Arc::clone(&request));
        tasks.spawn(async move {
            let mut events = Vec::new();
            while !rec.stopped() {
                match conn.set_reply(&request).await? {
                    SetReply::Stored => rec.note(&mut events, true),
                    SetReply::ServerError(_) => {
                        rec.note(&mut events, false);
                        tokio::time::sleep(RETRY_AFTER).await;
                    }
                }
            }
            Ok(events)
        });
    }
    Ok(tasks)
}

/// `tasks` async-nats publishers, each on its own connection, publishing
/// `item_bytes` messages to `subject` and awaiting each PubAck for at most
/// `ack_timeout`; a failure is noted and retried after 10 ms.
pub async fn nats_writers(
    urls: &[String],
    tasks: usize,
    subject: &str,
    item_bytes: usize,
    ack_timeout: Duration,
    rec: &Arc<Recorder>,
) -> Result<Writers> {
    let data = Bytes::from(payload(item_bytes));
    let mut set = JoinSet::new();
    for i in 0..tasks {
        // Pings every 2 s, as weir's doors do (`ping_interval_ms`): with the client's
        // 60 s default a publisher stays on a stopped server for minutes.
        let client = async_nats::ConnectOptions::new()
            .ping_interval(Duration::from_secs(2))
            .max_reconnects(None)
            .connect(urls.to_vec())
            .await
            .with_context(|| format!("NATS publisher {} of {tasks}", i + 1))?;
        let js = jetstream::ContextBuilder::new()
            .timeout(ack_timeout)
            .build(client);
        let (rec, data, subject) = (Arc::clone(rec), data.clone(), subject.to_string());
        set.spawn(async move {
            let mut events = Vec::new();
            while !rec.stopped() {
                let acked = match js.publish(subject.clone(), data.clone()).await {
                    Ok(ack) => ack.await.is_ok(),
                    Err(_) => false,
                };
                rec.note(&mut events, acked);
                if !acked {
                    tokio::time::sleep(RETRY_AFTER).await;
                }
            }
            Ok(events)
        });
    }
    Ok(set)
}

/// Stops the writers and gathers their events (a writer's error is returned).
pub async fn finish(rec: &Recorder, mut writers: Writers) -> Result<Vec<Event>> {
    rec.stop();
    let mut all = Vec::new();
    while let Some(joined) = writers.join_next().await {
        all.extend(joined.context("a failover writer panicked")??);
    }
    Ok(all)
}

/// One measurement's figures.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Kill to the first ack completing more than [`IN_FLIGHT`] after it; `None` when
    /// none came.
    pub gap: Option<Duration>,
    pub acked_before: u64,
    /// Acks completing after the kill (the in-flight ones included).
    pub acked_after: u64,
    /// Refusals (SERVER_ERROR, failed publishes) after the kill.
    pub refused_after: u64,
    /// Refusals before the kill (there should be none).
    pub refused_before: u64,
    /// Kill to the last refusal after it (when the writers stopped being refused).
    pub last_refused: Option<Duration>,
}

pub fn summarize(kill_at: Instant, events: &[Event]) -> Outcome {
    let mut o = Outcome::default();
    let mut first: Option<Instant> = None;
    for e in events {
        let after = e.at > kill_at;
        match (e.acked, after) {
            (true, false) => o.acked_before += 1,
            (true, true) => o.acked_after += 1,
            (false, false) => o.refused_before += 1,
            (false, true) => {
                o.refused_after += 1;
                let d = e.at.duration_since(kill_at);
                o.last_refused = Some(o.last_refused.map_or(d, |l| l.max(d)));
            }
        }
        if e.acked && e.at > kill_at + IN_FLIGHT {
            first = Some(first.map_or(e.at, |f| f.min(e.at)));
        }
    }
    o.gap = first.map(|f| f.duration_since(kill_at));
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gap_skips_acks_in_flight_at_the_kill() {
        let k = Instant::now();
        let ms = |m: u64| k + Duration::from_millis(m);
        let ev = |at: Instant, acked: bool| Event { at, acked };
        let before = k.checked_sub(Duration::from_millis(5)).unwrap_or(k);
        let events = vec![
            ev(before, true),
            ev(ms(50), true),
            ev(ms(900), false),
            ev(ms(4200), true),
            ev(ms(3100), true),
            ev(ms(5000), true),
        ];
        let o = summarize(k, &events);
        assert_eq!(o.gap, Some(Duration::from_millis(3100)));
        assert_eq!((o.acked_after, o.refused_after), (4, 1));
        assert_eq!(o.last_refused, Some(Duration::from_millis(900)));
        assert_eq!(summarize(k, &events[..3]).gap, None);
    }
}
