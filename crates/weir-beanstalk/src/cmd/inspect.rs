//! Peeks and kicks: `peek <id>`, `peek-ready`, `peek-delayed`, `peek-buried` (of the
//! used tube), `kick <bound>` (the used tube's buried jobs, or with none buried its
//! delayed ones), `kick-job <id>` (a buried or delayed job).

use weir_backend::jobs::{Job, JobState, Tube};

use crate::cmd::ctx::Ctx;
use crate::reply;

pub async fn peek(ctx: &mut Ctx<'_>, id: u64) {
    match ctx.shared.backend.find_job(id).await {
        Ok(Some(found)) => reply::found(ctx.out, id, &found.job.data),
        Ok(None) => ctx.reply(reply::NOT_FOUND),
        Err(e) => ctx.failed("peek", &e),
    }
}

/// The used tube's handle, or the failure answered.
async fn used_tube(ctx: &mut Ctx<'_>) -> Option<Tube> {
    match ctx.shared.backend.tube(&ctx.session.used.queue).await {
        Ok(tube) => Some(tube),
        Err(e) => {
            ctx.failed("tube", &e);
            None
        }
    }
}

fn found_or_not(ctx: &mut Ctx<'_>, job: Option<Job>) {
    match job {
        Some(job) => reply::found(ctx.out, job.id, &job.data),
        None => ctx.reply(reply::NOT_FOUND),
    }
}

pub async fn peek_ready(ctx: &mut Ctx<'_>) {
    let Some(tube) = used_tube(ctx).await else {
        return;
    };
    match tube.peek_ready().await {
        Ok(job) => found_or_not(ctx, job),
        Err(e) => ctx.failed("peek-ready", &e),
    }
}

/// The used tube's delayed job due first.
pub async fn peek_delayed(ctx: &mut Ctx<'_>) {
    let Some(tube) = used_tube(ctx).await else {
        return;
    };
    match tube.peek_delayed().await {
        Ok(job) => found_or_not(ctx, job),
        Err(e) => ctx.failed("peek-delayed", &e),
    }
}

pub async fn peek_buried(ctx: &mut Ctx<'_>) {
    let Some(tube) = used_tube(ctx).await else {
        return;
    };
    match tube.peek_buried().await {
        Ok(job) => found_or_not(ctx, job),
        Err(e) => ctx.failed("peek-buried", &e),
    }
}

/// `kick <bound>`: up to `bound` buried jobs of the used tube, oldest first, ready
/// again; with none buried, up to `bound` delayed jobs, earliest due first.
pub async fn kick(ctx: &mut Ctx<'_>, bound: u32) {
    let Some(tube) = used_tube(ctx).await else {
        return;
    };
    match tube.kick(u64::from(bound)).await {
        Ok(kicked) => reply::kicked_count(ctx.out, kicked),
        Err(e) => ctx.failed("kick", &e),
    }
}

pub async fn kick_job(ctx: &mut Ctx<'_>, id: u64) {
    let backend = &ctx.shared.backend;
    match backend.find_job(id).await {
        Ok(Some(found)) if matches!(found.state, JobState::Buried | JobState::Delayed) => {}
        Ok(_) => return ctx.reply(reply::NOT_FOUND),
        Err(e) => return ctx.failed("kick-job", &e),
    }
    match backend.kick_job(id).await {
        Ok(true) => ctx.reply(reply::KICKED),
        Ok(false) => ctx.reply(reply::NOT_FOUND),
        Err(e) => ctx.failed("kick-job", &e),
    }
}
