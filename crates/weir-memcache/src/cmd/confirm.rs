//! `confirm QUEUE N`: confirm the N oldest leases this connection holds on the queue
//! (or `QUEUE.READER`), as after `monitor`. Asking for more than are held confirms
//! nothing and replies `CLIENT_ERROR`.

use weir_backend::Kind;

use super::ctx::{Ctx, Flow};
use super::replies::put_engine_error;
use crate::reply;
use crate::request::ReadKey;

pub async fn execute(ctx: &mut Ctx<'_>, key: ReadKey<'_>, count: u64) -> Flow {
    let held = ctx.session.leases.count(key.queue, key.reader) as u64;
    if count > held {
        ctx.out.put(reply::NOT_THAT_MANY_OPEN);
        return Flow::Continue;
    }
    for _ in 0..count {
        let Some((reader, id)) = ctx.session.leases.oldest(key.queue, key.reader) else {
            break;
        };
        match reader.confirm(&id).await {
            // NotFound: timed out or deleted, nothing left to confirm.
            Ok(_) => {}
            Err(e) if e.kind() == Kind::NotFound => {}
            Err(e) => {
                // Still held: it goes back when the connection ends.
                put_engine_error(ctx.out.replies(), &e);
                return Flow::Continue;
            }
        }
        ctx.session.leases.remove(key.queue, key.reader, &id);
    }
    ctx.out.put(reply::END);
    Flow::Continue
}
