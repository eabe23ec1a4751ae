//! What a queue kept for its readers is given
//! ([`Backend::queue_for_readers`](crate::Backend::queue_for_readers)): checked the
//! same way on both backends, before anything is created.

use crate::error::{Error, Kind, Result};

/// What [`Backend::queue_for_readers`](crate::Backend::queue_for_readers) wants: at
/// least one reader, each named (the default reader `""` is not one of them).
pub(crate) fn check_readers_named(readers: &[&str]) -> Result<()> {
    if readers.is_empty() || readers.iter().any(|r| r.is_empty()) {
        return Err(Error::new(
            Kind::InvalidArgument,
            "a queue kept for its readers names at least one, and each of them (no default reader)",
        ));
    }
    Ok(())
}
