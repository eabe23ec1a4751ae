//! What a command is given: the connection's state ([`Session`]), everything it may
//! touch ([`Ctx`]), and what the connection does after it ([`Flow`]). A leaf, so that
//! the dispatch in `mod.rs` and every command use it without importing each other.

use crate::connection::Outbound;
use crate::handles::Handles;
use crate::leases::Leases;
use crate::metrics::LoopMetrics;
use crate::settings::Limits;
use crate::shared::{LimitsCopy, Shared};

/// What the connection does after a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Write what is pending, then close.
    Close,
}

/// Per-connection state that commands use.
#[derive(Default)]
pub struct Session {
    pub handles: Handles,
    pub leases: Leases,
    /// The reloadable limits this connection runs under, refreshed once per read.
    pub limits: LimitsCopy,
}

/// Everything a command may touch.
pub struct Ctx<'a> {
    pub shared: &'a Shared,
    /// The reloadable limits in force for this read's requests.
    pub limits: &'a Limits,
    pub session: &'a mut Session,
    /// The counters of the event loop this connection runs on.
    pub metrics: &'a LoopMetrics,
    /// The socket's outbound half: replies go here.
    pub out: &'a mut Outbound,
}
