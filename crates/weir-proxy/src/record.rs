//! Recording: a route with `record = true` captures every request into its queue
//! `proxy:capture:ROUTE`, shadows or not, and keeps them there for `weir capture
//! export` and `weir replay`.
//!
//! What keeps them is a reader named `record` that nothing consumes: the engine keeps
//! every item some reader has not confirmed, so the captures stay until the queue's
//! own limits (`max_items`, `max_bytes` with `discard_old_when_full`) drop the
//! oldest. Without such limits a recording grows until the disk is full; the
//! capture queue's section in the config file is where they are set.
//!
//! Two rules keep a recording from surprising the shadows beside it: a shadow added
//! to a recording route starts at the queue's end (a new reader would otherwise start
//! at the oldest item kept, which is the whole recording), and a shadow cannot be
//! named `record`. Removing `record` from a route deletes the reader, after which the
//! captures go as the shadows confirm them.

use anyhow::{bail, Context};

use crate::config::RouteSettings;
use crate::shadow::SEQUENTIAL_READER;

/// The reader that holds a recording route's captures.
pub const RECORD_READER: &str = "record";

/// Sets up the readers of a recording route's open capture queue, before its
/// shadows start: new shadow readers at the end, the `record` reader, and, with no
/// shadow at all, no reader but `record`.
pub fn prepare(queue: &weir::Queue, route: &RouteSettings) -> anyhow::Result<()> {
    if !route.record {
        return Ok(());
    }
    if route.shadows.iter().any(|s| s.name == RECORD_READER) {
        bail!(
            "proxy route {}: a shadow cannot be named {RECORD_READER:?} on a route with record = true",
            route.name
        );
    }
    let context = || format!("setting up the recording of route {}", route.name);
    let wanted: Vec<&str> = if route.shadows.is_empty() {
        Vec::new()
    } else if route.sequential {
        vec![SEQUENTIAL_READER]
    } else {
        route.shadows.iter().map(|s| s.name.as_str()).collect()
    };
    let (_, next) = queue.seq_bounds().with_context(context)?;
    for name in &wanted {
        if !queue.has_reader(name) {
            queue
                .reader(name)
                .and_then(|r| r.seek(next))
                .with_context(context)?;
        }
    }
    queue.reader(RECORD_READER).with_context(context)?;
    for old in queue.reader_names() {
        if old != RECORD_READER && !wanted.contains(&old.as_str()) {
            tracing::info!(queue = queue.name(), reader = %old, "deleting the reader of a shadow no longer configured");
            queue.delete_reader(&old).with_context(context)?;
        }
    }
    Ok(())
}

/// For a route that neither records nor has shadows: deletes the `record` reader
/// its queue may still have from a recording (the queue is not created).
pub fn forget(store: &weir::Store, queue: &str) -> weir::Result<()> {
    if let Some(q) = store.existing_queue(queue)? {
        if q.delete_reader(RECORD_READER)? {
            tracing::info!(
                queue,
                "deleted the reader of a recording no longer configured"
            );
        }
    }
    Ok(())
}
