//! A new queue's first items must be stored by every replica of the stream.
//!
//! The stream uses interest retention: each replica, when it applies a message,
//! decides for itself whether one of *its* consumers wants it, and skips (never
//! stores) it if not, while the publish is still acknowledged. A consumer reads from
//! its own node's copy. A new queue's reader registers on each replica a moment after
//! its creation is acknowledged, so a `set` in that moment could be `STORED` on the
//! leader and skipped on the replica the reader is later led from: seen once in CI,
//! the first four `STORED` items of a new queue never read.
//!
//! So the stream has one more consumer from its creation on, the interest keeper
//! ([`super::layout::INTEREST_KEEPER`]): filtered on every queue's subject, it makes
//! every replica interested in every queue, whatever the timing, and never holds a
//! message back (its ack floor is past every message). The stream's setup waits until
//! every replica has the keeper ([`await_replicas`]); from then on a queue needs
//! nothing more before its first `set`.
//!
//! Before the keeper, a new queue's first `set` waited for a probe (a marked message
//! published and looked for on the new reader): readers still acknowledge and skip a
//! probe left in a stream from then ([`is_probe`]). The probe waited for the reader's
//! replicas to be current, which under a steady stream of writes could take seconds
//! (three of four connections creating a queue at once, one of them already writing,
//! saw their first `set` take over 3 s).

use std::time::Duration;

use tokio::time::Instant;

use super::errors::unavailable;
use super::Inner;
use crate::Result;

/// Marked a probe (see the module doc): readers acknowledge and skip it.
pub(crate) const PROBE_HEADER: &str = "Weir-Probe";
const PAUSE: Duration = Duration::from_millis(20);

/// Whether a delivered message is a probe.
pub(crate) fn is_probe(message: &async_nats::Message) -> bool {
    message
        .headers
        .as_ref()
        .is_some_and(|h| h.get(PROBE_HEADER).is_some())
}

/// Waits until every online replica of `consumer` has caught up with its leader.
pub(super) async fn await_replicas(inner: &Inner, consumer: &str, deadline: Instant) -> Result<()> {
    loop {
        let info = inner.consumer_info(consumer, deadline).await?;
        if info.replicas_current() {
            return Ok(());
        }
        if Instant::now() + PAUSE >= deadline {
            return Err(unavailable(format!(
                "the replicas of consumer {consumer} do not catch up"
            )));
        }
        tokio::time::sleep(PAUSE).await;
    }
}
