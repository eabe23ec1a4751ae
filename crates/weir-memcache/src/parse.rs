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
//!
//! One request, one reply, always in step. The other storage commands of the memcache
//! protocol (`add`, `replace`, `append`, `prepend`, `cas`, and the meta `ms`) carry a
//! data block too: weir does not do them, but it reads their block (its length is on
//! the line) and drops it with one error reply, so client data is never run as
//! commands. Where the block cannot be found (no valid length, a line too long), the
//! connection is closed after the reply. A binary-protocol request (first byte 0x80)
//! gets a binary error response and the connection is closed.

use crate::reply;
use crate::request::{
    parse_i64, parse_plain_key, parse_u64, parse_write_key, GetKeys, GetKeysError, KeyError,
    KeySpan, ReadKey, WriteKey,
};

/// The limits the parser enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseLimits {
    /// Longest request line, in bytes, without its `\r\n`.
    pub line_bytes_max: usize,
    /// Largest `set` data block accepted, in bytes.
    pub item_size_bytes_max: u64,
    /// Most keys one `get`/`gets` may name.
    pub get_keys_max: usize,
}

impl Default for ParseLimits {
    fn default() -> Self {
        ParseLimits {
            line_bytes_max: LINE_BYTES_MAX_DEFAULT,
            item_size_bytes_max: ITEM_SIZE_BYTES_MAX_DEFAULT,
            get_keys_max: GET_KEYS_MAX_DEFAULT,
        }
    }
}

/// The default longest line: room for a multi-get of [`GET_KEYS_MAX_DEFAULT`] keys of
/// 60 bytes (memcached reads `get` lines of any length; clients such as gomemcache
/// send hundreds of keys in one). What bounds a request is the key count.
pub const LINE_BYTES_MAX_DEFAULT: usize = 64 * 1024;
/// The default most keys of one `get`: each key may create a queue and each reply
/// may hold an item, so the count, not the line, is what a request's work follows.
pub const GET_KEYS_MAX_DEFAULT: usize = 1024;
pub const ITEM_SIZE_BYTES_MAX_DEFAULT: u64 = 16 * 1024 * 1024;

/// One complete request. Everything borrows from the read buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    Set {
        key: WriteKey<'a>,
        flags: u32,
        exptime: i64,
        data: &'a [u8],
        noreply: bool,
    },
    Get {
        keys: GetKeys<'a>,
        cas: bool,
    },
    Delete {
        key: ReadKey<'a>,
        noreply: bool,
    },
    Flush {
        key: ReadKey<'a>,
        noreply: bool,
    },
    FlushAll {
        noreply: bool,
    },
    /// A queue's name (a reader key is refused).
    FlushExpired {
        queue: &'a str,
    },
    FlushAllExpired,
    Stats,
    /// `stats settings`: the server's settings as `STAT` lines.
    StatsSettings,
    /// `stats reset`: the counters `stats` shows start again from zero.
    StatsReset,
    /// `names` is the rest of the line: zero or more queue names, each valid.
    DumpStats {
        names: &'a str,
    },
    Monitor {
        key: ReadKey<'a>,
        seconds: u64,
        items_max: Option<u64>,
    },
    Confirm {
        key: ReadKey<'a>,
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
            Request::Stats | Request::StatsSettings | Request::StatsReset => CommandKind::Stats,
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
    /// A binary-protocol request header: answer with [`binary_error`] and close.
    Binary {
        opcode: u8,
        opaque: [u8; 4],
    },
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

/// The memcache storage commands weir does not do, with the index (among the tokens
/// after the command word) of their data block's length, and their one reply.
const UNSUPPORTED_STORAGE: [(&str, usize, &[u8]); 6] = [
    ("add", 3, reply::ADD_UNSUPPORTED),
    ("replace", 3, reply::REPLACE_UNSUPPORTED),
    ("append", 3, reply::APPEND_UNSUPPORTED),
    ("prepend", 3, reply::PREPEND_UNSUPPORTED),
    ("cas", 3, reply::CAS_UNSUPPORTED),
    ("ms", 1, reply::MS_UNSUPPORTED),
];

/// Bytes of a binary-protocol request header.
pub const BINARY_HEADER_BYTES: usize = 24;
/// First byte of a binary-protocol request.
const BINARY_REQUEST_MAGIC: u8 = 0x80;
/// The text of the binary error response.
const BINARY_ERROR_TEXT: &[u8] = b"weir speaks the memcache text protocol only";

/// A binary-protocol response refusing the request (`opcode`, `opaque` echoed):
/// status 0x0081, "unknown command", with a short text, so a binary client reports a
/// clear error instead of waiting.
pub fn binary_error(opcode: u8, opaque: [u8; 4]) -> Vec<u8> {
    let mut out = Vec::with_capacity(BINARY_HEADER_BYTES + BINARY_ERROR_TEXT.len());
    out.push(0x81);
    out.push(opcode);
    out.extend_from_slice(&[0, 0, 0, 0]); // key length, extras length, data type
    out.extend_from_slice(&0x0081u16.to_be_bytes());
    out.extend_from_slice(&(BINARY_ERROR_TEXT.len() as u32).to_be_bytes());
    out.extend_from_slice(&opaque);
    out.extend_from_slice(&[0u8; 8]); // cas
    out.extend_from_slice(BINARY_ERROR_TEXT);
    out
}

/// Parses the request at the front of `buf`. The keys of a `get` are parsed into
/// `get_keys`, a buffer the caller reuses from request to request.
pub fn parse<'a>(buf: &'a [u8], limits: &ParseLimits, get_keys: &'a mut Vec<KeySpan>) -> Parse<'a> {
    if buf.first() == Some(&BINARY_REQUEST_MAGIC) {
        return parse_binary(buf);
    }
    let Some(line_end) = find_line_end(buf, limits.line_bytes_max) else {
        if buf.len() > limits.line_bytes_max + 1 {
            // No end within reach: refuse now rather than buffer without bound. If
            // the end has arrived, drop through it; else drop up to it once it does.
            // A storage command's data block cannot be found past a line that is
            // not read: the connection closes rather than run it as commands.
            let end = memchr::memchr(b'\n', buf);
            let consumed = end.map_or(buf.len(), |i| i + 1);
            return Parse::Reject(Reject {
                skip_line: end.is_none(),
                close: starts_with_storage_command(buf),
                ..Reject::new(consumed, reply::LINE_TOO_LONG)
            });
        }
        return Parse::Incomplete { bytes_needed: 0 };
    };
    let consumed = line_end + 1;
    let line = trim_line(&buf[..line_end]);
    if line.len() > limits.line_bytes_max {
        return Parse::Reject(Reject {
            close: starts_with_storage_command(line),
            ..Reject::new(consumed, reply::LINE_TOO_LONG)
        });
    }
    let mut tokens = Tokens::new(line);
    let Some(command) = tokens.next() else {
        return Parse::Reject(Reject::new(consumed, reply::ERROR));
    };
    let is = |word: &str| command.eq_ignore_ascii_case(word.as_bytes());
    if is("set") {
        return parse_set(buf, consumed, tokens, limits);
    }
    if let Some(&(_, length_at, reply)) = UNSUPPORTED_STORAGE.iter().find(|(w, _, _)| is(w)) {
        return refuse_storage(consumed, tokens, length_at, reply, is("ms"));
    }
    let request = parse_command(command, tokens, limits, get_keys);
    match request {
        Ok(request) => Parse::Request { request, consumed },
        Err(reply) => Parse::Reject(Reject::new(consumed, reply)),
    }
}

/// A command without a data block: its request, or the reply refusing it.
fn parse_command<'a>(
    command: &[u8],
    tokens: Tokens<'a>,
    limits: &ParseLimits,
    get_keys: &'a mut Vec<KeySpan>,
) -> Result<Request<'a>, &'static [u8]> {
    let is = |word: &str| command.eq_ignore_ascii_case(word.as_bytes());
    if is("get") || is("gets") {
        parse_get(tokens, is("gets"), limits.get_keys_max, get_keys)
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
        parse_stats(tokens)
    } else if is("dump_stats") {
        parse_dump_stats(tokens)
    } else if is("monitor") {
        parse_monitor(tokens)
    } else if is("confirm") {
        parse_confirm(tokens)
    } else if is("version") {
        // memcached answers whatever follows; so do we.
        Ok(Request::Version)
    } else if is("reload") {
        no_arguments(tokens, Request::Reload)
    } else if is("shutdown") {
        no_arguments(tokens, Request::Shutdown)
    } else if is("quit") {
        // memcached closes whatever follows; so do we.
        Ok(Request::Quit)
    } else {
        Err(reply::ERROR)
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

/// Whether `buf` starts with a command that carries a data block (`set`, or one of
/// [`UNSUPPORTED_STORAGE`]) followed by a space.
fn starts_with_storage_command(buf: &[u8]) -> bool {
    let word_end = buf.iter().position(|&b| b == b' ').unwrap_or(buf.len());
    if word_end == buf.len() {
        return false;
    }
    let word = &buf[..word_end];
    word.eq_ignore_ascii_case(b"set")
        || UNSUPPORTED_STORAGE
            .iter()
            .any(|(w, _, _)| word.eq_ignore_ascii_case(w.as_bytes()))
}

/// A binary-protocol request: its header's opcode and opaque, once the 24 bytes are in.
fn parse_binary(buf: &[u8]) -> Parse<'_> {
    if buf.len() < BINARY_HEADER_BYTES {
        return Parse::Incomplete {
            bytes_needed: BINARY_HEADER_BYTES,
        };
    }
    let mut opaque = [0u8; 4];
    opaque.copy_from_slice(&buf[12..16]);
    Parse::Binary {
        opcode: buf[1],
        opaque,
    }
}

/// A storage command weir does not do: its data block is dropped, one reply (none
/// after a final `noreply`, except for `ms`, whose errors always answer). Without a
/// valid length the block cannot be found: reply and close.
fn refuse_storage<'a>(
    line_consumed: usize,
    tokens: Tokens<'a>,
    length_at: usize,
    reply: &'static [u8],
    meta: bool,
) -> Parse<'a> {
    let mut length = None;
    let mut last: Option<&[u8]> = None;
    for (i, token) in tokens.enumerate() {
        if i == length_at {
            length = parse_u64(token);
        }
        last = Some(token);
    }
    let Some(length) = length else {
        return Parse::Reject(Reject {
            close: true,
            ..Reject::new(line_consumed, reply::BAD_DATA_CHUNK)
        });
    };
    let noreply = !meta && last.is_some_and(|t| t.eq_ignore_ascii_case(b"noreply"));
    Parse::Reject(Reject {
        discard_bytes: length.saturating_add(2),
        noreply,
        ..Reject::new(line_consumed, reply)
    })
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

/// A key token as text: a key that is not UTF-8 cannot be a valid queue name.
fn key_str(token: &[u8]) -> Result<&str, &'static [u8]> {
    std::str::from_utf8(token).map_err(|_| KeyError::BadName.reply())
}

fn key_error(e: KeyError) -> &'static [u8] {
    e.reply()
}

/// `set KEY FLAGS EXPTIME BYTES [noreply]\r\nDATA\r\n`
fn parse_set<'a>(
    buf: &'a [u8],
    line_consumed: usize,
    tokens: Tokens<'a>,
    limits: &ParseLimits,
) -> Parse<'a> {
    let line = match parse_set_line(line_consumed, tokens, limits) {
        Ok(line) => line,
        Err(reject) => return Parse::Reject(reject),
    };
    let data_start = line_consumed;
    let data_end = data_start + line.length;
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
                ..Reject::new(data_end.min(buf.len()), reply::BAD_DATA_CHUNK)
            })
        }
    };
    Parse::Request {
        request: Request::Set {
            key: line.key,
            flags: line.flags,
            exptime: line.exptime,
            data: &buf[data_start..data_end],
            noreply: line.noreply,
        },
        consumed,
    }
}

/// The fields of a `set` line.
struct SetLine<'a> {
    key: WriteKey<'a>,
    flags: u32,
    exptime: i64,
    /// Bytes of the data block (within the item limit).
    length: usize,
    noreply: bool,
}

/// The line of a `set`, or how to refuse it: a line with a length but something
/// wrong drops the data block that follows (one reply, or none after `noreply`); a
/// line without a length loses the stream, and closes.
fn parse_set_line<'a>(
    line_consumed: usize,
    mut tokens: Tokens<'a>,
    limits: &ParseLimits,
) -> Result<SetLine<'a>, Reject> {
    let key = tokens.next();
    let flags = tokens.next();
    let exptime = tokens.next();
    let Some(length) = tokens.next().and_then(parse_u64) else {
        return Err(Reject {
            close: true,
            ..Reject::new(line_consumed, reply::BAD_DATA_CHUNK)
        });
    };
    let last = tokens.next();
    let extra = tokens.next().is_some();
    // `noreply` counts only as the last token: a malformed line is answered.
    let noreply = !extra && last.is_some_and(|t| t.eq_ignore_ascii_case(b"noreply"));
    let extra = extra || (last.is_some() && !noreply);
    let refuse = |reply| Reject {
        discard_bytes: length.saturating_add(2),
        noreply,
        ..Reject::new(line_consumed, reply)
    };
    if length > limits.item_size_bytes_max {
        return Err(refuse(reply::TOO_LARGE));
    }
    let flags = flags
        .and_then(parse_u64)
        .and_then(|f| u32::try_from(f).ok());
    let exptime = exptime.and_then(parse_i64);
    let (Some(key), Some(flags), Some(exptime), false) = (key, flags, exptime, extra) else {
        return Err(refuse(reply::BAD_FORMAT));
    };
    let key = key_str(key).map_err(refuse)?;
    let key = parse_write_key(key).map_err(|e| refuse(key_error(e)))?;
    // The item limit keeps `length` far below usize::MAX.
    let length = usize::try_from(length).map_err(|_| refuse(reply::TOO_LARGE))?;
    Ok(SetLine {
        key,
        flags,
        exptime,
        length,
        noreply,
    })
}

fn parse_get<'a>(
    tokens: Tokens<'a>,
    cas: bool,
    keys_max: usize,
    spans: &'a mut Vec<KeySpan>,
) -> Result<Request<'a>, &'static [u8]> {
    let text = tokens.rest_str().ok_or(KeyError::BadName.reply())?;
    match GetKeys::parse(text, keys_max, spans) {
        Ok(keys) => Ok(Request::Get { keys, cas }),
        Err(GetKeysError::None) => Err(reply::BAD_FORMAT),
        Err(GetKeysError::TooMany) => Err(reply::TOO_MANY_KEYS),
        Err(GetKeysError::Key(e)) => Err(key_error(e)),
    }
}

/// `delete KEY [0] [noreply]` (the `0` is memcache's old hold time, accepted for
/// clients that still send it).
fn parse_delete(mut tokens: Tokens<'_>) -> Result<Request<'_>, &'static [u8]> {
    let key = key_str(tokens.next().ok_or(reply::BAD_FORMAT)?)?;
    let key = parse_plain_key(key).map_err(key_error)?;
    let mut noreply = false;
    let mut hold_time = false;
    for token in tokens {
        if token.eq_ignore_ascii_case(b"noreply") && !noreply {
            noreply = true;
        } else if token == b"0" && !hold_time && !noreply {
            hold_time = true;
        } else {
            return Err(reply::BAD_FORMAT);
        }
    }
    Ok(Request::Delete { key, noreply })
}

/// `COMMAND KEY [noreply]` where the key takes no options.
fn one_key(mut tokens: Tokens<'_>, noreply_ok: bool) -> Result<(ReadKey<'_>, bool), &'static [u8]> {
    let key = key_str(tokens.next().ok_or(reply::BAD_FORMAT)?)?;
    let key = parse_plain_key(key).map_err(key_error)?;
    let noreply = match tokens.next() {
        None => false,
        Some(t) if noreply_ok && t.eq_ignore_ascii_case(b"noreply") => true,
        Some(_) => return Err(reply::BAD_FORMAT),
    };
    if tokens.next().is_some() {
        return Err(reply::BAD_FORMAT);
    }
    Ok((key, noreply))
}

/// `flush_expired QUEUE`: a queue, not a reader (`CLIENT_ERROR bad queue name`, as
/// for `set`): the engine expires a queue's items for all its readers at once, so a
/// reader key could only be misread as asking for less than it does.
fn parse_flush_expired(tokens: Tokens<'_>) -> Result<Request<'_>, &'static [u8]> {
    let (key, _) = one_key(tokens, false)?;
    if !key.reader.is_empty() {
        return Err(KeyError::BadName.reply());
    }
    Ok(Request::FlushExpired { queue: key.queue })
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
            return Err(reply::BAD_FORMAT);
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
        Some(_) => Err(reply::BAD_FORMAT),
    }
}

/// `stats`, `stats settings`, `stats reset`; any other argument is `ERROR`, as
/// memcached answers a statistics group it does not have (weir has no slabs, items
/// per slab class, sizes or per-connection statistics).
fn parse_stats(mut tokens: Tokens<'_>) -> Result<Request<'_>, &'static [u8]> {
    let request = match tokens.next() {
        None => Request::Stats,
        Some(t) if t.eq_ignore_ascii_case(b"settings") => Request::StatsSettings,
        Some(t) if t.eq_ignore_ascii_case(b"reset") => Request::StatsReset,
        Some(_) => return Err(reply::ERROR),
    };
    match tokens.next() {
        None => Ok(request),
        Some(_) => Err(reply::ERROR),
    }
}

fn parse_dump_stats(tokens: Tokens<'_>) -> Result<Request<'_>, &'static [u8]> {
    let names = tokens.rest_str().ok_or(KeyError::BadName.reply())?;
    for name in names.split(' ').filter(|n| !n.is_empty()) {
        if weir::validate_queue_name(name).is_err() {
            return Err(KeyError::BadName.reply());
        }
    }
    Ok(Request::DumpStats { names })
}

/// `monitor KEY SECONDS [MAX_ITEMS]`
fn parse_monitor(mut tokens: Tokens<'_>) -> Result<Request<'_>, &'static [u8]> {
    let key = key_str(tokens.next().ok_or(reply::BAD_FORMAT)?)?;
    let key = parse_plain_key(key).map_err(key_error)?;
    if crate::request::is_reserved(key.queue) {
        return Err(KeyError::Reserved.reply());
    }
    let seconds = tokens.next().and_then(parse_u64).ok_or(reply::BAD_FORMAT)?;
    let items_max = match tokens.next() {
        None => None,
        Some(t) => Some(parse_u64(t).ok_or(reply::BAD_FORMAT)?),
    };
    if tokens.next().is_some() {
        return Err(reply::BAD_FORMAT);
    }
    Ok(Request::Monitor {
        key,
        seconds,
        items_max,
    })
}

/// `confirm KEY COUNT`
fn parse_confirm(mut tokens: Tokens<'_>) -> Result<Request<'_>, &'static [u8]> {
    let key = key_str(tokens.next().ok_or(reply::BAD_FORMAT)?)?;
    let key = parse_plain_key(key).map_err(key_error)?;
    let count = tokens.next().and_then(parse_u64).ok_or(reply::BAD_FORMAT)?;
    if tokens.next().is_some() {
        return Err(reply::BAD_FORMAT);
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
            get_keys_max: 4,
        }
    }

    fn request(buf: &[u8]) -> (Request<'_>, usize) {
        // The request borrows the key buffer as long as `buf`: a few bytes leaked per
        // call keep the tests short.
        let keys = Box::leak(Box::new(Vec::new()));
        match parse(buf, &limits(), keys) {
            Parse::Request { request, consumed } => (request, consumed),
            other => panic!("{other:?}"),
        }
    }

    fn reject(buf: &[u8]) -> Reject {
        match parse(buf, &limits(), &mut Vec::new()) {
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
                key: parse_write_key("q").unwrap(),
                flags: 5,
                exptime: 0,
                data: b"abc",
                noreply: false
            }
        );
        for cut in 0..18 {
            match parse(&buf[..cut], &limits(), &mut Vec::new()) {
                Parse::Incomplete { .. } => {}
                other => panic!("cut {cut}: {other:?}"),
            }
        }
        assert_eq!(
            parse(b"set q 0 0 3\r\nab", &limits(), &mut Vec::new()),
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
        assert_eq!((r.reply, r.close), (crate::reply::BAD_DATA_CHUNK, true));
        let r = reject(b"set q 0 0 -3\r\n");
        assert_eq!((r.reply, r.close), (crate::reply::BAD_DATA_CHUNK, true));
        let r = reject(b"set q 0 0 x\r\n");
        assert!(r.close);
        let r = reject(b"set q 0 0 101\r\n");
        assert_eq!(
            (r.reply, r.close, r.discard_bytes, r.consumed),
            (crate::reply::TOO_LARGE, false, 103, 15)
        );
        let r = reject(b"set q x 0 1\r\n");
        assert_eq!((r.reply, r.discard_bytes), (crate::reply::BAD_FORMAT, 3));
        let r = reject(b"set q 4294967296 0 1\r\n");
        assert_eq!(r.reply, crate::reply::BAD_FORMAT);
        let r = reject(b"set q 0 0 1 bogus\r\n");
        assert_eq!(r.reply, crate::reply::BAD_FORMAT);
        let r = reject(b"set a.b 0 0 1 noreply\r\n");
        assert_eq!((r.reply, r.noreply), (KeyError::BadName.reply(), true));
    }

    #[test]
    fn lines() {
        assert_eq!(reject(b"\r\n").reply, crate::reply::ERROR);
        assert_eq!(reject(b"bogus\r\n").reply, crate::reply::ERROR);
        assert_eq!(reject(b"get\r\n").reply, crate::reply::BAD_FORMAT);
        assert_eq!(reject(b"get   \r\n").reply, crate::reply::BAD_FORMAT);
        let (req, _) = request(b"GeT a b.c/open\r\n");
        assert_eq!(
            req,
            Request::Get {
                keys: GetKeys::parse("a b.c/open", 4, &mut Vec::new()).unwrap(),
                cas: false
            }
        );
        let long = [b'a'; 70];
        let r = reject(&long);
        assert_eq!(
            (r.reply, r.skip_line, r.close, r.consumed),
            (crate::reply::LINE_TOO_LONG, true, false, 70)
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
        assert!(matches!(
            parse(&line, &limits(), &mut Vec::new()),
            Parse::Request { .. }
        ));
        assert_eq!(
            parse(&line[..line.len() - 1], &limits(), &mut Vec::new()),
            Parse::Incomplete { bytes_needed: 0 }
        );
    }

    #[test]
    #[allow(clippy::too_many_lines)] // one scenario, step by step
    fn other_commands() {
        assert_eq!(
            request(b"delete q noreply\r\n").0,
            Request::Delete {
                key: parse_plain_key("q").unwrap(),
                noreply: true
            }
        );
        assert_eq!(
            request(b"flush_all 0 noreply\r\n").0,
            Request::FlushAll { noreply: true }
        );
        assert_eq!(reject(b"flush_all 5\r\n").reply, crate::reply::BAD_FORMAT);
        assert_eq!(
            request(b"flush q.r\r\n").0,
            Request::Flush {
                key: parse_plain_key("q.r").unwrap(),
                noreply: false
            }
        );
        assert_eq!(
            request(b"monitor q 5 10\r\n").0,
            Request::Monitor {
                key: parse_plain_key("q").unwrap(),
                seconds: 5,
                items_max: Some(10)
            }
        );
        assert_eq!(
            request(b"confirm q 2\r\n").0,
            Request::Confirm {
                key: parse_plain_key("q").unwrap(),
                count: 2
            }
        );
        assert_eq!(request(b"version x\r\n").0, Request::Version);
        assert_eq!(request(b"quit now\r\n").0, Request::Quit);
        assert_eq!(request(b"stats settings\r\n").0, Request::StatsSettings);
        assert_eq!(request(b"STATS reset\r\n").0, Request::StatsReset);
        for other in [
            &b"stats items\r\n"[..],
            b"stats slabs\r\n",
            b"stats reset now\r\n",
        ] {
            assert_eq!(reject(other).reply, crate::reply::ERROR);
        }
        assert_eq!(reject(b"delete q 0 0\r\n").reply, crate::reply::BAD_FORMAT);
        assert_eq!(
            reject(b"delete q noreply 0\r\n").reply,
            crate::reply::BAD_FORMAT
        );
        assert!(matches!(
            request(b"delete q 0 noreply\r\n").0,
            Request::Delete { noreply: true, .. }
        ));
        assert!(matches!(
            request(b"delete q 0\r\n").0,
            Request::Delete { noreply: false, .. }
        ));
        assert_eq!(
            request(b"dump_stats a b\r\n").0,
            Request::DumpStats { names: "a b" }
        );
        assert_eq!(request(b"stats\r\n").0, Request::Stats);
        assert_eq!(
            request(b"flush_expired q\r\n").0,
            Request::FlushExpired { queue: "q" }
        );
        for reader_key in [&b"flush_expired q.r\r\n"[..], b"flush_expired q+r\r\n"] {
            assert_eq!(reject(reader_key).reply, KeyError::BadName.reply());
        }
        assert_eq!(
            reject(b"flush_expired q/open\r\n").reply,
            KeyError::BadOption.reply()
        );
        assert_eq!(
            reject(b"flush_expired q x\r\n").reply,
            crate::reply::BAD_FORMAT
        );
    }

    #[test]
    fn keys_that_are_not_utf8_are_bad_names() {
        let bad = KeyError::BadName.reply();
        for line in [
            &b"get \xff\r\n"[..],
            b"get ok \xfe\r\n",
            b"delete \xff\r\n",
            b"flush \xff\r\n",
            b"monitor \xff 1\r\n",
            b"confirm \xff 1\r\n",
            b"dump_stats \xff\r\n",
        ] {
            assert_eq!(reject(line).reply, bad, "{}", String::from_utf8_lossy(line));
        }
        let r = reject(b"set \xff 0 0 1\r\nx\r\n");
        assert_eq!((r.reply, r.discard_bytes), (bad, 3));
    }

    #[test]
    fn noreply_counts_only_as_the_last_token() {
        let r = reject(b"set q 0 0 1 noreply extra\r\nx\r\n");
        assert_eq!(
            (r.reply, r.noreply, r.discard_bytes),
            (crate::reply::BAD_FORMAT, false, 3)
        );
        let r = reject(b"set q.r 0 0 1 noreply\r\nx\r\n");
        assert!(r.noreply);
    }

    #[test]
    fn storage_commands_weir_does_not_do_drop_their_block() {
        for (line, length) in [
            (&b"add k 0 0 13\r\n"[..], 13),
            (b"replace k 0 0 2\r\n", 2),
            (b"APPEND k 0 0 0\r\n", 0),
            (b"prepend k 1 2 3\r\n", 3),
            (b"cas k 0 0 4 99\r\n", 4),
            (b"ms k 5 T10\r\n", 5),
        ] {
            let r = reject(line);
            assert!(r.reply.starts_with(b"CLIENT_ERROR "), "{:?}", r);
            assert_eq!(
                (r.consumed, r.discard_bytes, r.close, r.noreply),
                (line.len(), length + 2, false, false)
            );
        }
        let r = reject(b"add k 0 0 1 noreply\r\n");
        assert!(r.noreply && !r.close);
        // The meta command's errors always answer.
        assert!(!reject(b"ms k 1 noreply\r\n").noreply);
        // No length to find the block by: close.
        for line in [
            &b"add k 0 0\r\n"[..],
            b"cas k 0 0 x 1\r\n",
            b"ms k\r\n",
            b"add\r\n",
        ] {
            let r = reject(line);
            assert_eq!((r.reply, r.close), (crate::reply::BAD_DATA_CHUNK, true));
        }
        // A line too long: its block cannot be found either.
        let mut line = b"add ".to_vec();
        line.extend_from_slice(&[b'k'; 80]);
        line.extend_from_slice(b" 0 0 1\r\n");
        assert!(reject(&line).close);
        assert!(reject(&line[..70]).close);
        let mut get = b"get ".to_vec();
        get.extend_from_slice(&[b'k'; 80]);
        assert!(!reject(&get).close);
    }

    #[test]
    fn gets_have_a_key_count_limit() {
        assert!(matches!(request(b"get a b c d\r\n").0, Request::Get { .. }));
        assert_eq!(
            reject(b"get a b c d e\r\n").reply,
            crate::reply::TOO_MANY_KEYS
        );
    }

    #[test]
    fn a_binary_request_is_answered_in_binary() {
        let mut req = vec![
            0x80, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef,
        ];
        assert_eq!(
            parse(&req, &limits(), &mut Vec::new()),
            Parse::Incomplete { bytes_needed: 24 }
        );
        req.extend_from_slice(&[0u8; 8]);
        let Parse::Binary { opcode, opaque } = parse(&req, &limits(), &mut Vec::new()) else {
            panic!("not a binary request");
        };
        let reply = binary_error(opcode, opaque);
        assert_eq!(&reply[..2], &[0x81, 0x0a]);
        assert_eq!(&reply[6..8], &[0x00, 0x81], "status: unknown command");
        assert_eq!(&reply[12..16], &[0xde, 0xad, 0xbe, 0xef], "opaque echoed");
        let body = u32::from_be_bytes([reply[8], reply[9], reply[10], reply[11]]) as usize;
        assert_eq!(reply.len(), 24 + body);
    }
}
