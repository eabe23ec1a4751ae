//! Re-drive: moving the items of one queue (a dead-letter queue, typically: a
//! queue's `dead_letter_to` or `expire_to`) back to another (SQS's redrive,
//! RabbitMQ's shovel back).
//!
//! Each item is leased from the source's reader, appended to the target (durable
//! there under the target's rule before anything else happens), then confirmed at
//! the source: a crash between the two leaves the item in both (delivered twice,
//! never lost), as every move between queues does. A failed append gives the item
//! back to the source and ends the re-drive with the error. The item keeps its data,
//! flags and job settings (id, priority, ttr) and starts again at the target as a new
//! item there: no expiry of its own (the target's `max_age` counts from the move, as
//! for an item moved by `expire_to`) and a delivery count of zero. One call moves at
//! most [`REDRIVE_PER_CALL_MAX`] items and holds one lease at a time.

use weir_types::REDRIVE_PER_CALL_MAX;

use crate::error::{Error, Result};
use crate::item::AppendOptions;
use crate::store::Store;

impl Store {
    /// Moves up to `max` items (cut to [`REDRIVE_PER_CALL_MAX`]) from queue `from`,
    /// as its reader `reader` ("" the default) has them, oldest first, to queue `to`
    /// (made if missing); returns how many moved. A missing `from` moves nothing;
    /// items leased by others stay where they are.
    pub fn redrive(&self, from: &str, reader: &str, to: &str, max: u64) -> Result<u64> {
        if from == to {
            return Err(Error::InvalidArgument(format!(
                "re-drive from {from:?} to itself"
            )));
        }
        let Some(source) = self.existing_queue(from)? else {
            return Ok(0);
        };
        let reader = source.reader(reader)?;
        let target = self.queue(to)?;
        let most = max.min(REDRIVE_PER_CALL_MAX);
        let mut moved = 0;
        while moved < most {
            let Some(lease) = reader.take_leased()? else {
                break;
            };
            let options = AppendOptions {
                flags: lease.item.flags,
                expires_at_ms: 0,
                sync: false,
                job: lease.item.job,
            };
            if let Err(e) = target.append(&lease.item.data, options) {
                // The item stays at the source, for the next re-drive.
                let _ = reader.release_nowait(lease.id);
                return Err(e);
            }
            reader.confirm(lease.id)?;
            moved += 1;
        }
        Ok(moved)
    }
}
