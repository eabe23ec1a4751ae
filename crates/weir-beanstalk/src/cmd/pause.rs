//! `pause-tube <tube> <delay>`: no job of the tube is reserved for `delay` seconds.
//! The pause is kept in memory: a restart ends it (docs/beanstalk.md).

use std::time::Duration;

use crate::cmd::ctx::Ctx;
use crate::cmd::stats::tube_exists;
use crate::reply;
use crate::session::Named;

pub async fn pause_tube(ctx: &mut Ctx<'_>, tube: &str, delay: u32) {
    let Some(named) = Named::new(tube) else {
        return ctx.reply(reply::NOT_FOUND);
    };
    match tube_exists(ctx, &named).await {
        Ok(true) => {}
        Ok(false) => return ctx.reply(reply::NOT_FOUND),
        Err(e) => return ctx.failed("pause-tube", &e),
    }
    ctx.shared
        .pause(&named.tube, Duration::from_secs(u64::from(delay)));
    ctx.reply(reply::PAUSED);
}
