//! The commands, one file per group, mini-redis style: [`producer`] (`put`, `use`),
//! [`worker`] (what a holder does with its jobs, the watch list, `reserve-job`),
//! [`inspect`] (peeks and kicks), [`stats`] (the stats and list commands),
//! [`pause`] (`pause-tube`). The reserve commands wait on the socket too: the
//! connection runs them ([`crate::reserve`]), after [`execute`] says so.

pub mod inspect;
pub mod pause;
pub mod producer;
pub mod stats;
pub mod worker;

pub mod ctx;

pub use self::ctx::{error_reply, Ctx, Flow};

use std::time::Duration;

use crate::reply;
use crate::request::Request;

/// Runs one request.
pub async fn execute(ctx: &mut Ctx<'_>, request: Request<'_>) -> Flow {
    ctx.shared.counters.count(request.command());
    match request {
        Request::Put {
            pri,
            delay,
            ttr,
            data,
        } => producer::put(ctx, pri, delay, ttr, data).await,
        Request::Use { tube } => producer::use_tube(ctx, tube.as_str()),
        Request::Reserve => return Flow::Reserve(None),
        Request::ReserveWithTimeout { seconds } => {
            return Flow::Reserve(Some(Duration::from_secs(u64::from(seconds))))
        }
        Request::ReserveJob { id } => worker::reserve_job(ctx, id).await,
        Request::Delete { id } => worker::delete(ctx, id).await,
        Request::Release { id, pri, delay } => worker::release(ctx, id, pri, delay).await,
        Request::Bury { id, pri } => worker::bury(ctx, id, pri).await,
        Request::Touch { id } => worker::touch(ctx, id),
        Request::Watch { tube } => worker::watch(ctx, tube.as_str()),
        Request::Ignore { tube } => worker::ignore(ctx, tube.as_str()),
        Request::Peek { id } => inspect::peek(ctx, id).await,
        Request::PeekReady => inspect::peek_ready(ctx).await,
        Request::PeekDelayed => inspect::peek_delayed(ctx).await,
        Request::PeekBuried => inspect::peek_buried(ctx).await,
        Request::Kick { bound } => inspect::kick(ctx, bound).await,
        Request::KickJob { id } => inspect::kick_job(ctx, id).await,
        Request::StatsJob { id } => stats::stats_job(ctx, id).await,
        Request::StatsTube { tube } => stats::stats_tube(ctx, tube.as_str()).await,
        Request::Stats => stats::stats(ctx).await,
        Request::ListTubes => stats::list_tubes(ctx).await,
        Request::ListTubeUsed => {
            let used = ctx.session.used.tube.clone();
            reply::using(ctx.out, &used);
        }
        Request::ListTubesWatched => stats::list_tubes_watched(ctx),
        Request::PauseTube { tube, delay } => pause::pause_tube(ctx, tube.as_str(), delay).await,
        Request::Quit => return Flow::Close,
    }
    Flow::Continue
}
