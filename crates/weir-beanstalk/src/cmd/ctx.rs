//! What every command works with ([`Ctx`]), what the connection does after one
//! ([`Flow`]), and the reply for a backend failure. A leaf: the command files import
//! it, and it imports none of them.

use std::time::Duration;

use weir_backend::{Error, Kind};

use crate::reply;
use crate::session::Session;
use crate::shared::Shared;

/// What the connection does after a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Close,
    /// Reserve a job, waiting up to the timeout (`None`: without end).
    Reserve(Option<Duration>),
}

/// What a command works with.
pub struct Ctx<'a> {
    pub shared: &'a Shared,
    pub session: &'a mut Session,
    pub out: &'a mut Vec<u8>,
}

impl Ctx<'_> {
    pub fn reply(&mut self, reply: &[u8]) {
        self.out.extend_from_slice(reply);
    }

    /// Answers a backend failure: logged, and the reply beanstalkd would give for
    /// the nearest cause.
    pub fn failed(&mut self, what: &str, e: &Error) {
        tracing::warn!(error = %e, "beanstalk {what}");
        self.reply(error_reply(e));
    }
}

/// The reply for a backend failure: a store that is stopping is `DRAINING`, one out
/// of room (disk, queue, queue count, or a tube's `priorities_max`, which the
/// backend reports as an argument it cannot take) `OUT_OF_MEMORY`, anything else
/// `INTERNAL_ERROR`.
pub fn error_reply(e: &Error) -> &'static [u8] {
    match e.kind() {
        Kind::Closed => reply::DRAINING,
        Kind::Full
        | Kind::DiskFull
        | Kind::TooManyQueues
        | Kind::TooLarge
        | Kind::InvalidArgument => reply::OUT_OF_MEMORY,
        _ => reply::INTERNAL_ERROR,
    }
}
