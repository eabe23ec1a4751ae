//! Re-drives: `POST /proxy/dead-letters/ROUTE/SHADOW/redrive` on weir's HTTP port
//! replays the dead letters a shadow had when it began (`dead.rs` keeps them),
//! oldest first and one at a time, as new replays (`shadow.rs`: attempts counted
//! afresh; in sequential mode to that shadow and the ones after it). Each is
//! confirmed once delivered, or once dead-lettered again (then at the queue's end,
//! not re-driven twice in one run). One re-drive runs per shadow at a time; a stop
//! of the proxy leaves the one in flight in the queue.

use std::sync::Arc;
use std::time::Duration;

use weir_backend::{Reader, TakeMode};

use crate::capture::Captured;
use crate::dead::RedriveError;
use crate::shadow::LiveShadow;

/// Starts a re-drive of `chain[0]`'s dead letters (to `chain`: the shadow and, in
/// sequential mode, the ones after it) on the current runtime; the number of dead
/// letters it will replay.
pub async fn redrive(chain: Vec<Arc<LiveShadow>>) -> Result<u64, RedriveError> {
    let Some(first) = chain.first().cloned() else {
        return Ok(0);
    };
    let (reader, end, count) = first.dead.begin_redrive().await?;
    tokio::spawn(async move {
        run_redrive(&chain, &reader, end).await;
        first.dead.end_redrive();
    });
    Ok(count)
}

/// Replays the dead letters below sequence number `end`, one at a time.
async fn run_redrive(chain: &[Arc<LiveShadow>], reader: &Reader, end: u64) {
    let first = &chain[0];
    let mut shutdown = first.shutdown.clone();
    let mut done = 0u64;
    loop {
        let taken = tokio::select! {
            t = reader.take(TakeMode::Lease, Duration::ZERO) => t,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        let taken = match taken {
            Ok(Some(t)) => t,
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(queue = first.dead.queue_name(), error = %e, "a re-drive could not take a dead letter; it stops");
                break;
            }
        };
        let Some(lease) = taken.lease else { break };
        if taken.item.seq >= end {
            let _ = reader.release(&lease);
            break;
        }
        let confirm = match Captured::decode(&taken.item.data) {
            Ok(c) => crate::shadow::replay_all(chain, &c, &first.shutdown).await,
            Err(e) => {
                tracing::warn!(
                    queue = first.dead.queue_name(),
                    seq = taken.item.seq,
                    "dropping a damaged dead letter: {e}"
                );
                true
            }
        };
        if !confirm {
            let _ = reader.release(&lease);
            break;
        }
        let _ = reader.confirm(&lease).await;
        done += 1;
    }
    tracing::info!(route = %first.route, shadow = %first.settings.name, replayed = done, "a re-drive of dead letters ended");
}
