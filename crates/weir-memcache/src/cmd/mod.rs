//! The commands: one file each, each applying one parsed request to the store and
//! appending its reply to the connection's output.
//!
//! A command is given the connection's outbound half
//! ([`crate::connection::Outbound`]): it appends its reply there. It writes to the socket itself only where the protocol streams
//! (`monitor`) or is about to wait (`get` with `t=MS`), and then through the same
//! half, so replies stay in order.

pub mod confirm;
pub mod delete;
pub mod dump_stats;
pub mod flush;
pub mod flush_all;
pub mod flush_expired;
pub mod get;
pub mod monitor;
pub mod quit;
pub mod reload;
pub mod set;
pub mod shutdown;
pub mod stats;
pub mod version;

mod ctx;
mod replies;
mod wait;

pub use ctx::{Ctx, Flow, Session};

use crate::parse::Request;

pub async fn execute(request: Request<'_>, ctx: &mut Ctx<'_>) -> Flow {
    match request {
        Request::Set {
            key,
            flags,
            exptime,
            data,
            noreply,
        } => set::execute(ctx, key, flags, exptime, data, noreply).await,
        Request::Get { keys, cas } => get::execute(ctx, keys, cas).await,
        Request::Delete { key, noreply } => delete::execute(ctx, key, noreply).await,
        Request::Flush { key, noreply } => flush::execute(ctx, key, noreply).await,
        Request::FlushAll { noreply } => flush_all::execute(ctx, noreply).await,
        Request::FlushExpired { queue } => flush_expired::execute(ctx, Some(queue)).await,
        Request::FlushAllExpired => flush_expired::execute(ctx, None).await,
        Request::Stats => stats::execute(ctx).await,
        Request::StatsSettings => stats::settings(ctx),
        Request::StatsReset => stats::reset(ctx),
        Request::DumpStats { names } => dump_stats::execute(ctx, names).await,
        Request::Monitor {
            key,
            seconds,
            items_max,
        } => monitor::execute(ctx, key, seconds, items_max).await,
        Request::Confirm { key, count } => confirm::execute(ctx, key, count).await,
        Request::Version => version::execute(ctx),
        Request::Reload => reload::execute(ctx).await,
        Request::Shutdown => shutdown::execute(ctx),
        Request::Quit => quit::execute(ctx),
    }
}
