//! `shutdown`: stop the server gracefully, when `shutdown_enabled` is set in the
//! config (it is off by default: any client could otherwise stop the server).

use super::ctx::{Ctx, Flow};
use crate::reply;

pub fn execute(ctx: &mut Ctx<'_>) -> Flow {
    if !ctx.limits.shutdown_enabled {
        ctx.out.put(reply::SHUTDOWN_DISABLED);
        return Flow::Continue;
    }
    tracing::info!("shutdown requested by a client");
    ctx.shared.begin_shutdown();
    Flow::Close
}
