//! `flush_all [0] [noreply]`: drop every item of every queue (queues and readers stay)
//! but the bus's and the proxy's (`bus:*`, `proxy:capture:*`).
//!
//! Replies `OK`, what every memcache client's flush call expects (Node's `memcached`,
//! gomemcache, pymemcache, python-memcached, spymemcached, xmemcached); Kestrel
//! replied `Flushed all queues.`, which breaks them all, and is there for clients
//! written against Kestrel with `flush_all_reply = "kestrel"`.

use super::ctx::{Ctx, Flow};
use super::replies::put_failure;
use crate::reply;

pub async fn execute(ctx: &mut Ctx<'_>, noreply: bool) -> Flow {
    // The bus's and the proxy's queues are theirs: never flushed from here.
    let result = ctx
        .shared
        .backend
        .flush_all(crate::request::is_reserved)
        .await;
    if !noreply {
        match result {
            Ok(()) if ctx.limits.flush_all_kestrel => ctx.out.put(reply::FLUSHED_ALL_KESTREL),
            Ok(()) => ctx.out.put(reply::OK),
            Err(e) => put_failure(ctx.out.replies(), &e.into()),
        }
    }
    Flow::Continue
}
