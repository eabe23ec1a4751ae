//! `flush_expired QUEUE` / `flush_all_expired`: drop (or move to `expire_to`) expired
//! items now rather than when a reader reaches them; replies with how many. Per queue,
//! for all its readers at once: the parser refuses a reader key.

use super::ctx::{Ctx, Flow};
use super::replies::{put_failure, put_u64};

/// `queue` is `None` for `flush_all_expired`.
pub async fn execute(ctx: &mut Ctx<'_>, queue: Option<&str>) -> Flow {
    let result = ctx.shared.backend.expire(queue).await;
    match result {
        Ok(count) => {
            put_u64(ctx.out.replies(), count);
            ctx.out.put(b"\r\n");
        }
        Err(e) => put_failure(ctx.out.replies(), &e.into()),
    }
    Flow::Continue
}
