//! # weir-beanstalk: the beanstalkd protocol for weir
//!
//! The first layer of weir's beanstalkd door (`weir serve --beanstalk-listen ADDR`,
//! still to come): the protocol of beanstalkd 1.12 as Debian ships it, turned from
//! bytes into requests and from results back into bytes. No socket, no storage and no
//! runtime here: the door that reads connections and the job semantics (priorities,
//! delays, reservations, burying) are built on top, separately.
//!
//! Layout, after the memcache door (`weir-memcache`): [`parse`](mod@parse) finds one
//! request at the front of a read buffer, or says that more bytes are needed, or how
//! to refuse what it sees (pure, never allocates, never consumes: the caller drops
//! what it says); [`parsed`] is what it says; [`command`] finds the command word the
//! way beanstalkd does; [`request`] holds the requests and the syntax of their
//! arguments; [`put`] frames a job body; [`reply`] spells every reply. How closely
//! this follows beanstalkd was measured against the real server
//! (`scripts/beanstalk-reference`, `tests/reference.rs`); where weir differs on
//! purpose, `docs/beanstalk.md` says so.

#![forbid(unsafe_code)]

pub mod command;
pub mod parse;
pub mod parsed;
pub mod put;
pub mod reply;
pub mod request;

pub use crate::command::Command;
pub use crate::parse::{parse, ParseLimits, Parsed, Refusal};
pub use crate::request::{Request, Tube};
