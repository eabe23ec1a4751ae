//! `flush_all [0] [noreply]`: drop every item of every queue (queues and readers stay).

use bytes::BufMut;

use super::{blocking, put_failure, Ctx, Flow};

pub async fn execute(ctx: &mut Ctx<'_>, noreply: bool) -> Flow {
    let store = ctx.shared.store.clone();
    let result = blocking(move || {
        for name in store.queue_names() {
            if let Some(q) = store.existing_queue(&name)? {
                q.flush()?;
            }
        }
        Ok(())
    })
    .await;
    if !noreply {
        match result {
            Ok(()) => ctx.out.put_slice(b"Flushed all queues.\r\n"),
            Err(f) => put_failure(ctx.out, &f),
        }
    }
    Flow::Continue
}
