//! `set KEY FLAGS EXPTIME BYTES [noreply]`: append one item to one or more queues.
//!
//! `a+b+c` appends the same item to each queue, in order; `KEY/sync` returns only once
//! the item is fdatasync'ed. The reply is `STORED` only when every append returned;
//! otherwise it is the reply of the first failure (`NOT_STORED` when full).

use weir_backend::{AppendOptions, Kind};

use super::ctx::{Ctx, Flow};
use super::replies::put_engine_error;
use crate::reply;
use crate::request::{expires_at_ms, WriteKey};

pub async fn execute(
    ctx: &mut Ctx<'_>,
    key: WriteKey<'_>,
    flags: u32,
    exptime: i64,
    data: &[u8],
    noreply: bool,
) -> Flow {
    let options = AppendOptions {
        flags,
        expires_at_ms: if exptime == 0 {
            0
        } else {
            expires_at_ms(exptime, ctx.shared.backend.now_ms())
        },
        sync: key.sync,
        job: None,
    };
    let mut failure = None;
    for name in key.queues() {
        if let Err(e) = append(ctx, name, data, options).await {
            failure.get_or_insert(e);
        }
    }
    if !noreply {
        match failure {
            None => ctx.out.put(reply::STORED),
            Some(e) => put_engine_error(ctx.out.replies(), &e),
        }
    }
    Flow::Continue
}

/// Appends `data` straight from the read buffer (the engine copies it into the
/// queue's mapped segment; nothing is allocated on the way).
async fn append(
    ctx: &mut Ctx<'_>,
    name: &str,
    data: &[u8],
    options: AppendOptions,
) -> weir_backend::Result<u64> {
    let backend = &ctx.shared.backend;
    let result = ctx
        .session
        .handles
        .queue(backend, name)
        .await?
        .append(data, options)
        .await;
    match result {
        // Deleted since it was cached: the next use creates it afresh (within
        // `queues_max`).
        Err(e) if e.kind() == Kind::NotFound => {
            ctx.session.handles.evict(name);
            let queue = ctx.session.handles.queue(backend, name).await?;
            queue.append(data, options).await
        }
        result => result,
    }
}
