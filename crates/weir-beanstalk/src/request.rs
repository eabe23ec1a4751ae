//! The requests of the beanstalkd protocol and the syntax of their arguments.
//!
//! A [`Request`] borrows its tube names and its job body from the read buffer. The
//! arguments are read the way beanstalkd 1.12 reads them (`prot.c`), because clients
//! were written against that server:
//!
//! - a number is optional spaces, then at least one ASCII digit, then nothing else
//!   of the number (no sign, no `+`, no `0x`); leading zeros are fine; a value past
//!   the field's width (`u32` or `u64`) is refused; the last number of a line must
//!   end the line (a trailing space is `BAD_FORMAT`);
//! - a tube name is the rest of the line after the command's one space: 1 to 200
//!   bytes of letters, digits and `-+/;.$_()`, not starting with `-` (so `use  a`,
//!   with two spaces, is refused, and so is `use a ` with a trailing one).
//!
//! Where beanstalkd is looser than that (`kick` and `reserve-with-timeout` read their
//! number with C's `strtoul`/`strtol`, which take signs and trailing junk), weir is
//! strict: `docs/beanstalk.md` lists these differences.

use crate::command::Command;
use crate::reply;

/// The characters of a tube name (beanstalkd's `NAME_CHARS`).
fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-+/;.$_()".contains(&b)
}

/// A valid tube name, borrowed from the request line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tube<'a>(&'a str);

impl<'a> Tube<'a> {
    /// `bytes` as a tube name, if it is one of at most `bytes_max` bytes.
    pub fn parse(bytes: &'a [u8], bytes_max: usize) -> Option<Tube<'a>> {
        let valid = !bytes.is_empty()
            && bytes.len() <= bytes_max
            && bytes[0] != b'-'
            && bytes.iter().all(|&b| is_name_byte(b));
        if !valid {
            return None;
        }
        // Every name byte is ASCII, so this never fails.
        std::str::from_utf8(bytes).ok().map(Tube)
    }

    pub fn as_str(&self) -> &'a str {
        self.0
    }
}

/// One complete request. Everything borrows from the read buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// `put <pri> <delay> <ttr> <bytes>\r\n<data>\r\n`. `ttr` is as sent: beanstalkd
    /// raises a `ttr` of 0 to 1 second when it stores the job, not when it parses.
    Put {
        pri: u32,
        delay: u32,
        ttr: u32,
        data: &'a [u8],
    },
    Use {
        tube: Tube<'a>,
    },
    Reserve,
    ReserveWithTimeout {
        seconds: u32,
    },
    ReserveJob {
        id: u64,
    },
    Delete {
        id: u64,
    },
    Release {
        id: u64,
        pri: u32,
        delay: u32,
    },
    Bury {
        id: u64,
        pri: u32,
    },
    Touch {
        id: u64,
    },
    Watch {
        tube: Tube<'a>,
    },
    Ignore {
        tube: Tube<'a>,
    },
    Peek {
        id: u64,
    },
    PeekReady,
    PeekDelayed,
    PeekBuried,
    Kick {
        bound: u32,
    },
    KickJob {
        id: u64,
    },
    StatsJob {
        id: u64,
    },
    StatsTube {
        tube: Tube<'a>,
    },
    Stats,
    ListTubes,
    ListTubeUsed,
    ListTubesWatched,
    PauseTube {
        tube: Tube<'a>,
        delay: u32,
    },
    /// `quit`: close the connection, no reply.
    Quit,
}

impl Request<'_> {
    /// The command, as sent (`put`, `peek-ready`, ...).
    pub fn command(&self) -> Command {
        match self {
            Request::Put { .. } => Command::Put,
            Request::Use { .. } => Command::Use,
            Request::Reserve => Command::Reserve,
            Request::ReserveWithTimeout { .. } => Command::ReserveWithTimeout,
            Request::ReserveJob { .. } => Command::ReserveJob,
            Request::Delete { .. } => Command::Delete,
            Request::Release { .. } => Command::Release,
            Request::Bury { .. } => Command::Bury,
            Request::Touch { .. } => Command::Touch,
            Request::Watch { .. } => Command::Watch,
            Request::Ignore { .. } => Command::Ignore,
            Request::Peek { .. } => Command::Peek,
            Request::PeekReady => Command::PeekReady,
            Request::PeekDelayed => Command::PeekDelayed,
            Request::PeekBuried => Command::PeekBuried,
            Request::Kick { .. } => Command::Kick,
            Request::KickJob { .. } => Command::KickJob,
            Request::StatsJob { .. } => Command::StatsJob,
            Request::StatsTube { .. } => Command::StatsTube,
            Request::Stats => Command::Stats,
            Request::ListTubes => Command::ListTubes,
            Request::ListTubeUsed => Command::ListTubeUsed,
            Request::ListTubesWatched => Command::ListTubesWatched,
            Request::PauseTube { .. } => Command::PauseTube,
            Request::Quit => Command::Quit,
        }
    }
}

/// The request of a command without a body, from the rest of its line after the
/// command's spelling (`args`). `put` is framed by `crate::put` and never comes here
/// (if it did, that would be a bug: `INTERNAL_ERROR`).
pub(crate) fn parse_arguments(
    command: Command,
    args: &[u8],
    tube_bytes_max: usize,
) -> Result<Request<'_>, &'static [u8]> {
    let tube = || Tube::parse(args, tube_bytes_max).ok_or(reply::BAD_FORMAT);
    let id = || whole_u64(args);
    let request = match command {
        Command::Put => return Err(reply::INTERNAL_ERROR),
        Command::Use => Request::Use { tube: tube()? },
        Command::Watch => Request::Watch { tube: tube()? },
        Command::Ignore => Request::Ignore { tube: tube()? },
        Command::StatsTube => Request::StatsTube { tube: tube()? },
        Command::ReserveJob => Request::ReserveJob { id: id()? },
        Command::Delete => Request::Delete { id: id()? },
        Command::Touch => Request::Touch { id: id()? },
        Command::Peek => Request::Peek { id: id()? },
        Command::KickJob => Request::KickJob { id: id()? },
        Command::StatsJob => Request::StatsJob { id: id()? },
        Command::ReserveWithTimeout => Request::ReserveWithTimeout {
            seconds: whole_u32(args)?,
        },
        Command::Kick => Request::Kick {
            bound: whole_u32(args)?,
        },
        Command::Release => parse_release(args)?,
        Command::Bury => parse_bury(args)?,
        Command::PauseTube => parse_pause_tube(args, tube_bytes_max)?,
        Command::Reserve => no_arguments(args, Request::Reserve)?,
        Command::PeekReady => no_arguments(args, Request::PeekReady)?,
        Command::PeekDelayed => no_arguments(args, Request::PeekDelayed)?,
        Command::PeekBuried => no_arguments(args, Request::PeekBuried)?,
        Command::Stats => no_arguments(args, Request::Stats)?,
        Command::ListTubes => no_arguments(args, Request::ListTubes)?,
        Command::ListTubeUsed => no_arguments(args, Request::ListTubeUsed)?,
        Command::ListTubesWatched => no_arguments(args, Request::ListTubesWatched)?,
        // beanstalkd closes on any line that starts with `quit`.
        Command::Quit => Request::Quit,
    };
    Ok(request)
}

/// A command without arguments: anything after its spelling (a space included) is
/// `BAD_FORMAT`, as in beanstalkd.
fn no_arguments(args: &[u8], request: Request<'static>) -> Result<Request<'static>, &'static [u8]> {
    if args.is_empty() {
        Ok(request)
    } else {
        Err(reply::BAD_FORMAT)
    }
}

/// `release <id> <pri> <delay>`
fn parse_release(args: &[u8]) -> Result<Request<'static>, &'static [u8]> {
    let (id, rest) = read_u64(args).ok_or(reply::BAD_FORMAT)?;
    let (pri, rest) = read_u32(rest).ok_or(reply::BAD_FORMAT)?;
    let delay = whole_u32(rest)?;
    Ok(Request::Release { id, pri, delay })
}

/// `bury <id> <pri>`
fn parse_bury(args: &[u8]) -> Result<Request<'static>, &'static [u8]> {
    let (id, rest) = read_u64(args).ok_or(reply::BAD_FORMAT)?;
    let pri = whole_u32(rest)?;
    Ok(Request::Bury { id, pri })
}

/// `pause-tube <tube> <delay>`. beanstalkd matches the command word without the
/// space after it and skips any spaces before the name, so `pause-tubefoo 5` pauses
/// `foo`; weir reads it the same way (a name must still be valid).
fn parse_pause_tube(args: &[u8], tube_bytes_max: usize) -> Result<Request<'_>, &'static [u8]> {
    let args = skip_spaces(args);
    let name_end = args
        .iter()
        .position(|&b| !is_name_byte(b))
        .unwrap_or(args.len());
    let (name, rest) = args.split_at(name_end);
    if name.is_empty() {
        return Err(reply::BAD_FORMAT);
    }
    let delay = whole_u32(rest)?;
    let tube = Tube::parse(name, tube_bytes_max).ok_or(reply::BAD_FORMAT)?;
    Ok(Request::PauseTube { tube, delay })
}

fn skip_spaces(buf: &[u8]) -> &[u8] {
    let start = buf.iter().position(|&b| b != b' ').unwrap_or(buf.len());
    &buf[start..]
}

/// A number as beanstalkd's `read_u64` reads one: spaces, then digits up to the first
/// byte that is not one. The value and what follows it; `None` without a digit or
/// past `u64::MAX`.
pub(crate) fn read_u64(buf: &[u8]) -> Option<(u64, &[u8])> {
    let buf = skip_spaces(buf);
    let end = buf
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(buf.len());
    if end == 0 {
        return None;
    }
    let mut value: u64 = 0;
    for &digit in &buf[..end] {
        value = value
            .checked_mul(10)?
            .checked_add(u64::from(digit - b'0'))?;
    }
    Some((value, &buf[end..]))
}

/// [`read_u64`] for a `u32` field (beanstalkd's `read_u32`).
pub(crate) fn read_u32(buf: &[u8]) -> Option<(u32, &[u8])> {
    let (value, rest) = read_u64(buf)?;
    Some((u32::try_from(value).ok()?, rest))
}

/// A number that must end the line.
fn whole_u64(buf: &[u8]) -> Result<u64, &'static [u8]> {
    match read_u64(buf) {
        Some((value, [])) => Ok(value),
        _ => Err(reply::BAD_FORMAT),
    }
}

fn whole_u32(buf: &[u8]) -> Result<u32, &'static [u8]> {
    match read_u32(buf) {
        Some((value, [])) => Ok(value),
        _ => Err(reply::BAD_FORMAT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_read_as_beanstalkd_reads_them() {
        assert_eq!(read_u64(b"12 x"), Some((12, &b" x"[..])));
        assert_eq!(read_u64(b"   007"), Some((7, &b""[..])));
        assert_eq!(
            read_u64(b"18446744073709551615"),
            Some((u64::MAX, &b""[..]))
        );
        assert_eq!(read_u64(b"18446744073709551616"), None);
        assert_eq!(read_u64(b"-1"), None);
        assert_eq!(read_u64(b"+1"), None);
        assert_eq!(read_u64(b""), None);
        assert_eq!(read_u64(b"\t1"), None);
        assert_eq!(read_u32(b"4294967295"), Some((u32::MAX, &b""[..])));
        assert_eq!(read_u32(b"4294967296"), None);
        assert_eq!(whole_u64(b"5 "), Err(reply::BAD_FORMAT));
    }

    #[test]
    fn tube_names_follow_beanstalkd_rules() {
        let ok = |name: &[u8]| Tube::parse(name, 200).is_some();
        assert!(ok(b"default"));
        assert!(ok(b"a-+/;.$_()Z9"));
        assert!(ok(&[b'x'; 200]));
        assert!(!ok(&[b'x'; 201]));
        assert!(!ok(b""));
        assert!(!ok(b"-a"));
        assert!(!ok(b"a b"));
        assert!(!ok(b"a*"));
        assert!(!ok(b"caf\xc3\xa9"));
        assert!(ok(b"a-"));
    }
}
