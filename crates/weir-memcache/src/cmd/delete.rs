//! `delete QUEUE` / `delete QUEUE.READER`: remove a queue (items, readers, files) or
//! one reader (its position and leases).
//!
//! Replies `DELETED` whether or not it existed, as Kestrel's last release does:
//! xmemcached's Kestrel mode accepts nothing else (it closes the connection on
//! `NOT_FOUND`), and a queue that is gone is what the client asked for either way.

use super::ctx::{Ctx, Flow};
use super::replies::put_failure;
use crate::reply;
use crate::request::{is_reserved, ReadKey};

pub async fn execute(ctx: &mut Ctx<'_>, key: ReadKey<'_>, noreply: bool) -> Flow {
    if is_reserved(key.queue) && !ctx.limits.reserved_queues_writable {
        // The bus and the proxy own these: a delete from here broke every publish to
        // the topic until a restart.
        if !noreply {
            ctx.out.put(reply::RESERVED_QUEUE);
        }
        return Flow::Continue;
    }
    let backend = &ctx.shared.backend;
    let result = if key.reader.is_empty() {
        let r = backend.delete_queue(key.queue).await;
        ctx.session.handles.evict(key.queue);
        ctx.session.leases.forget(key.queue, None);
        r
    } else {
        let r = backend.delete_reader(key.queue, key.reader).await;
        ctx.session.handles.evict_reader(key.queue, key.reader);
        ctx.session.leases.forget(key.queue, Some(key.reader));
        r
    };
    if !noreply {
        match result {
            Ok(_) => ctx.out.put(reply::DELETED),
            Err(e) => put_failure(ctx.out.replies(), &e.into()),
        }
    }
    Flow::Continue
}
