//! Retention: how long a topic keeps its events once every subscriber has them.
//!
//! Each topic's queue has one reader that never takes, `Retention`. The backend keeps
//! an item until every reader is past it, so this reader's position decides what is
//! kept beyond the subscribers' needs. A janitor task moves it forward: to the
//! queue's end when `retention_ms` is 0 (a topic keeps only what some subscriber has
//! not had; with no subscriber, nothing), else to the first event younger than the
//! retention. Replay ([`crate::api`]) can move a subscriber back as far as what is
//! kept. Space is reclaimed a segment at a time, so a topic may keep somewhat more.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use weir_backend::SeekTo;

use crate::bus::Bus;
use crate::names::RETENTION_READER;

/// The janitor's period bounds: a quarter of the retention, within these.
const PERIOD_MIN: Duration = Duration::from_secs(1);
const PERIOD_MAX: Duration = Duration::from_secs(60);

/// How often the janitor runs for a retention.
pub fn period(retention: Duration) -> Duration {
    (retention / 4).clamp(PERIOD_MIN, PERIOD_MAX)
}

/// Runs until the bus shuts down.
pub async fn janitor(bus: Arc<Bus>) {
    let mut shutdown = bus.shutdown.clone();
    let mut last: HashMap<String, u64> = HashMap::new();
    let mut tick = tokio::time::interval(period(bus.settings.retention));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if bus.is_shutting_down() {
            return;
        }
        if !bus.is_active() {
            // Another instance serves the bus (on JetStream); its janitor runs.
            last.clear();
            continue;
        }
        last = advance_all(&bus, last).await;
    }
}

/// Moves every topic's retention reader; `last` is where each stood after the
/// previous run (a seek is skipped when the target has not moved). The embedded
/// backend does the file work (searches and journaled seeks) on the blocking pool.
async fn advance_all(bus: &Bus, last: HashMap<String, u64>) -> HashMap<String, u64> {
    let mut next = HashMap::new();
    let now_ms = bus.backend.now_ms();
    let retention_ms = u64::try_from(bus.settings.retention.as_millis()).unwrap_or(u64::MAX);
    for name in bus.meta().topics.keys() {
        let Some(rt) = bus.topic(name) else { continue };
        let target = if retention_ms == 0 {
            rt.queue.bounds().await.map(|(_, end)| end)
        } else {
            rt.queue
                .seq_at_time(now_ms.saturating_sub(retention_ms))
                .await
        };
        let target = match target {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(topic = %name, error = %e, "retention: could not find a position");
                continue;
            }
        };
        if last.get(name) == Some(&target) {
            next.insert(name.clone(), target);
            continue;
        }
        match rt
            .queue
            .seek_reader(RETENTION_READER, SeekTo::Seq(target))
            .await
        {
            Ok(Some(at)) => {
                next.insert(name.clone(), at);
            }
            Ok(None) => {
                // Deleted by other means (the memcache port's `delete q.r`): made again,
                // at the oldest event, and moved at the next run.
                tracing::warn!(topic = %name, "retention: the topic had no retention reader; making it again");
                let queue = crate::names::topic_queue(name);
                let made = bus
                    .backend
                    .queue_for_readers(&queue, &[RETENTION_READER], false)
                    .await;
                if let Err(e) = made {
                    tracing::warn!(topic = %name, error = %e, "retention: could not make the reader");
                }
            }
            Err(e) => {
                tracing::warn!(topic = %name, error = %e, "retention: could not move the reader")
            }
        }
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_period_is_a_quarter_of_the_retention_within_bounds() {
        assert_eq!(period(Duration::ZERO), PERIOD_MIN);
        assert_eq!(period(Duration::from_secs(20)), Duration::from_secs(5));
        assert_eq!(period(Duration::from_secs(7 * 86_400)), PERIOD_MAX);
    }
}
