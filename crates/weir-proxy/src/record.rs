//! Recording: a route with `record = true` captures every request into its queue
//! `proxy:capture:ROUTE`, shadows or not, and keeps them there for `weir capture
//! export` and `weir replay`.
//!
//! What keeps them is a reader named `record` that nothing consumes: a queue keeps
//! every item some reader has not confirmed. On the embedded engine the captures stay
//! until the queue's own limits (`max_items`, `max_bytes` with
//! `discard_old_when_full`) drop the oldest; without such limits a recording grows
//! until the disk is full (the capture queue's section in the config file is where
//! they are set). On JetStream, which has no per-queue count or size limits, the
//! queue's `max_age_ms` is the bound; without it a recording keeps every capture
//! until it is dropped by hand (`flush QUEUE.record` on the memcache port) or the
//! stream's own limits refuse appends.
//!
//! A recording starts when `record` is turned on (its reader is made at the queue's
//! end, as a new shadow's is): what the shadows had not replayed then is not in it.
//!
//! Two rules keep a recording from surprising the shadows beside it: a shadow added
//! to a recording route starts at the queue's end (a new reader would otherwise start
//! at the oldest item kept, which is the whole recording; `shadow::start` asks the
//! backend for that), and a shadow cannot be named `record` ([`check`]). Removing
//! `record` from a route deletes the reader on the engine (on JetStream it is named
//! in a warning, as any reader no longer configured), after which the captures go as
//! the shadows confirm them.

use anyhow::bail;

use crate::config::RouteSettings;

/// The reader that holds a recording route's captures.
pub const RECORD_READER: &str = "record";

/// Refuses a recording route with a shadow named like the recording's reader.
pub fn check(route: &RouteSettings) -> anyhow::Result<()> {
    if route.record && route.shadows.iter().any(|s| s.name == RECORD_READER) {
        bail!(
            "proxy route {}: a shadow cannot be named {RECORD_READER:?} on a route with record = true",
            route.name
        );
    }
    Ok(())
}

/// For a route that neither records nor has shadows: forgets the `record` reader
/// its queue may still have from a recording, and only it (the readers of shadows
/// removed with the last of them keep their backlog until the queue is deleted);
/// the queue is not created. Deleted on the engine; on JetStream left in place and
/// named in a warning ([`weir_backend::Backend::forget_readers`]).
pub async fn forget(backend: &weir_backend::Backend, queue: &str) -> weir_backend::Result<()> {
    let forgotten = backend
        .forget_readers(queue, |r| r != RECORD_READER)
        .await?;
    if !forgotten.deleted.is_empty() {
        tracing::info!(
            queue,
            "deleted the reader of a recording no longer configured"
        );
    }
    crate::readers::warn_left(queue, &forgotten.left);
    Ok(())
}
