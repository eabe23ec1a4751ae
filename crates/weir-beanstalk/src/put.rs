//! `put <pri> <delay> <ttr> <bytes>\r\n<data>\r\n`: the one request with a body.
//!
//! The body is found by its byte count alone and is never looked at, so a body that
//! holds `delete 1\r\n` is data, not a command. As in beanstalkd 1.12 (measured:
//! `tests/reference/replies.txt`):
//!
//! - a body larger than the job size limit is `JOB_TOO_BIG`, and the body and its
//!   `\r\n` (`<bytes> + 2` bytes) are dropped unread; this is checked before anything
//!   after the byte count, so `put 0 0 1 99999 junk` is `JOB_TOO_BIG` too;
//! - the `<bytes> + 2` bytes after the line are taken whatever they hold; if the last
//!   two are not `\r\n`, the reply is `EXPECTED_CRLF` and the next request starts
//!   right after them (so a body longer than its count leaves its tail to be read as
//!   a command, as in beanstalkd).
//!
//! Where weir differs: beanstalkd answers a malformed `put` line (a negative or
//! fractional number, a trailing space, junk after the count) with `BAD_FORMAT` and
//! then reads the body that follows as commands. weir drops the body when the line's
//! fourth argument is a byte count (one reply for one request, and no client data
//! run as commands); when there is no count to find the body by, it replies
//! `BAD_FORMAT` and closes the connection.

use crate::parsed::{Parsed, Refusal};
use crate::reply;
use crate::request::{read_u32, Request};

/// The numbers of a well-formed `put` line.
struct PutLine {
    pri: u32,
    delay: u32,
    ttr: u32,
    bytes: u32,
}

/// The `put` whose line (without `put `) is `args` and whose line spans the first
/// `line_consumed` bytes of `buf`, `\r\n` included.
pub(crate) fn parse_put<'a>(
    buf: &'a [u8],
    line_consumed: usize,
    args: &[u8],
    job_bytes_max: u32,
) -> Parsed<'a> {
    let line = match parse_put_line(args, job_bytes_max) {
        Ok(line) => line,
        Err(refuse) => return Parsed::Refused(refuse.refusal(line_consumed)),
    };
    // `bytes` is a u32 and `line_consumed` is within a buffer: no overflow on any
    // target with a 64-bit usize; saturate elsewhere (the body never arrives whole).
    let data_end = line_consumed.saturating_add(line.bytes as usize);
    let end = data_end.saturating_add(2);
    if buf.len() < end {
        return Parsed::Incomplete;
    }
    if &buf[data_end..end] != b"\r\n" {
        return Parsed::Refused(Refusal::new(end, reply::EXPECTED_CRLF));
    }
    Parsed::Complete {
        request: Request::Put {
            pri: line.pri,
            delay: line.delay,
            ttr: line.ttr,
            data: &buf[line_consumed..data_end],
        },
        consumed: end,
    }
}

/// Why a `put` line is refused.
enum LineRefusal {
    /// Reply, and drop the body and its `\r\n` (`bytes + 2` bytes after the line).
    DropBody { reply: &'static [u8], bytes: u32 },
    /// No byte count to find the body by: `BAD_FORMAT`, then close.
    Close,
}

impl LineRefusal {
    fn refusal(self, line_consumed: usize) -> Refusal {
        match self {
            LineRefusal::DropBody { reply, bytes } => Refusal {
                discard_bytes: u64::from(bytes) + 2,
                ..Refusal::new(line_consumed, reply)
            },
            LineRefusal::Close => Refusal {
                close: true,
                ..Refusal::new(line_consumed, reply::BAD_FORMAT)
            },
        }
    }
}

/// The numbers of a `put` line, or why it is refused.
fn parse_put_line(args: &[u8], job_bytes_max: u32) -> Result<PutLine, LineRefusal> {
    let drop_body = |reply, bytes| LineRefusal::DropBody { reply, bytes };
    let numbers = read_u32(args).and_then(|(pri, rest)| {
        let (delay, rest) = read_u32(rest)?;
        let (ttr, rest) = read_u32(rest)?;
        let (bytes, rest) = read_u32(rest)?;
        Some((
            PutLine {
                pri,
                delay,
                ttr,
                bytes,
            },
            rest,
        ))
    });
    let Some((line, rest)) = numbers else {
        return Err(match fourth_argument_count(args) {
            Some(bytes) => drop_body(reply::BAD_FORMAT, bytes),
            None => LineRefusal::Close,
        });
    };
    if line.bytes > job_bytes_max {
        return Err(drop_body(reply::JOB_TOO_BIG, line.bytes));
    }
    if !rest.is_empty() {
        return Err(drop_body(reply::BAD_FORMAT, line.bytes));
    }
    Ok(line)
}

/// The byte count of a malformed `put` line: its fourth space-separated argument,
/// when that is all digits and fits a `u32`.
fn fourth_argument_count(args: &[u8]) -> Option<u32> {
    let token = args
        .split(|&b| b == b' ')
        .filter(|t| !t.is_empty())
        .nth(3)?;
    match read_u32(token) {
        Some((bytes, [])) => Some(bytes),
        _ => None,
    }
}
