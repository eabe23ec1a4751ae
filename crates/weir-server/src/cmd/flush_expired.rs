//! `flush_expired QUEUE` / `flush_all_expired`: drop (or move to `expire_to`) expired
//! items now rather than when a reader reaches them; replies with how many. Per queue,
//! for all its readers at once: the parser refuses a reader key.

use super::{blocking, put_failure, put_u64, Ctx, Flow};

/// `queue` is `None` for `flush_all_expired`.
pub async fn execute(ctx: &mut Ctx<'_>, queue: Option<&str>) -> Flow {
    let store = ctx.shared.store.clone();
    let name = queue.map(str::to_owned);
    let result = blocking(move || {
        let queues = match name {
            Some(name) => store.existing_queue(&name)?.into_iter().collect(),
            None => store.queues(),
        };
        let mut count = 0u64;
        for q in queues {
            count += q.expire()?;
        }
        Ok(count)
    })
    .await;
    match result {
        Ok(count) => {
            put_u64(ctx.out.replies(), count);
            ctx.out.put(b"\r\n");
        }
        Err(f) => put_failure(ctx.out.replies(), &f),
    }
    Flow::Continue
}
