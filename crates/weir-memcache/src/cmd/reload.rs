//! `reload`: re-read the config file (through the root's [`crate::Reload`]) and apply the queue settings and the reloadable
//! server limits at once. A file that fails to parse changes nothing.

use super::ctx::{Ctx, Flow};
use super::replies::put_server_error;
use crate::reply;

pub async fn execute(ctx: &mut Ctx<'_>) -> Flow {
    let Some(reload) = ctx.shared.reload.clone() else {
        ctx.out.put(reply::RELOADED);
        return Flow::Continue;
    };
    let files_open_max = ctx.shared.settings.files_open_max;
    let parsed = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let (limits, mut options) = reload()?;
        // Derived at start from restart-only settings: kept as it was.
        options.files_open_max = files_open_max;
        Ok((limits, options))
    })
    .await;
    let result = match parsed {
        Ok(Ok((limits, options))) => match ctx.shared.backend.set_options(options).await {
            Ok(()) => Ok(Ok(limits)),
            Err(e) => Ok(Err(anyhow::Error::new(e))),
        },
        Ok(Err(e)) => Ok(Err(e)),
        Err(e) => Err(e),
    };
    match result {
        Ok(Ok(limits)) => {
            ctx.shared.limits.set(limits);
            tracing::info!(?limits, "reloaded config");
            ctx.out.put(reply::RELOADED);
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %format!("{e:#}"), "reload failed");
            put_server_error(ctx.out.replies(), &format!("reload failed: {e:#}"));
        }
        Err(e) => put_server_error(ctx.out.replies(), &format!("reload failed: {e}")),
    }
    Flow::Continue
}
