//! What a backend failure means to a front door.
//!
//! The door turns every failure into a reply (or an HTTP status) by its [`Kind`]
//! alone, whichever backend it came from: the engine's kinds one for one, plus what
//! only a networked backend can say (unreachable, not supported).

use std::fmt;

/// What a failure means to a front door: the reply it becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A queue or reader name outside `[A-Za-z0-9_:-]{1,100}`.
    InvalidName,
    /// An item larger than the queue (or the backend) accepts.
    TooLarge,
    /// The queue is full and refuses appends.
    Full,
    /// The queue or reader does not exist (or was deleted under this handle).
    NotFound,
    /// Another process holds the data directory.
    Locked,
    /// Storage is full; nothing was stored.
    DiskFull,
    /// Any other I/O failure of the engine.
    Io,
    /// The store was closed, or the backend is shutting down.
    Closed,
    /// A caller's argument is outside what the call accepts.
    InvalidArgument,
    /// Creating the queue (or reader) would pass the configured maximum.
    TooManyQueues,
    /// The backend cannot be reached, or has no leader, after the retries. Nothing is
    /// known to have happened.
    Unavailable,
    /// This backend does not do that.
    Unsupported,
    /// A compare-and-set write found the value changed by another writer.
    Conflict,
    /// Anything else the backend reported.
    Other,
}

/// A backend failure: the engine's own error, or one of another backend.
#[derive(Debug)]
pub enum Error {
    Engine(weir::Error),
    Backend { kind: Kind, message: String },
}

impl Error {
    pub fn new(kind: Kind, message: impl Into<String>) -> Error {
        Error::Backend {
            kind,
            message: message.into(),
        }
    }

    pub fn kind(&self) -> Kind {
        match self {
            Error::Engine(e) => engine_kind(e.kind()),
            Error::Backend { kind, .. } => *kind,
        }
    }
}

fn engine_kind(kind: weir::ErrorKind) -> Kind {
    use weir::ErrorKind as E;
    match kind {
        E::InvalidName => Kind::InvalidName,
        E::TooLarge => Kind::TooLarge,
        E::Full => Kind::Full,
        E::NotFound => Kind::NotFound,
        E::Locked => Kind::Locked,
        E::DiskFull => Kind::DiskFull,
        E::Io => Kind::Io,
        E::Closed => Kind::Closed,
        E::InvalidArgument => Kind::InvalidArgument,
        E::TooManyQueues => Kind::TooManyQueues,
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Engine(e) => e.fmt(f),
            Error::Backend { message, .. } => f.write_str(message),
        }
    }
}

impl std::error::Error for Error {
    /// The engine's error's own source: an engine error is said as the engine says
    /// it (see `Display`), so it is not a source again (which would repeat its
    /// message in a chain of causes, such as `{:#}` of an `anyhow::Error`).
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Engine(e) => e.source(),
            Error::Backend { .. } => None,
        }
    }
}

impl From<weir_types::InvalidName> for Error {
    /// A name refused by the rule every backend shares; said as the engine says it.
    fn from(e: weir_types::InvalidName) -> Error {
        Error::new(Kind::InvalidName, e.to_string())
    }
}

impl From<weir::Error> for Error {
    #[inline]
    fn from(e: weir::Error) -> Error {
        Error::Engine(e)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn an_engine_error_is_said_once_in_a_chain_of_causes() {
        let io = std::io::Error::other("the disk said no");
        let e = Error::from(weir::Error::from_io("writing", io));
        assert_eq!(e.to_string(), "writing: the disk said no");
        let mut chain = vec![e.to_string()];
        let mut cause = e.source();
        while let Some(c) = cause {
            chain.push(c.to_string());
            cause = c.source();
        }
        assert_eq!(chain, ["writing: the disk said no", "the disk said no"]);
    }
}
