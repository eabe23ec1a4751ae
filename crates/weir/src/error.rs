//! Errors of the engine, as values a caller can act on.
//!
//! Every fallible call returns [`Result`]. [`Error::kind`] folds the variants into the
//! few kinds a front door maps onto a reply (`CLIENT_ERROR`, `NOT_STORED`,
//! `SERVER_ERROR`, ...), so callers never match on message text.

use std::io;
use std::path::PathBuf;

/// The engine's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, coarsely: the part a caller branches on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A queue or reader name outside `[A-Za-z0-9_:-]{1,100}`.
    InvalidName,
    /// An item larger than the queue's `max_item_size`.
    TooLarge,
    /// The queue is at `max_items` or `max_bytes` and refuses appends.
    Full,
    /// The queue or reader does not exist (or was deleted under this handle).
    NotFound,
    /// Another process holds the data directory.
    Locked,
    /// The disk (or quota) is full; nothing was stored, retry once space is freed.
    DiskFull,
    /// Any other I/O failure.
    Io,
    /// The store was closed.
    Closed,
    /// A caller's argument is outside what the call accepts.
    InvalidArgument,
    /// Creating the queue would pass the store's `queues_max`.
    TooManyQueues,
}

/// An engine error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    #[error("item of {size_bytes} bytes is larger than the limit of {size_bytes_max} bytes")]
    TooLarge {
        size_bytes: u64,
        size_bytes_max: u64,
    },
    #[error("queue {queue} is full")]
    Full { queue: String },
    #[error("{what} not found")]
    NotFound { what: String },
    #[error("data directory {path} is in use by another process")]
    Locked { path: PathBuf },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error("the store is closed")]
    Closed,
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("the store holds {max} queues, its most; delete one first")]
    TooManyQueues { max: usize },
}

impl Error {
    /// The coarse kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidName { .. } => ErrorKind::InvalidName,
            Error::TooLarge { .. } => ErrorKind::TooLarge,
            Error::Full { .. } => ErrorKind::Full,
            Error::NotFound { .. } => ErrorKind::NotFound,
            Error::Locked { .. } => ErrorKind::Locked,
            Error::Io { source, .. } if is_disk_full(source) => ErrorKind::DiskFull,
            Error::Io { .. } => ErrorKind::Io,
            Error::Closed => ErrorKind::Closed,
            Error::InvalidArgument(_) => ErrorKind::InvalidArgument,
            Error::TooManyQueues { .. } => ErrorKind::TooManyQueues,
        }
    }

    /// An I/O error of a front door's own (a task that died while it worked for the
    /// engine, say), as the engine reports one.
    pub fn from_io(context: impl Into<String>, source: io::Error) -> Error {
        Error::io(context, source)
    }

    /// Wraps an I/O error with what the engine was doing.
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

/// ENOSPC and EDQUOT both mean "no room": the caller may retry after freeing space.
pub(crate) fn is_disk_full(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
        || e.kind() == io::ErrorKind::StorageFull
}

/// A `map_err` adapter: an I/O error with the context `context` builds, built only
/// when the error happens.
pub(crate) fn io_err(context: impl FnOnce() -> String) -> impl FnOnce(io::Error) -> Error {
    move |e| Error::io(context(), e)
}

impl From<weir_types::InvalidName> for Error {
    fn from(e: weir_types::InvalidName) -> Error {
        Error::InvalidName {
            name: e.name,
            reason: e.reason,
        }
    }
}
