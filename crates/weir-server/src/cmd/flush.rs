//! `flush QUEUE` drops every item for every reader; `flush QUEUE.READER` for that
//! reader only. Neither creates a queue or reader that does not exist.

use super::{blocking, put_failure, Ctx, Flow};
use crate::reply;
use crate::request::ReadKey;

pub async fn execute(ctx: &mut Ctx<'_>, key: ReadKey<'_>, noreply: bool) -> Flow {
    let store = ctx.shared.store.clone();
    let queue = key.queue.to_owned();
    let reader = key.reader.to_owned();
    let result = blocking(move || {
        let Some(q) = store.existing_queue(&queue)? else {
            return Ok(0);
        };
        if reader.is_empty() {
            q.flush()
        } else if q.reader_names().contains(&reader) {
            q.reader(&reader)?.flush()
        } else {
            Ok(0)
        }
    })
    .await;
    if !noreply {
        match result {
            Ok(_) => ctx.out.put(reply::END),
            Err(f) => put_failure(ctx.out.replies(), &f),
        }
    }
    Flow::Continue
}
