//! A worker's commands on the jobs it holds (`delete`, `release`, `bury`, `touch`),
//! its watch list (`watch`, `ignore`), and `reserve-job`.
//!
//! A job is held by the connection that reserved it: `release`, `bury` and `touch`
//! work on held jobs only (`NOT_FOUND` otherwise, as in beanstalkd); `delete` of a
//! job not held deletes it when it is ready or buried.

use std::time::Duration;

use weir_backend::jobs::JobState;

use crate::cmd::ctx::Ctx;
use crate::names;
use crate::reply;
use crate::session::{Held, Named};
use crate::shared::Role;

/// How many ready jobs of its tube `reserve-job` passes over looking for the one it
/// names (each given back at once).
pub const RESERVE_JOB_SCAN_MAX: usize = 100;

pub async fn delete(ctx: &mut Ctx<'_>, id: u64) {
    if let Some(held) = ctx.session.held.remove(&id) {
        match held.tube.delete(&held.reserved).await {
            Ok(true) => ctx.reply(reply::DELETED),
            Ok(false) => ctx.reply(reply::NOT_FOUND),
            Err(e) => ctx.failed("delete", &e),
        }
        return;
    }
    match ctx.shared.backend.delete_job(id).await {
        Ok(true) => ctx.reply(reply::DELETED),
        Ok(false) => ctx.reply(reply::NOT_FOUND),
        Err(e) => ctx.failed("delete", &e),
    }
}

/// `release <id> <pri> <delay>`: the held job is ready again with `pri`.
pub async fn release(ctx: &mut Ctx<'_>, id: u64, pri: u32, delay: u32) {
    let Some(held) = ctx.session.held.remove(&id) else {
        ctx.reply(reply::NOT_FOUND);
        return;
    };
    let delay = Duration::from_secs(u64::from(delay));
    match held.tube.release(&held.reserved, pri, delay).await {
        Ok(true) => ctx.reply(reply::RELEASED),
        Ok(false) => ctx.reply(reply::NOT_FOUND),
        Err(e) => ctx.failed("release", &e),
    }
}

/// `bury <id> <pri>`: the held job is buried, keeping the priority it had (weir's
/// buried lane keeps each job's own; `pri` is read and not applied).
pub async fn bury(ctx: &mut Ctx<'_>, id: u64, pri: u32) {
    let _ = pri;
    let Some(held) = ctx.session.held.remove(&id) else {
        ctx.reply(reply::NOT_FOUND);
        return;
    };
    match held.tube.bury(&held.reserved).await {
        Ok(true) => ctx.reply(reply::BURIED),
        Ok(false) => ctx.reply(reply::NOT_FOUND),
        Err(e) => ctx.failed("bury", &e),
    }
}

pub fn touch(ctx: &mut Ctx<'_>, id: u64) {
    let Some(held) = ctx.session.held.get(&id) else {
        ctx.reply(reply::NOT_FOUND);
        return;
    };
    match held.tube.touch(&held.reserved) {
        Ok(true) => ctx.reply(reply::TOUCHED),
        Ok(false) => {
            ctx.session.held.remove(&id);
            ctx.reply(reply::NOT_FOUND);
        }
        Err(e) => ctx.failed("touch", &e),
    }
}

pub fn watch(ctx: &mut Ctx<'_>, tube: &str) {
    let Some(named) = Named::new(tube) else {
        ctx.reply(reply::BAD_FORMAT);
        return;
    };
    let watched = &mut ctx.session.watched;
    if !watched.contains(&named) {
        if watched.len() >= ctx.shared.settings.watched_max {
            ctx.reply(reply::OUT_OF_MEMORY);
            return;
        }
        ctx.shared.refer(&named.tube, Role::Watching, true);
        watched.push(named);
    }
    let count = watched.len() as u64;
    reply::watching(ctx.out, count);
}

pub fn ignore(ctx: &mut Ctx<'_>, tube: &str) {
    let watched = &mut ctx.session.watched;
    if let Some(at) = watched.iter().position(|n| n.tube == tube) {
        if watched.len() == 1 {
            ctx.reply(reply::NOT_IGNORED);
            return;
        }
        let named = watched.remove(at);
        ctx.shared.refer(&named.tube, Role::Watching, false);
    }
    let count = watched.len() as u64;
    reply::watching(ctx.out, count);
}

/// `reserve-job <id>`: reserves the job `id` when it is ready (a buried or delayed
/// job is kicked first). weir's backend reserves by urgency, not by id, so the job is
/// looked for among the first [`RESERVE_JOB_SCAN_MAX`] ready jobs of its tube, and
/// those passed over are given back at once (docs/beanstalk.md).
pub async fn reserve_job(ctx: &mut Ctx<'_>, id: u64) {
    if ctx.session.held.len() >= ctx.shared.settings.reserved_max {
        ctx.session.forget_ended();
        if ctx.session.held.len() >= ctx.shared.settings.reserved_max {
            ctx.reply(reply::OUT_OF_MEMORY);
            return;
        }
    }
    let backend = &ctx.shared.backend;
    let found = match backend.find_job(id).await {
        Ok(Some(found)) => found,
        Ok(None) => return ctx.reply(reply::NOT_FOUND),
        Err(e) => return ctx.failed("reserve-job", &e),
    };
    if found.state == JobState::Reserved || names::tube_of(&found.tube).is_none() {
        return ctx.reply(reply::NOT_FOUND);
    }
    if matches!(found.state, JobState::Buried | JobState::Delayed) {
        if let Err(e) = backend.kick_job(id).await {
            return ctx.failed("reserve-job", &e);
        }
    }
    let tube = match backend.tube(&found.tube).await {
        Ok(tube) => tube,
        Err(e) => return ctx.failed("reserve-job", &e),
    };
    let mut passed = Vec::new();
    let mut got = None;
    while passed.len() < RESERVE_JOB_SCAN_MAX {
        let one = std::slice::from_ref(&tube);
        match backend.reserve(one, Duration::ZERO).await {
            Ok(Some(r)) if r.job.id == id => {
                got = Some(r);
                break;
            }
            Ok(Some(r)) => passed.push(r),
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(error = %e, "beanstalk reserve-job");
                break;
            }
        }
    }
    for r in passed {
        if let Err(e) = tube.release(&r, r.job.priority, Duration::ZERO).await {
            tracing::warn!(id = r.job.id, error = %e, "beanstalk reserve-job: giving back");
        }
    }
    let Some(reserved) = got else {
        return ctx.reply(reply::NOT_FOUND);
    };
    ctx.session.mark_worker(ctx.shared);
    reply::reserved(ctx.out, id, &reserved.job.data);
    ctx.session.held.insert(id, Held { tube, reserved });
}
