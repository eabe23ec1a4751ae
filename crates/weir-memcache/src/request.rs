//! Key syntax of the Kestrel dialect: which queue, which reader, which options.
//!
//! A read key is `QUEUE`, `QUEUE.READER` or `QUEUE+READER`, then options, each after a
//! `/`, in any order: `open`, `close`, `abort`, `peek`, `touch`, `t=MS`. A write key (for `set`)
//! is one queue or several joined by `+` (`a+b+c` appends to each), then the option
//! `sync`. The two differ because `+` means "reader" when reading and "and" when
//! writing, as in Kestrel's fanout queues.
//!
//! Everything here is pure and allocation-free: keys borrow from the request line, so
//! the parser can check a whole request before anything runs, and the fuzz target and
//! the proptest can drive it without a socket.

use crate::reply;
use weir_backend::{validate_queue_name, validate_reader_name};

/// Most queues one `set` may name (`a+b+c`); the line length bounds it anyway, this
/// keeps the fan-out of a single request small and predictable.
pub const SET_QUEUES_MAX: usize = 16;

/// Why a key was refused; each maps onto one `CLIENT_ERROR` reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyError {
    BadName,
    BadOption,
    AbortNotAlone,
    TouchNotAlone,
    PeekCombined,
    TooManyQueues,
    /// A queue of the bus or the proxy ([`is_reserved`]).
    Reserved,
}

impl KeyError {
    /// The full reply line.
    pub fn reply(self) -> &'static [u8] {
        match self {
            KeyError::BadName => reply::BAD_QUEUE_NAME,
            KeyError::BadOption => reply::BAD_OPTION,
            KeyError::AbortNotAlone => reply::ABORT_NOT_ALONE,
            KeyError::TouchNotAlone => reply::TOUCH_NOT_ALONE,
            KeyError::PeekCombined => reply::PEEK_COMBINED,
            KeyError::TooManyQueues => reply::TOO_MANY_QUEUES_IN_KEY,
            KeyError::Reserved => reply::RESERVED_QUEUE,
        }
    }
}

/// Whether `queue` belongs to the event bus (`bus:*`) or the proxy
/// (`proxy:capture:*`). Their owners name every reader such a queue has; a `get` (or
/// a `set`, on JetStream) of one would add a default reader that nobody reads, which
/// keeps every item, and items a `set` adds are not theirs. So `set`, `get` and
/// `monitor` refuse them, `delete` and `flush` too unless `reserved_queues_writable`,
/// and `flush_all` leaves them alone; `stats` shows them.
pub fn is_reserved(queue: &str) -> bool {
    weir_backend::is_reserved(queue)
}

/// The options of a read key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadOptions {
    pub open: bool,
    pub close: bool,
    pub abort: bool,
    pub peek: bool,
    /// Extend this connection's open reads on the reader (weir's own option).
    pub touch: bool,
    /// `t=MS`: wait up to this long for an item. Not yet clamped to the server's limit.
    pub wait_ms: Option<u64>,
}

impl ReadOptions {
    /// A plain take: no lease, no peek, no confirm, no release.
    pub fn is_plain(&self) -> bool {
        !(self.open || self.close || self.abort || self.peek || self.touch)
    }

    /// Whether the request reads an item at all (`close`, `abort` and `touch` alone
    /// do not).
    pub fn takes(&self) -> bool {
        self.open || self.peek || self.is_plain()
    }
}

/// A parsed read key: `get`, `delete`, `flush`, `monitor`, `confirm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadKey<'a> {
    /// The key as the client sent it (replies echo it).
    pub text: &'a str,
    pub queue: &'a str,
    /// "" is the default reader.
    pub reader: &'a str,
    pub options: ReadOptions,
}

/// A read key of a `get`, as byte offsets into the request's key text, so the parser
/// can keep the keys of a request in a buffer the connection reuses (no allocation
/// per request, no lifetime tying the buffer to one read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeySpan {
    /// `text` is `keys[start..end]`.
    start: usize,
    end: usize,
    /// `queue` is `keys[start..queue_end]`.
    queue_end: usize,
    /// `reader` is `keys[reader_start..reader_end]` (empty for the default reader).
    reader_start: usize,
    reader_end: usize,
    options: ReadOptions,
}

/// Offset of `part` in `base`; `part` is a slice of `base`.
fn offset_in(base: &str, part: &str) -> usize {
    let offset = (part.as_ptr() as usize).wrapping_sub(base.as_ptr() as usize);
    assert!(offset + part.len() <= base.len());
    offset
}

impl KeySpan {
    /// The span of `key`, a key parsed from a slice of `keys`.
    fn of(keys: &str, key: &ReadKey<'_>) -> KeySpan {
        let start = offset_in(keys, key.text);
        let (reader_start, reader_end) = if key.reader.is_empty() {
            (start, start)
        } else {
            let at = offset_in(keys, key.reader);
            (at, at + key.reader.len())
        };
        KeySpan {
            start,
            end: start + key.text.len(),
            queue_end: offset_in(keys, key.queue) + key.queue.len(),
            reader_start,
            reader_end,
            options: key.options,
        }
    }

    /// The key again, over the same `keys` it was parsed from.
    fn key<'a>(&self, keys: &'a str) -> ReadKey<'a> {
        ReadKey {
            text: &keys[self.start..self.end],
            queue: &keys[self.start..self.queue_end],
            reader: &keys[self.reader_start..self.reader_end],
            options: self.options,
        }
    }
}

/// The keys of one `get`, each parsed once, by the parser, in the order sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GetKeys<'a> {
    /// The keys as sent, separated by spaces.
    text: &'a str,
    spans: &'a [KeySpan],
}

impl<'a> GetKeys<'a> {
    /// Parses `text` (keys separated by spaces) into `spans`: at least one key, at
    /// most `keys_max`, each a valid read key.
    pub fn parse(
        text: &'a str,
        keys_max: usize,
        spans: &'a mut Vec<KeySpan>,
    ) -> Result<GetKeys<'a>, GetKeysError> {
        spans.clear();
        for key in text.split(' ').filter(|k| !k.is_empty()) {
            if spans.len() == keys_max {
                return Err(GetKeysError::TooMany);
            }
            let key = parse_read_key(key).map_err(GetKeysError::Key)?;
            if is_reserved(key.queue) {
                return Err(GetKeysError::Key(KeyError::Reserved));
            }
            spans.push(KeySpan::of(text, &key));
        }
        if spans.is_empty() {
            return Err(GetKeysError::None);
        }
        Ok(GetKeys { text, spans })
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The keys, in the order sent.
    pub fn iter(&self) -> impl Iterator<Item = ReadKey<'a>> + 'a {
        let text = self.text;
        self.spans.iter().map(move |span| span.key(text))
    }
}

/// Why a `get` line's keys were refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GetKeysError {
    None,
    TooMany,
    Key(KeyError),
}

/// A parsed write key: `set`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteKey<'a> {
    /// One queue name or several joined by `+`; every one is valid.
    names: &'a str,
    pub sync: bool,
}

impl<'a> WriteKey<'a> {
    /// The queues to append to, in the order given.
    pub fn queues(&self) -> impl Iterator<Item = &'a str> {
        self.names.split('+')
    }
}

/// Splits `NAME/opt/opt` into the name part and the options part (without the `/`).
fn split_options(key: &str) -> (&str, &str) {
    match key.find('/') {
        Some(i) => (&key[..i], &key[i + 1..]),
        None => (key, ""),
    }
}

/// Parses a read key with its options and checks the combination rules.
pub fn parse_read_key(key: &str) -> Result<ReadKey<'_>, KeyError> {
    let (name, options_text) = split_options(key);
    let (queue, reader) = match name.find(['.', '+']) {
        Some(i) => {
            let reader = &name[i + 1..];
            if reader.is_empty() {
                return Err(KeyError::BadName);
            }
            (&name[..i], reader)
        }
        None => (name, ""),
    };
    if validate_queue_name(queue).is_err() || validate_reader_name(reader).is_err() {
        return Err(KeyError::BadName);
    }
    let mut options = ReadOptions::default();
    if !options_text.is_empty() || key.ends_with('/') {
        for option in options_text.split('/') {
            if option.eq_ignore_ascii_case("open") {
                options.open = true;
            } else if option.eq_ignore_ascii_case("close") {
                options.close = true;
            } else if option.eq_ignore_ascii_case("abort") {
                options.abort = true;
            } else if option.eq_ignore_ascii_case("peek") {
                options.peek = true;
            } else if option.eq_ignore_ascii_case("touch") {
                options.touch = true;
            } else if option.len() > 2 && option.as_bytes()[..2].eq_ignore_ascii_case(b"t=") {
                let ms = parse_u64(&option.as_bytes()[2..]).ok_or(KeyError::BadOption)?;
                options.wait_ms = Some(ms);
            } else {
                return Err(KeyError::BadOption);
            }
        }
    }
    if options.abort && (options.open || options.close || options.peek || options.touch) {
        return Err(KeyError::AbortNotAlone);
    }
    if options.touch && (options.open || options.close || options.peek) {
        return Err(KeyError::TouchNotAlone);
    }
    if options.peek && (options.open || options.close) {
        return Err(KeyError::PeekCombined);
    }
    Ok(ReadKey {
        text: key,
        queue,
        reader,
        options,
    })
}

/// Parses a key that names a queue or a reader and takes no options (`delete`,
/// `flush`, `monitor`, `confirm`).
pub fn parse_plain_key(key: &str) -> Result<ReadKey<'_>, KeyError> {
    let parsed = parse_read_key(key)?;
    if key.contains('/') {
        return Err(KeyError::BadOption);
    }
    Ok(parsed)
}

/// Parses a `set` key: `q`, `a+b+c`, with the option `sync`.
pub fn parse_write_key(key: &str) -> Result<WriteKey<'_>, KeyError> {
    let (names, options_text) = split_options(key);
    let mut count = 0;
    for name in names.split('+') {
        count += 1;
        if count > SET_QUEUES_MAX {
            return Err(KeyError::TooManyQueues);
        }
        if validate_queue_name(name).is_err() {
            return Err(KeyError::BadName);
        }
        if is_reserved(name) {
            return Err(KeyError::Reserved);
        }
    }
    let mut sync = false;
    if !options_text.is_empty() || key.ends_with('/') {
        for option in options_text.split('/') {
            if option.eq_ignore_ascii_case("sync") {
                sync = true;
            } else {
                return Err(KeyError::BadOption);
            }
        }
    }
    Ok(WriteKey { names, sync })
}

/// A decimal u64 of ASCII digits only (no sign, no spaces); `None` on anything else or
/// on overflow.
pub fn parse_u64(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 20 {
        return None;
    }
    let mut value: u64 = 0;
    for &b in text {
        if !b.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(value)
}

/// A decimal i64 with an optional leading `-`.
pub fn parse_i64(text: &[u8]) -> Option<i64> {
    match text.split_first() {
        Some((b'-', rest)) => {
            let magnitude = parse_u64(rest)?;
            0i64.checked_sub_unsigned(magnitude)
        }
        _ => i64::try_from(parse_u64(text)?).ok(),
    }
}

/// memcache's EXPTIME as a Unix time in milliseconds (0 = never): 0 is never, up to 30
/// days is seconds from now, larger is a Unix time in seconds, negative is already
/// expired (1 ms after the epoch, so it is never delivered).
pub fn expires_at_ms(exptime: i64, now_ms: u64) -> u64 {
    const RELATIVE_SECONDS_MAX: i64 = 30 * 24 * 60 * 60;
    if exptime == 0 {
        0
    } else if exptime < 0 {
        1
    } else if exptime <= RELATIVE_SECONDS_MAX {
        now_ms.saturating_add((exptime as u64).saturating_mul(1000))
    } else {
        (exptime as u64).saturating_mul(1000).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_keys() {
        let k = parse_read_key("jobs").unwrap();
        assert_eq!((k.queue, k.reader), ("jobs", ""));
        assert!(k.options.is_plain());
        let k = parse_read_key("jobs.audit/open/t=250").unwrap();
        assert_eq!((k.queue, k.reader), ("jobs", "audit"));
        assert!(k.options.open);
        assert_eq!(k.options.wait_ms, Some(250));
        let k = parse_read_key("jobs+audit/CLOSE/open").unwrap();
        assert_eq!((k.queue, k.reader), ("jobs", "audit"));
        assert!(k.options.open && k.options.close);
        assert_eq!(
            parse_read_key("jobs/abort/open"),
            Err(KeyError::AbortNotAlone)
        );
        let touch = parse_read_key("jobs.w/TOUCH").unwrap();
        assert!(touch.options.touch && !touch.options.takes() && !touch.options.is_plain());
        assert_eq!(
            parse_read_key("jobs/touch/t=5").map(|k| k.options.wait_ms),
            Ok(Some(5))
        );
        for bad in ["jobs/touch/open", "jobs/close/touch", "jobs/peek/touch"] {
            assert_eq!(parse_read_key(bad), Err(KeyError::TouchNotAlone), "{bad}");
        }
        assert_eq!(
            parse_read_key("jobs/touch/abort"),
            Err(KeyError::AbortNotAlone)
        );
        assert_eq!(
            parse_read_key("jobs/peek/close"),
            Err(KeyError::PeekCombined)
        );
        assert_eq!(parse_read_key("jobs/nope"), Err(KeyError::BadOption));
        assert_eq!(parse_read_key("jobs/"), Err(KeyError::BadOption));
        assert_eq!(parse_read_key("jobs//open"), Err(KeyError::BadOption));
        assert_eq!(parse_read_key("jobs/t="), Err(KeyError::BadOption));
        assert_eq!(parse_read_key("jobs/t=-1"), Err(KeyError::BadOption));
        assert_eq!(parse_read_key("jobs/\u{e9}x"), Err(KeyError::BadOption));
        assert_eq!(parse_read_key("jobs."), Err(KeyError::BadName));
        assert_eq!(parse_read_key("a.b.c"), Err(KeyError::BadName));
        assert_eq!(parse_read_key(""), Err(KeyError::BadName));
        assert_eq!(parse_read_key("../etc"), Err(KeyError::BadName));
        assert_eq!(parse_plain_key("q/open"), Err(KeyError::BadOption));
        assert!(parse_plain_key("q.r").is_ok());
    }

    #[test]
    fn get_keys_are_parsed_once_and_read_back_whole() {
        let mut spans = Vec::new();
        let text = "a  jobs.audit/open/t=5 q+r/peek b";
        let keys = GetKeys::parse(text, 4, &mut spans).unwrap();
        let expected: Vec<ReadKey<'_>> = text
            .split(' ')
            .filter(|k| !k.is_empty())
            .map(|k| parse_read_key(k).unwrap())
            .collect();
        assert_eq!(keys.iter().collect::<Vec<_>>(), expected);
        assert_eq!(keys.len(), 4);
        let mut spans = Vec::new();
        assert_eq!(
            GetKeys::parse("a b c", 2, &mut spans),
            Err(GetKeysError::TooMany)
        );
        let mut spans = Vec::new();
        assert_eq!(GetKeys::parse("  ", 2, &mut spans), Err(GetKeysError::None));
        let mut spans = Vec::new();
        assert_eq!(
            GetKeys::parse("a b/nope", 2, &mut spans),
            Err(GetKeysError::Key(KeyError::BadOption))
        );
    }

    #[test]
    fn write_keys() {
        let k = parse_write_key("a+b+c/sync").unwrap();
        assert!(k.sync);
        assert_eq!(k.queues().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(parse_write_key("a.b"), Err(KeyError::BadName));
        assert_eq!(parse_write_key("a++b"), Err(KeyError::BadName));
        assert_eq!(parse_write_key("a/open"), Err(KeyError::BadOption));
        let many = vec!["q"; SET_QUEUES_MAX + 1].join("+");
        assert_eq!(parse_write_key(&many), Err(KeyError::TooManyQueues));
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_u64(b"0"), Some(0));
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b"+1"), None);
        assert_eq!(parse_i64(b"-5"), Some(-5));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_i64(b"9223372036854775808"), None);
        assert_eq!(parse_i64(b"-"), None);
    }

    #[test]
    fn expiry() {
        let now = 1_700_000_000_000;
        assert_eq!(expires_at_ms(0, now), 0);
        assert_eq!(expires_at_ms(-1, now), 1);
        assert_eq!(expires_at_ms(10, now), now + 10_000);
        assert_eq!(expires_at_ms(2_592_000, now), now + 2_592_000_000);
        assert_eq!(expires_at_ms(2_592_001, now), 2_592_001_000);
        assert_eq!(expires_at_ms(i64::MAX, now), u64::MAX);
    }
}
