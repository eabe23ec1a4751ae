//! # weir-beanstalk: the beanstalkd door of weir
//!
//! Serves the protocol of beanstalkd 1.12 as Debian ships it (`weir serve
//! --beanstalk-listen ADDR`, `docs/beanstalk.md`) over a `weir_backend::Backend`'s
//! tubes of jobs (`weir_backend::jobs`), and only through it.
//!
//! Layout, after the memcache door (`weir-memcache`) and tokio's mini-redis:
//! [`parse`](mod@parse) finds one request at the front of a read buffer, or says that
//! more bytes are needed, or how to refuse what it sees (pure, never allocates, never
//! consumes: the caller drops what it says); [`parsed`] is what it says; [`command`]
//! finds the command word the way beanstalkd does; [`request`] holds the requests and
//! the syntax of their arguments; [`put`] frames a job body; [`reply`] spells every
//! reply. How closely this follows beanstalkd was measured against the real server
//! (`scripts/beanstalk-reference`, `tests/reference.rs`). Over that:
//! [`door`] accepts and stops, [`connection`] owns a socket, its buffers and the
//! framing state between reads, [`cmd`] has one file per group of commands,
//! [`reserve`] the one command that waits, [`session`] a connection's tubes and
//! held jobs, [`shared`] what connections share, [`names`] maps tube names to weir
//! queue names, [`settings`] is the `[beanstalk]` config section.

#![forbid(unsafe_code)]

pub mod cmd;
pub mod command;
pub mod connection;
pub mod door;
pub mod names;
pub mod parse;
pub mod parsed;
pub mod put;
pub mod reply;
pub mod request;
pub mod reserve;
pub mod session;
pub mod settings;
pub mod shared;

pub use crate::command::Command;
pub use crate::door::{BeanstalkDoor, BoundListener};
pub use crate::parse::{parse, ParseLimits, Parsed, Refusal};
pub use crate::request::{Request, Tube};
pub use crate::settings::{BeanstalkConfig, BeanstalkSettings};
