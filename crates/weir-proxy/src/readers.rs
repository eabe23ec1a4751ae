//! The readers of a capture queue that the config no longer wants: a shadow removed
//! (or a change of mode, or `record` turned off) leaves a reader nobody reads, which
//! keeps every capture. The backend forgets them: deleted on the embedded engine,
//! left in place on JetStream (where another proxy of a rolling deploy may still
//! read them) and named in a warning for the operator.

use weir_backend::Backend;

/// The readers of `queue` not in `wanted`: a shadow removed (or a change of mode)
/// leaves a reader nobody reads, which keeps every capture. The backend forgets them
/// ([`Backend::forget_readers`]): on the embedded engine it deletes them (one proxy
/// owns the data directory); on JetStream several proxies share the queue, and one
/// still running an older config (a rolling deploy) may read them, so they are left
/// in place and named here in a warning, for the operator to delete (`delete
/// QUEUE.READER` on the memcache port) once no proxy replays to them. Best effort on
/// a store that may be out of reach (JetStream, where nothing is deleted anyway): a
/// cluster that cannot be asked is no reason to stop the proxy.
pub async fn forget_readers(
    backend: &Backend,
    queue: &str,
    wanted: &[&str],
) -> weir_backend::Result<()> {
    let forgotten = match backend.forget_readers(queue, |r| wanted.contains(&r)).await {
        Ok(forgotten) => forgotten,
        Err(e) if backend.may_be_unreachable() => {
            tracing::warn!(queue, error = %e, "could not look for readers of shadows no longer configured");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    for old in &forgotten.deleted {
        tracing::info!(queue, reader = %old, "deleted the reader of a shadow no longer configured");
    }
    warn_left(queue, &forgotten.left);
    Ok(())
}

/// Names the readers of a capture queue the backend left in place (JetStream) though
/// this proxy's config does not want them.
pub(crate) fn warn_left(queue: &str, left: &[String]) {
    for old in left {
        if old.is_empty() {
            tracing::warn!(
                queue,
                remove = "its consumer QUEUE~, with the nats tools",
                "the capture queue has a default reader, which keeps every capture"
            );
        } else {
            tracing::warn!(queue, reader = %old, delete = "QUEUE+READER on the memcache port, once no proxy replays to it", "a reader of the capture queue is no shadow of this proxy's config: it keeps every capture");
        }
    }
}
