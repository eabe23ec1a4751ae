//! `put` and `use`: a producer's commands.

use std::time::Duration;

use crate::cmd::ctx::Ctx;
use crate::reply;
use crate::session::Named;
use crate::shared::Role;

/// `put <pri> <delay> <ttr> <bytes>`: stores the job in the used tube. A ttr of 0 is
/// 1 second, as in beanstalkd. `INSERTED <id>` means the job is stored under its
/// queue's durability rule (docs/beanstalk.md).
pub async fn put(ctx: &mut Ctx<'_>, pri: u32, delay: u32, ttr: u32, data: &[u8]) {
    if ctx.shared.is_stopping() {
        ctx.reply(reply::DRAINING);
        return;
    }
    ctx.session.mark_producer(ctx.shared);
    let ttr = Duration::from_secs(u64::from(ttr.max(1)));
    let tube = match ctx.shared.backend.tube(&ctx.session.used.queue).await {
        Ok(tube) => tube,
        Err(e) => return ctx.failed("put", &e),
    };
    let delay = Duration::from_secs(u64::from(delay));
    match tube.put(data, pri, ttr, delay).await {
        Ok(id) => reply::inserted(ctx.out, id),
        Err(e) => ctx.failed("put", &e),
    }
}

/// `use <tube>`: later puts go to `tube`.
pub fn use_tube(ctx: &mut Ctx<'_>, tube: &str) {
    let Some(named) = Named::new(tube) else {
        ctx.reply(reply::BAD_FORMAT);
        return;
    };
    ctx.shared.refer(&named.tube, Role::Using, true);
    let old = std::mem::replace(&mut ctx.session.used, named);
    ctx.shared.refer(&old.tube, Role::Using, false);
    reply::using(ctx.out, tube);
}
