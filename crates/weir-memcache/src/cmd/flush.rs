//! `flush QUEUE` drops every item for every reader; `flush QUEUE.READER` for that
//! reader only. Neither creates a queue or reader that does not exist.

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
    let reader = (!key.reader.is_empty()).then_some(key.reader);
    let result = ctx.shared.backend.flush(key.queue, reader).await;
    if !noreply {
        match result {
            Ok(_) => ctx.out.put(reply::END),
            Err(e) => put_failure(ctx.out.replies(), &e.into()),
        }
    }
    Flow::Continue
}
