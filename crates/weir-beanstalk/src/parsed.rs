//! What the parser says about the front of a read buffer: a request and its length,
//! more bytes needed, or a refusal saying what to drop, what to reply and whether to
//! close. Its own file so that [`crate::parse`](mod@crate::parse) and [`crate::put`], which both
//! answer with it, need not import each other.

use crate::request::Request;

/// How to refuse what the parser saw: drop `consumed` bytes now, then
/// `discard_bytes` more and then, if `skip_line`, everything through the next `\r\n`
/// (bytes that may not have arrived yet); once that is dropped, write `reply`, and
/// close if `close`. beanstalkd writes the reply only then (`JOB_TOO_BIG` after the
/// body, `BAD_FORMAT` of a long line at its end): a door that does the same sends
/// nothing for a request the client has not finished sending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The full reply, `\r\n` included.
    pub reply: &'static [u8],
    /// Bytes of the buffer to drop now: at least 1, at most the buffer's length.
    pub consumed: usize,
    /// Bytes still to drop after `consumed`: the body of a refused `put`, its `\r\n`
    /// included, which may be partly or not yet in the buffer.
    pub discard_bytes: u64,
    /// Drop everything up to and including the next `\r\n` (a line too long whose end
    /// has not arrived). `consumed` then stops short of a final `\r`, so the `\r\n`
    /// is whole in what follows.
    pub skip_line: bool,
    /// The stream cannot be trusted any more: reply, then close the connection.
    pub close: bool,
}

impl Refusal {
    /// A refusal of the first `consumed` bytes, nothing more to drop.
    pub fn new(consumed: usize, reply: &'static [u8]) -> Refusal {
        Refusal {
            reply,
            consumed,
            discard_bytes: 0,
            skip_line: false,
            close: false,
        }
    }
}

/// What [`parse`](crate::parse::parse) found at the front of the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// A request, spanning the first `consumed` bytes.
    Complete {
        request: Request<'a>,
        consumed: usize,
    },
    /// Not a complete request yet: read more and parse again.
    Incomplete,
    Refused(Refusal),
}
