//! Re-drive: moving the items of one queue (a dead-letter queue, typically: a
//! queue's `dead_letter_to` or `expire_to`) back to another, on either backend (SQS's
//! redrive, RabbitMQ's shovel back), with the engine's rules (`weir::Store::redrive`):
//! each item leased at the source, appended to the target (durable there under the
//! target's rule), then confirmed at the source, so a crash between the two leaves it
//! in both (delivered twice, never lost); a failed append gives it back and ends the
//! re-drive with the error; it keeps its data, flags and job settings and starts
//! afresh at the target (no expiry of its own, a delivery count of zero); at most
//! [`crate::REDRIVE_PER_CALL_MAX`] items a call, one lease at a time.
//!
//! On the engine it is the engine's own, on tokio's blocking pool (it appends and
//! fsyncs as it goes); on JetStream the same steps through this interface's
//! operations.

#[cfg(feature = "jetstream")]
use std::time::Duration;

#[cfg(feature = "jetstream")]
use weir_types::{AppendOptions, TakeMode, REDRIVE_PER_CALL_MAX};

use crate::embedded::blocking;
use crate::{Backend, Error, Kind, Result};

impl Backend {
    /// Moves up to `max` items (cut to [`crate::REDRIVE_PER_CALL_MAX`]) from queue `from`,
    /// as its reader `reader` ("" the default) has them, oldest first, to queue `to`
    /// (made if missing); returns how many moved. A missing `from` moves nothing (on
    /// JetStream it is made, empty).
    /// Items leased by others stay where they are; the re-drive stops at the first
    /// moment `from`'s reader has nothing to hand out.
    pub async fn redrive(&self, from: &str, reader: &str, to: &str, max: u64) -> Result<u64> {
        if from == to {
            return Err(Error::new(
                Kind::InvalidArgument,
                format!("re-drive from {from:?} to itself"),
            ));
        }
        match self {
            Backend::Embedded(e) => {
                let store = e.store().clone();
                let (from, reader, to) = (from.to_string(), reader.to_string(), to.to_string());
                blocking(move || store.redrive(&from, &reader, &to, max)).await
            }
            #[cfg(feature = "jetstream")]
            Backend::JetStream(_) => self.redrive_by_steps(from, reader, to, max).await,
        }
    }

    /// [`Backend::redrive`] through this interface's own operations. The source is
    /// opened, not looked up: this instance's registry knows only the queues it used,
    /// and a dead-letter queue is filled by whichever instance took the item (a
    /// missing one is made, empty, and moves nothing).
    #[cfg(feature = "jetstream")]
    async fn redrive_by_steps(&self, from: &str, reader: &str, to: &str, max: u64) -> Result<u64> {
        let source = self.queue(from).await?;
        let reader = self.reader(&source, reader).await?;
        let target = self.queue(to).await?;
        let most = max.min(REDRIVE_PER_CALL_MAX);
        let mut moved = 0;
        while moved < most {
            let Some(taken) = reader.take(TakeMode::Lease, Duration::ZERO).await? else {
                break;
            };
            let Some(lease) = taken.lease.as_ref() else {
                return Err(Error::new(
                    Kind::Other,
                    format!("re-drive: a lease of {from:?} came without its lease"),
                ));
            };
            let options = AppendOptions {
                flags: taken.item.flags,
                expires_at_ms: 0,
                sync: false,
                job: taken.item.job,
            };
            if let Err(e) = target.append(&taken.item.data, options).await {
                // The item stays at the source, for the next re-drive.
                let _ = reader.release(lease);
                return Err(e);
            }
            reader.confirm(lease).await?;
            moved += 1;
        }
        Ok(moved)
    }
}
