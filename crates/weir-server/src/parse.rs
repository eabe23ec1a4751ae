//! The request parser: bytes in, one [`Request`] (or a refusal) out.
//!
//! [`parse`] is a pure function over the connection's read buffer. It never allocates
//! and never consumes anything itself: it says how many bytes a complete request spans
//! (`consumed`), or that more bytes are needed, or how to refuse what it sees. That
//! keeps framing decisions in one place, lets the connection parse every complete
//! request of a read before writing once, and lets a proptest and a fuzz target drive
//! it with arbitrary bytes.
//!
//! Lines end in `\r\n`; a bare `\n` is accepted. A line longer than
//! `line_bytes_max` (not counting its end) is refused. A `set` data block must be
//! followed by `\r\n` (or `\n`); anything else means the stream can no longer be
//! trusted, and the refusal says to close the connection.

use crate::request::{
    parse_i64, parse_plain_key, parse_read_key, parse_u64, parse_write_key, KeyError,
};

/// The limits the parser enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseLimits {
    /// Longest request line, in bytes, without its `\r\n`.
    pub line_bytes_max: usize,
    /// Largest `set` data block accepted, in bytes.
    pub item_size_bytes_max: u64,
}

impl Default for ParseLimits {
    fn default() -> Self {
        ParseLimits {
            line_bytes_max: LINE_BYTES_MAX_DEFAULT,
            item_size_bytes_max: ITEM_SIZE_BYTES_MAX_DEFAULT,
        }
    }
}

pub const LINE_BYTES_MAX_DEFAULT: usize = 2048;
pub const ITEM_SIZE_BYTES_MAX_DEFAULT: u64 = 16 * 1024 * 1024;

/// One complete request. Everything borrows from the read buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    Set {
        key: &'a str,
        flags: u32,
        exptime: i64,
        data: &'a [u8],
        noreply: bool,
    },
    /// `keys` is the rest of the line: one or more keys separated by spaces, each
    /// already checked by [`parse_read_key`].
    Get {
        keys: &'a str,
        cas: bool,
    },
    Delete {
        key: &'a str,
        noreply: bool,
    },
    Flush {
        key: &'a str,
        noreply: bool,
    },
    FlushAll {
        noreply: bool,
    },
    FlushExpired {
        key: &'a str,
    },
    FlushAllExpired,
    Stats,
    /// `names` is the rest of the line: zero or more queue names, each valid.
    DumpStats {
        names: &'a str,
    },
    Monitor {
        key: &'a str,
        seconds: u64,
        items_max: Option<u64>,
    },
    Confirm {
        key: &'a str,
        count: u64,
    },
    Version,
    Reload,
    Shutdown,
    Quit,
}

impl Request<'_> {
    /// The command's kind, for metrics.
    pub fn kind(&self) -> CommandKind {
        match self {
            Request::Set { .. } => CommandKind::Set,
            Request::Get { .. } => CommandKind::Get,
            Request::Delete { .. } => CommandKind::Delete,
            Request::Flush { .. } => CommandKind::Flush,
            Request::FlushAll { .. } => CommandKind::FlushAll,
            Request::FlushExpired { .. } => CommandKind::FlushExpired,
            Request::FlushAllExpired => CommandKind::FlushAllExpired,
            Request::Stats => CommandKind::Stats,
            Request::DumpStats { .. } => CommandKind::DumpStats,
            Request::Monitor { .. } => CommandKind::Monitor,
            Request::Confirm { .. } => CommandKind::Confirm,
            Request::Version => CommandKind::Version,
            Request::Reload => CommandKind::Reload,
            Request::Shutdown => CommandKind::Shutdown,
            Request::Quit => CommandKind::Quit,
        }
    }
}

/// Command kinds, as counted in `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandKind {
    Set,
    Get,
    Delete,
    Flush,
    FlushAll,
    FlushExpired,
    FlushAllExpired,
    Stats,
    DumpStats,
    Monitor,
    Confirm,
    Version,
    Reload,
    Shutdown,
    Quit,
    /// Refused by the parser (unknown command, bad line, bad key, ...).
    Invalid,
}

impl CommandKind {
    pub const ALL: [CommandKind; 16] = [
        CommandKind::Set,
        CommandKind::Get,
        CommandKind::Delete,
        CommandKind::Flush,
        CommandKind::FlushAll,
        CommandKind::FlushExpired,
        CommandKind::FlushAllExpired,
        CommandKind::Stats,
        CommandKind::DumpStats,
        CommandKind::Monitor,
        CommandKind::Confirm,
        CommandKind::Version,
        CommandKind::Reload,
        CommandKind::Shutdown,
        CommandKind::Quit,
        CommandKind::Invalid,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CommandKind::Set => "set",
            CommandKind::Get => "get",
            CommandKind::Delete => "delete",
            CommandKind::Flush => "flush",
            CommandKind::FlushAll => "flush_all",
            CommandKind::FlushExpired => "flush_expired",
            CommandKind::FlushAllExpired => "flush_all_expired",
            CommandKind::Stats => "stats",
            CommandKind::DumpStats => "dump_stats",
            CommandKind::Monitor => "monitor",
            CommandKind::Confirm => "confirm",
            CommandKind::Version => "version",
            CommandKind::Reload => "reload",
            CommandKind::Shutdown => "shutdown",
            CommandKind::Quit => "quit",
            CommandKind::Invalid => "invalid",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// How to refuse what the parser saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reject {
    /// Bytes of the buffer to drop now (always at least 1, at most the buffer length).
    pub consumed: usize,
    /// The full reply, `\r\n` included.
    pub reply: &'static [u8],
    /// Bytes still to drop after `consumed` (the data block of a refused `set`,
    /// `\r\n` included), which may not have arrived yet.
    pub discard_bytes: u64,
    /// Drop everything up to and including the next `\n` (a line too long whose end
    /// has not arrived yet).
    pub skip_line: bool,
    /// The stream cannot be trusted any more: reply, then close the connection.
    pub close: bool,
    /// The request said `noreply`: send nothing.
    pub noreply: bool,
}

impl Reject {
    fn new(consumed: usize, reply: &'static [u8]) -> Reject {
        Reject {
            consumed,
            reply,
            discard_bytes: 0,
            skip_line: false,
            close: false,
            noreply: false,
        }
    }
}

/// What [`parse`] found at the front of the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parse<'a> {
    /// Not a complete request yet. `bytes_needed` is the buffer length that will
    /// complete it when known (a `set` whose line is in), else 0.
    Incomplete {
        bytes_needed: usize,
    },
    Request {
        request: Request<'a>,
        consumed: usize,
    },
    Reject(Reject),
}

pub const REPLY_ERROR: &[u8] = b"ERROR\r\n";
pub const REPLY_BAD_FORMAT: &[u8] = b"CLIENT_ERROR bad command line format\r\n";
pub const REPLY_LINE_TOO_LONG: &[u8] = b"CLIENT_ERROR line too long\r\n";
pub const REPLY_BAD_DATA_CHUNK: &[u8] = b"CLIENT_ERROR bad data chunk\r\n";
pub const REPLY_TOO_LARGE: &[u8] = b"CLIENT_ERROR item too large\r\n";

/// Parses the request at the front of `buf`.
pub fn parse<'a>(buf: &'a [u8], limits: &ParseLimits) -> Parse<'a> {
    let Some(line_end) = find_line_end(buf, limits.line_bytes_max) else {
        if buf.len() > limits.line_bytes_max + 1 {
            // No end within reach: refuse now rather than buffer without bound. If
            // the end has arrived, drop through it; else drop up to it once it does.
            let end = memchr::memchr(b'\n', buf);
            return Parse::Reject(Reject {
                skip_line: end.is_none(),
                close: starts_with_set(buf),
                ..Reject::new(end.map_or(buf.len(), |i| i + 1), REPLY_LINE_TOO_LONG)
            });
        }
        return Parse::Incomplete { bytes_needed: 0 };
    };
    let consumed = line_end + 1;
    let line = trim_line(&buf[..line_end]);
    if line.len() > limits.line_bytes_max {
        return Parse::Reject(Reject {
            close: starts_with_set(line),
            ..Reject::new(consumed, REPLY_LINE_TOO_LONG)
        });
    }
    let mut tokens = Tokens::new(line);
    let Some(command) = tokens.next() else {
        return Parse::Reject(Reject::new(consumed, REPLY_ERROR));
    };
    let is = |word: &str| command.eq_ignore_ascii_case(word.as_bytes());
    if is("set") {
        return parse_set(buf, consumed, tokens, limits);
    }
    let request = if is("get") || is("gets") {
        parse_get(tokens, is("gets"))
    } else if is("delete") {
        parse_delete(tokens)
    } else if is("flush") {
        one_key(tokens, true).map(|(key, noreply)| Request::Flush { key, noreply })
    } else if is("flush_all") {
        parse_flush_all(tokens)
    } else if is("flush_expired") {
        parse_flush_expired(tokens)
    } else if is("flush_all_expired") {
        no_arguments(tokens, Request::FlushAllExpired)
    } else if is("stats") {
        // memcache's `stats ARG` variants all get the one form weir has.
        Ok(Request::Stats)
    } else if is("dump_stats") {
        parse_dump_stats(tokens)
    } else if is("monitor") {
        parse_monitor(tokens)
    } else if is("confirm") {
        parse_confirm(tokens)
    } else if is("version") {
        no_arguments(tokens, Request::Version)
    } else if is("reload") {
        no_arguments(tokens, Request::Reload)
    } else if is("shutdown") {
        no_arguments(tokens, Request::Shutdown)
    } else if is("quit") {
        no_arguments(tokens, Request::Quit)
    } else {
        Err(REPLY_ERROR)
    };
    match request {
        Ok(request) => Parse::Request { request, consumed },
        Err(reply) => Parse::Reject(Reject::new(consumed, reply)),
    }
}

/// Index of the `\n` ending the first line, looking no further than a line of
/// `line_bytes_max` bytes plus `\r\n` could reach.
fn find_line_end(buf: &[u8], line_bytes_max: usize) -> Option<usize> {
    let window = &buf[..buf.len().min(line_bytes_max.saturating_add(2))];
    memchr::memchr(b'\n', window)
}

/// The line without its `\r` (the `\n` is already off).
fn trim_line(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn starts_with_set(buf: &[u8]) -> bool {
    buf.len() >= 4 && buf[..3].eq_ignore_ascii_case(b"set") && buf[3] == b' '
}

/// Space-separated tokens of a line; runs of spaces count as one.
struct Tokens<'a> {
    rest: &'a [u8],
}

impl<'a> Tokens<'a> {
    fn new(line: &'a [u8]) -> Tokens<'a> {
        Tokens { rest: line }
    }

    /// The rest of the line after leading spaces, as text; `None` when not UTF-8.
    fn rest_str(&self) -> Option<&'a str> {
        let start = self
            .rest
            .iter()
            .position(|&b| b != b' ')
            .unwrap_or(self.rest.len());
        std::str::from_utf8(&self.rest[start..]).ok()
    }
}

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let start = self.rest.iter().position(|&b| b != b' ')?;
        let rest = &self.rest[start..];
        let end = memchr::memchr(b' ', rest).unwrap_or(rest.len());
        self.rest = &rest[end..];
        Some(&rest[..end])
    }
}

fn as_str(token: &[u8]) -> Result<&str, &'static [u8]> {
    std::str::from_utf8(token).map_err(|_| REPLY_BAD_FORMAT)
}

fn key_error(e: KeyError) -> &'static [u8] {
    e.reply()
}

/// `set KEY FLAGS EXPTIME BYTES [noreply]\r\nDATA\r\n`
fn parse_set<'a>(
    buf: &'a [u8],
    line_consumed: usize,
    mut tokens: Tokens<'a>,
    limits: &ParseLimits,
) -> Parse<'a> {
    let key = tokens.next();
    let flags = tokens.next();
    let exptime = tokens.next();
    let Some(length) = tokens.next().and_then(parse_u64) else {
        // Without a length the data block cannot be found: the stream is lost.
        return Parse::Reject(Reject {
            close: true,
            ..Reject::new(line_consumed, REPLY_BAD_DATA_CHUNK)
        });
    };
    let last = tokens.next();
    let noreply = last.is_some_and(|t| t.eq_ignore_ascii_case(b"noreply"));
    let extra = tokens.next().is_some() || (last.is_some() && !noreply);
    let data_and_end = length.saturating_add(2);
    let refuse = |reply| {
        Parse::Reject(Reject {
            discard_bytes: data_and_end,
            noreply,
            ..Reject::new(line_consumed, reply)
        })
    };
    if length > limits.item_size_bytes_max {
        return refuse(REPLY_TOO_LARGE);
    }
    let flags = flags
        .and_then(parse_u64)
        .and_then(|f| u32::try_from(f).ok());
    let exptime = exptime.and_then(parse_i64);
    let (Some(key), Some(flags), Some(exptime), false) = (key, flags, exptime, extra) else {
        return refuse(REPLY_BAD_FORMAT);
    };
    let key = match as_str(key) {
        Ok(key) => key,
        Err(reply) => return refuse(reply),
    };
    if let Err(e) = parse_write_key(key) {
        return refuse(key_error(e));
    }
    // The item limit keeps `length` far below usize::MAX.
    let length = length as usize;
    let data_start = line_consumed;
    let data_end = data_start + length;
    if buf.len() <= data_end {
        return Parse::Incomplete {
            bytes_needed: data_end + 2,
        };
    }
    let consumed = match buf[data_end] {
        b'\n' => data_end + 1,
        b'\r' if buf.len() == data_end + 1 => {
            return Parse::Incomplete {
                bytes_needed: data_end + 2,
            }
        }
        b'\r' if buf[data_end + 1] == b'\n' => data_end + 2,
        _ => {
            return Parse::Reject(Reject {
                close: true,
                ..Reject::new(data_end.min(buf.len()), REPLY_BAD_DATA_CHUNK)
            })
        }
    };
    Parse::Request {
        request: Request::Set {
            key,
            flags,
            exptime,
            data: &buf[data_start..data_end],
            noreply,
        },
        consumed,
    }
}

fn parse_get<'a>(tokens: Tokens<'a>, cas: bool) -> Result<Request<'a>, &'static [u8]> {
    let keys = tokens.rest_str().ok_or(REPLY_BAD_FORMAT)?;
    let mut count = 0;
    for key in keys.split(' ').filter(|k| !k.is_empty()) {
        parse_read_key(key).map_err(key_error)?;
        count += 1;
    }
    if count == 0 {
        return Err(REPLY_BAD_FORMAT);
    }
    Ok(Request::Get { keys, cas })
}

/// `delete KEY [0] [noreply]` (the `0` is memcache's old hold time, accepted for
/// clients that still send it).
fn parse_delete(mut tokens: Tokens<'_>) -> Result<Request<'_>, &'static [u8]> {
    let key = as_str(tokens.next().ok_or(REPLY_BAD_FORMAT)?)?;
    parse_plain_key(key).map_err(key_error)?;
    let mut noreply = false;
    for token in tokens {
        if token.eq_ignore_ascii_case(b"noreply") && !noreply {
            noreply = true;
        } else if token != b"0" || noreply {
            return Err(REPLY_BAD_FORMAT);
        }
    }
    Ok(Request::Delete { key, noreply })
}

/// `COMMAND KEY [noreply]` where the key takes no options.
fn one_key(mut tokens: Tokens<'_>, noreply_ok: bool) -> Result<(&str, bool), &'static [u8]> {
    let key = as_str(tokens.next().ok_or(REPLY_BAD_FORMAT)?)?;
    parse_plain_key(key).map_err(key_error)?;
    let noreply = match tokens.next() {
        None => false,
        Some(t) if noreply_ok && t.eq_ignore_ascii_case(b"noreply") => true,
        Some(_) => return Err(REPLY_BAD_FORMAT),
    };
    if tokens.next().is_some() {
        return Err(REPLY_BAD_FORMAT);
    }
    Ok((key, noreply))
}

/// `flush_expired QUEUE`: a queue, not a reader (`CLIENT_ERROR bad queue name`, as
/// for `set`): the engine expires a queue's items for all its readers at once, so a
/// reader key could only be misread as asking for less than it does.
fn parse_flush_expired(tokens: Tokens<'_>) -> Result<Request<'_>, &'static [u8]> {
    let (key, _) = one_key(tokens, false)?;
    if !parse_plain_key(key).map_err(key_error)?.reader.is_empty() {
        return Err(KeyError::BadName.reply());
    }
    Ok(Request::FlushExpired { key })
}

/// `flush_all [DELAY] [noreply]`: clients send a delay; weir only flushes at once, so
/// only 0 is accepted.
fn parse_flush_all(tokens: Tokens<'_>) -> Result<Request<'_>, &'static [u8]> {
    let mut noreply = false;
    let mut delay_seen = false;
    for token in tokens {
        if token.eq_ignore_ascii_case(b"noreply") && !noreply {
            noreply = true;
        } else if !delay_seen && !noreply && parse_u64(token) == Some(0) {
            delay_seen = true;
        } else {
            return Err(REPLY_BAD_FORMAT);
        }
    }
    Ok(Request::FlushAll { noreply })
}

fn no_arguments<'a>(
    mut tokens: Tokens<'a>,
    request: Request<'a>,
) -> Result<Request<'a>, &'static [u8]> {
    match tokens.next() {
        None => Ok(request),
        Some(_) => Err(REPLY_BAD_FORMAT),
    }
}

fn parse_dump_stats(tokens: Tokens<'_>) -> Result<Request<'_>, &'static [u8]> {
    let names = tokens.rest_str().ok_or(REPLY_BAD_FORMAT)?;
    for name in names.split(' ').filter(|n| !n.is_empty()) {
        if weir::validate_queue_name(name).is_err() {
            return Err(KeyError::BadName.reply());
        }
    }
    Ok(Request::DumpStats { names })
}

/// `monitor KEY SECONDS [MAX_ITEMS]`
fn parse_monitor(mut tokens: Tokens<'_>) -> Result<Request<'_>, &'static [u8]> {
    let key = as_str(tokens.next().ok_or(REPLY_BAD_FORMAT)?)?;
    parse_plain_key(key).map_err(key_error)?;
    let seconds = tokens.next().and_then(parse_u64).ok_or(REPLY_BAD_FORMAT)?;
    let items_max = match tokens.next() {
        None => None,
        Some(t) => Some(parse_u64(t).ok_or(REPLY_BAD_FORMAT)?),
    };
    if tokens.next().is_some() {
        return Err(REPLY_BAD_FORMAT);
    }
    Ok(Request::Monitor {
        key,
        seconds,
        items_max,
    })
}

/// `confirm KEY COUNT`
fn parse_confirm(mut tokens: Tokens<'_>) -> Result<Request<'_>, &'static [u8]> {
    let key = as_str(tokens.next().ok_or(REPLY_BAD_FORMAT)?)?;
    parse_plain_key(key).map_err(key_error)?;
    let count = tokens.next().and_then(parse_u64).ok_or(REPLY_BAD_FORMAT)?;
    if tokens.next().is_some() {
        return Err(REPLY_BAD_FORMAT);
    }
    Ok(Request::Confirm { key, count })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ParseLimits {
        ParseLimits {
            line_bytes_max: 64,
            item_size_bytes_max: 100,
        }
    }

    fn request(buf: &[u8]) -> (Request<'_>, usize) {
        match parse(buf, &limits()) {
            Parse::Request { request, consumed } => (request, consumed),
            other => panic!("{other:?}"),
        }
    }

    fn reject(buf: &[u8]) -> Reject {
        match parse(buf, &limits()) {
            Parse::Reject(r) => r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn set_complete_and_partial() {
        let buf = b"set q 5 0 3\r\nabc\r\nget q\r\n";
        let (req, consumed) = request(buf);
        assert_eq!(consumed, 18);
        assert_eq!(
            req,
            Request::Set {
                key: "q",
                flags: 5,
                exptime: 0,
                data: b"abc",
                noreply: false
            }
        );
        for cut in 0..18 {
            match parse(&buf[..cut], &limits()) {
                Parse::Incomplete { .. } => {}
                other => panic!("cut {cut}: {other:?}"),
            }
        }
        assert_eq!(
            parse(b"set q 0 0 3\r\nab", &limits()),
            Parse::Incomplete { bytes_needed: 18 }
        );
        let (req, consumed) = request(b"SET q 0 -1 0 noreply\n\n");
        assert_eq!(consumed, 22);
        assert!(matches!(
            req,
            Request::Set {
                data: b"",
                noreply: true,
                exptime: -1,
                ..
            }
        ));
    }

    #[test]
    fn set_errors() {
        let r = reject(b"set q 0 0 3\r\nabcd\r\n");
        assert_eq!((r.reply, r.close), (REPLY_BAD_DATA_CHUNK, true));
        let r = reject(b"set q 0 0 -3\r\n");
        assert_eq!((r.reply, r.close), (REPLY_BAD_DATA_CHUNK, true));
        let r = reject(b"set q 0 0 x\r\n");
        assert!(r.close);
        let r = reject(b"set q 0 0 101\r\n");
        assert_eq!(
            (r.reply, r.close, r.discard_bytes, r.consumed),
            (REPLY_TOO_LARGE, false, 103, 15)
        );
        let r = reject(b"set q x 0 1\r\n");
        assert_eq!((r.reply, r.discard_bytes), (REPLY_BAD_FORMAT, 3));
        let r = reject(b"set q 4294967296 0 1\r\n");
        assert_eq!(r.reply, REPLY_BAD_FORMAT);
        let r = reject(b"set q 0 0 1 bogus\r\n");
        assert_eq!(r.reply, REPLY_BAD_FORMAT);
        let r = reject(b"set a.b 0 0 1 noreply\r\n");
        assert_eq!((r.reply, r.noreply), (KeyError::BadName.reply(), true));
    }

    #[test]
    fn lines() {
        assert_eq!(reject(b"\r\n").reply, REPLY_ERROR);
        assert_eq!(reject(b"bogus\r\n").reply, REPLY_ERROR);
        assert_eq!(reject(b"get\r\n").reply, REPLY_BAD_FORMAT);
        assert_eq!(reject(b"get   \r\n").reply, REPLY_BAD_FORMAT);
        let (req, _) = request(b"GeT a b.c/open\r\n");
        assert_eq!(
            req,
            Request::Get {
                keys: "a b.c/open",
                cas: false
            }
        );
        let long = [b'a'; 70];
        let r = reject(&long);
        assert_eq!(
            (r.reply, r.skip_line, r.close, r.consumed),
            (REPLY_LINE_TOO_LONG, true, false, 70)
        );
        let mut line = b"set ".to_vec();
        line.extend_from_slice(&[b'a'; 70]);
        line.extend_from_slice(b"\r\n");
        let r = reject(&line);
        assert_eq!(
            (r.skip_line, r.close, r.consumed),
            (false, true, line.len())
        );
        // Exactly the limit is fine.
        let mut line = b"get ".to_vec();
        line.extend_from_slice(&[b'a'; 60]);
        line.extend_from_slice(b"\r\n");
        assert!(matches!(parse(&line, &limits()), Parse::Request { .. }));
        assert_eq!(
            parse(&line[..line.len() - 1], &limits()),
            Parse::Incomplete { bytes_needed: 0 }
        );
    }

    #[test]
    fn other_commands() {
        assert_eq!(
            request(b"delete q noreply\r\n").0,
            Request::Delete {
                key: "q",
                noreply: true
            }
        );
        assert_eq!(
            request(b"flush_all 0 noreply\r\n").0,
            Request::FlushAll { noreply: true }
        );
        assert_eq!(reject(b"flush_all 5\r\n").reply, REPLY_BAD_FORMAT);
        assert_eq!(
            request(b"flush q.r\r\n").0,
            Request::Flush {
                key: "q.r",
                noreply: false
            }
        );
        assert_eq!(
            request(b"monitor q 5 10\r\n").0,
            Request::Monitor {
                key: "q",
                seconds: 5,
                items_max: Some(10)
            }
        );
        assert_eq!(
            request(b"confirm q 2\r\n").0,
            Request::Confirm { key: "q", count: 2 }
        );
        assert_eq!(reject(b"version x\r\n").reply, REPLY_BAD_FORMAT);
        assert_eq!(
            request(b"dump_stats a b\r\n").0,
            Request::DumpStats { names: "a b" }
        );
        assert_eq!(request(b"stats\r\n").0, Request::Stats);
        assert_eq!(
            request(b"flush_expired q\r\n").0,
            Request::FlushExpired { key: "q" }
        );
        for reader_key in [&b"flush_expired q.r\r\n"[..], b"flush_expired q+r\r\n"] {
            assert_eq!(reject(reader_key).reply, KeyError::BadName.reply());
        }
        assert_eq!(
            reject(b"flush_expired q/open\r\n").reply,
            KeyError::BadOption.reply()
        );
        assert_eq!(reject(b"flush_expired q x\r\n").reply, REPLY_BAD_FORMAT);
    }
}
