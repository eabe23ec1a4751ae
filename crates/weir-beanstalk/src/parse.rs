//! The request parser: bytes in, one [`Request`](crate::request::Request) (or a refusal) out.
//!
//! [`parse`] is a pure function over a connection's read buffer. It never allocates
//! and never consumes anything itself: it says how many bytes a complete request spans
//! (`consumed`), or that more bytes are needed, or how to refuse what it sees. That
//! keeps framing decisions in one place, lets a door parse every complete request of
//! a read before writing once, and lets proptests drive it with arbitrary bytes.
//!
//! Framing, as beanstalkd 1.12 frames (measured: `tests/reference/replies.txt`):
//!
//! - A line ends in `\r\n`, and only there: a bare `\n` is no line end, so a line
//!   ended by one waits for more bytes, as beanstalkd does. A `\r` without its `\n`
//!   is a byte of the line like any other (beanstalkd instead stops looking for the
//!   line's end and waits for 224 bytes; `docs/beanstalk.md`).
//! - A line may be [`ParseLimits::line_bytes_max`] bytes long, its `\r\n` included
//!   (beanstalkd's `LINE_BUF_SIZE`, 224). When that many bytes hold no line end, the
//!   line is too long: `BAD_FORMAT`, and everything up to and including the next
//!   `\r\n` is dropped, whenever it comes; the connection stays open. (beanstalkd
//!   misses a `\r\n` whose `\r` is the 224th byte and drops the next line too; weir
//!   ends the long line there.)
//! - A line holding a NUL byte is `BAD_FORMAT`; a line that starts with no command's
//!   spelling ([`crate::command`]) is `UNKNOWN_COMMAND` (an empty line too).
//! - A `put` is framed by [`crate::put`]: its body is taken by its byte count, never
//!   looked at, so whatever it holds is never run as a command.
//!
//! Nothing the parser refuses closes the connection, except a `put` line whose body
//! cannot be found (no byte count on it): then the stream can no longer be trusted.

use crate::command::Command;
pub use crate::parsed::{Parsed, Refusal};
use crate::put;
use crate::reply;
use crate::request::parse_arguments;

/// beanstalkd's `LINE_BUF_SIZE`: the longest request line, `\r\n` included.
pub const LINE_BYTES_MAX_DEFAULT: usize = 224;
/// beanstalkd's default job size limit (`-z`): the largest job body, in bytes.
pub const JOB_BYTES_MAX_DEFAULT: u32 = 65_535;
/// beanstalkd's longest tube name (`MAX_TUBE_NAME_LEN - 1`).
pub const TUBE_BYTES_MAX_DEFAULT: usize = 200;

/// The limits the parser enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseLimits {
    /// Longest request line, in bytes, its `\r\n` included.
    pub line_bytes_max: usize,
    /// Largest job body a `put` may carry, in bytes (its `\r\n` not included).
    pub job_bytes_max: u32,
    /// Longest tube name, in bytes.
    pub tube_bytes_max: usize,
}

impl Default for ParseLimits {
    fn default() -> Self {
        ParseLimits {
            line_bytes_max: LINE_BYTES_MAX_DEFAULT,
            job_bytes_max: JOB_BYTES_MAX_DEFAULT,
            tube_bytes_max: TUBE_BYTES_MAX_DEFAULT,
        }
    }
}

/// Parses the request at the front of `buf`.
pub fn parse<'a>(buf: &'a [u8], limits: &ParseLimits) -> Parsed<'a> {
    let Some(line_end) = find_line_end(buf, limits.line_bytes_max) else {
        return unterminated(buf, limits.line_bytes_max);
    };
    let line = &buf[..line_end];
    let consumed = line_end + 2;
    if memchr::memchr(0, line).is_some() {
        return Parsed::Refused(Refusal::new(consumed, reply::BAD_FORMAT));
    }
    let Some((command, args)) = Command::find(line) else {
        return Parsed::Refused(Refusal::new(consumed, reply::UNKNOWN_COMMAND));
    };
    if command == Command::Put {
        return put::parse_put(buf, consumed, args, limits.job_bytes_max);
    }
    match parse_arguments(command, args, limits.tube_bytes_max) {
        Ok(request) => Parsed::Complete { request, consumed },
        Err(reply) => Parsed::Refused(Refusal::new(consumed, reply)),
    }
}

/// Index of the `\r\n` ending the first line, looking no further than a line of
/// `line_bytes_max` bytes (its `\r\n` included) could reach.
fn find_line_end(buf: &[u8], line_bytes_max: usize) -> Option<usize> {
    let window = &buf[..buf.len().min(line_bytes_max)];
    memchr::memmem::find(window, b"\r\n")
}

/// A buffer whose first line has no end within reach: more bytes are needed, or the
/// line is too long. A line too long is refused now rather than buffered without
/// bound: through its end if that has arrived, else up to it once it does.
fn unterminated(buf: &[u8], line_bytes_max: usize) -> Parsed<'_> {
    if buf.len() < line_bytes_max.max(2) {
        return Parsed::Incomplete;
    }
    if let Some(end) = memchr::memmem::find(buf, b"\r\n") {
        return Parsed::Refused(Refusal::new(end + 2, reply::BAD_FORMAT));
    }
    let consumed = buf.len() - usize::from(buf.ends_with(b"\r"));
    Parsed::Refused(Refusal {
        skip_line: true,
        ..Refusal::new(consumed, reply::BAD_FORMAT)
    })
}
