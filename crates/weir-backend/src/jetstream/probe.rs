//! Probes: empty messages with the `Weir-Probe` header that builds on interest
//! retention published to a new queue's subject, to see that the stream stored for
//! its first reader. The stream now keeps every item until a sweep removes what every
//! reader confirmed (`sweep.rs`), so nothing is probed any more; a probe left in a
//! stream by such a build (each carried a 60 s `Nats-TTL`) is acknowledged and
//! skipped by readers, walks and peeks.

/// Marks a probe.
pub(crate) const PROBE_HEADER: &str = "Weir-Probe";

/// Whether a delivered message is a probe.
pub(crate) fn is_probe(message: &async_nats::Message) -> bool {
    message
        .headers
        .as_ref()
        .is_some_and(|h| h.get(PROBE_HEADER).is_some())
}
