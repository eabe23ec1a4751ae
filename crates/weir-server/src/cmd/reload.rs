//! `reload`: re-read the config file and apply the queue settings and the reloadable
//! server limits at once. A file that fails to parse changes nothing.

use bytes::BufMut;

use super::{put_server_error, Ctx, Flow};
use crate::config;

pub async fn execute(ctx: &mut Ctx<'_>) -> Flow {
    let Some(path) = ctx.shared.config_path.clone() else {
        ctx.out.put_slice(b"Reloaded config.\r\n");
        return Flow::Continue;
    };
    let store = ctx.shared.store.clone();
    let result = tokio::task::spawn_blocking(move || -> anyhow::Result<config::Limits> {
        let file = config::read_file(&path)?;
        let limits = config::resolve_limits(&file.server)?;
        let options = config::store_options(&file)?;
        store.set_options(options);
        Ok(limits)
    })
    .await;
    match result {
        Ok(Ok(limits)) => {
            ctx.shared.limits.set(limits);
            ctx.shared.queues.set_max(limits.max_queues);
            tracing::info!(?limits, "reloaded config");
            ctx.out.put_slice(b"Reloaded config.\r\n");
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %format!("{e:#}"), "reload failed");
            put_server_error(ctx.out, &format!("reload failed: {e:#}"));
        }
        Err(e) => put_server_error(ctx.out, &format!("reload failed: {e}")),
    }
    Flow::Continue
}
