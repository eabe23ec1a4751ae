//! `Inbound`: the bytes a client sent and the framing state over them.
//!
//! This is where a byte stream becomes requests, and the only place that decides how
//! many bytes each one spans. [`Inbound::next_request`] hands out the request at the
//! front of the buffer, borrowed (no copy), or says to read more, or says how the
//! parser refused what it saw. The bytes of what it hands out are dropped at the next
//! call, so a caller never advances the buffer itself and cannot get it wrong.
//!
//! Two refusal states outlive one call: bytes still to drop (the data block of a
//! refused storage command, which may arrive later) and "drop through the end of
//! this line" (a line too long whose end has not arrived). No socket here: the tests
//! below drive it with bytes.

use bytes::{Buf, BytesMut};

use crate::parse::{parse, Parse, ParseLimits, Request};
use crate::request::KeySpan;

/// Capacity of a fresh read buffer.
pub const BUFFER_BYTES_INITIAL: usize = 1024;
/// A buffer grown past this is replaced by a fresh one once it is empty.
pub const BUFFER_BYTES_RETAINED_MAX: usize = 64 * 1024;
/// Parsed `get` keys whose room is kept between requests; a request of more gets a
/// buffer of its own size, given back afterwards.
const GET_KEYS_RETAINED_MAX: usize = 64;
/// Free room below which a read first makes the buffer larger.
const READ_ROOM_BYTES_MIN: usize = 512;

/// What is at the front of the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Next<'a> {
    /// No complete request: read more.
    NeedMore,
    /// A request to run; its bytes are dropped at the next call.
    Request(Request<'a>),
    /// The parser refused the front of the buffer. The refused bytes are dropped at
    /// the next call (and a data block that follows them, as it arrives).
    Refused {
        /// The full reply line.
        reply: &'static [u8],
        /// The request said `noreply`: send nothing.
        noreply: bool,
        /// The stream cannot be trusted any more: reply, then close.
        close: bool,
    },
    /// A binary-protocol request: answer with `parse::binary_error`, then close.
    Binary { opcode: u8, opaque: [u8; 4] },
}

#[derive(Debug)]
pub struct Inbound {
    /// Bytes received and not yet dropped.
    input: BytesMut,
    /// The keys of the last `get` handed out (see [`KeySpan`]).
    get_keys: Vec<KeySpan>,
    /// Bytes at the front of `input` handed out by the last call (a request or a
    /// refusal), dropped at the next.
    handed_out: usize,
    /// Bytes still to drop after `handed_out` (a refused data block).
    discard_bytes: u64,
    /// Drop everything up to the next `\n` before the next request.
    skip_line: bool,
    /// Buffer length that completes the request at the front, when the parser knows
    /// it (a `set` whose line is in); the next read makes room for it.
    bytes_needed: usize,
    /// `input` (then starting at this address) was searched for a line end up to this
    /// length without finding one. A long line trickling in a byte at a time would
    /// otherwise be searched from its start on every read: quadratic in its length.
    /// Any change to the buffer's start (bytes dropped, a reallocation) makes the
    /// address differ, and the memo is dropped.
    no_line_end_before: Option<(usize, usize)>,
}

impl Default for Inbound {
    fn default() -> Self {
        Inbound {
            input: BytesMut::with_capacity(BUFFER_BYTES_INITIAL),
            get_keys: Vec::new(),
            handed_out: 0,
            discard_bytes: 0,
            skip_line: false,
            bytes_needed: 0,
            no_line_end_before: None,
        }
    }
}

impl Inbound {
    /// The request at the front of the buffer (see [`Next`]). Drops what the previous
    /// call handed out first.
    pub fn next_request(&mut self, limits: &ParseLimits) -> Next<'_> {
        assert!(self.handed_out <= self.input.len());
        self.input.advance(std::mem::take(&mut self.handed_out));
        self.bytes_needed = 0;
        if !self.drop_refused_rest() || self.input.is_empty() {
            return Next::NeedMore;
        }
        if self.line_still_incomplete(limits.line_bytes_max) {
            // A long line trickling in: only the new bytes were looked at.
            return Next::NeedMore;
        }
        // Every arm below changes fields other than `input` only: the request handed
        // out borrows `input` until the next call.
        match parse(&self.input, limits, &mut self.get_keys) {
            Parse::Incomplete { bytes_needed } => {
                self.bytes_needed = bytes_needed;
                if bytes_needed == 0 {
                    self.no_line_end_before =
                        Some((self.input.as_ptr() as usize, self.input.len()));
                }
                Next::NeedMore
            }
            Parse::Binary { opcode, opaque } => Next::Binary { opcode, opaque },
            Parse::Reject(r) => {
                assert!(r.consumed >= 1 && r.consumed <= self.input.len());
                self.handed_out = r.consumed;
                self.discard_bytes = r.discard_bytes;
                self.skip_line = r.skip_line;
                Next::Refused {
                    reply: r.reply,
                    noreply: r.noreply,
                    close: r.close,
                }
            }
            Parse::Request { request, consumed } => {
                assert!(consumed >= 1 && consumed <= self.input.len());
                self.handed_out = consumed;
                Next::Request(request)
            }
        }
    }

    /// Whether a request has begun but not ended (so a timeout applies).
    pub fn is_mid_request(&self) -> bool {
        self.input.len() > self.handed_out || self.discard_bytes > 0 || self.skip_line
    }

    /// Appends bytes that arrived outside [`Inbound::buffer_for_read`] (read ahead
    /// while a command waited).
    pub fn receive(&mut self, bytes: &[u8]) {
        self.input.extend_from_slice(bytes);
    }

    /// The buffer to read into, with room for at least what the request at the front
    /// needs.
    pub fn buffer_for_read(&mut self) -> &mut BytesMut {
        if self.bytes_needed > self.input.len() {
            self.input.reserve(self.bytes_needed - self.input.len());
        }
        if self.input.capacity() - self.input.len() < READ_ROOM_BYTES_MIN {
            self.input.reserve(BUFFER_BYTES_INITIAL);
        }
        &mut self.input
    }

    /// Gives back buffers that grew for a large item or a long `get`, once nothing is
    /// left in them.
    pub fn shrink(&mut self) {
        if self.get_keys.capacity() > GET_KEYS_RETAINED_MAX {
            self.get_keys = Vec::new();
        }
        if self.input.len() == self.handed_out && self.input.capacity() > BUFFER_BYTES_RETAINED_MAX
        {
            self.input = BytesMut::with_capacity(BUFFER_BYTES_INITIAL);
            self.handed_out = 0;
            self.no_line_end_before = None;
        }
    }

    /// Drops what a refused request left behind; true when what is left in `input`
    /// starts a new request.
    fn drop_refused_rest(&mut self) -> bool {
        if self.discard_bytes > 0 {
            let n = usize::try_from(self.discard_bytes)
                .unwrap_or(usize::MAX)
                .min(self.input.len());
            self.input.advance(n);
            self.discard_bytes -= n as u64;
            if self.discard_bytes > 0 {
                return false;
            }
        }
        if self.skip_line {
            match memchr::memchr(b'\n', &self.input) {
                Some(i) => {
                    self.input.advance(i + 1);
                    self.skip_line = false;
                }
                None => {
                    self.input.clear();
                    return false;
                }
            }
        }
        true
    }

    /// Whether `input` still holds no line end, looking only at the bytes that
    /// arrived since the parser last found none; false once one is there, or the
    /// line is too long (the parser refuses it then).
    fn line_still_incomplete(&mut self, line_bytes_max: usize) -> bool {
        let Some((start, from)) = self.no_line_end_before.take() else {
            return false;
        };
        if start != self.input.as_ptr() as usize
            || from > self.input.len()
            || self.input.len() > line_bytes_max + 1
            || memchr::memchr(b'\n', &self.input[from..]).is_some()
        {
            return false;
        }
        self.no_line_end_before = Some((start, self.input.len()));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply;

    fn limits() -> ParseLimits {
        ParseLimits {
            line_bytes_max: 32,
            ..ParseLimits::default()
        }
    }

    /// Feeds `chunks` one at a time, collecting what each call hands out, as the
    /// connection loop does.
    fn run(chunks: &[&[u8]]) -> Vec<String> {
        let mut inbound = Inbound::default();
        let mut seen = Vec::new();
        for chunk in chunks {
            inbound.buffer_for_read().extend_from_slice(chunk);
            loop {
                match inbound.next_request(&limits()) {
                    Next::NeedMore => break,
                    Next::Request(r) => seen.push(format!("{:?}", r.kind())),
                    Next::Refused { reply, .. } => {
                        seen.push(String::from_utf8_lossy(reply).trim_end().to_string())
                    }
                    Next::Binary { .. } => seen.push("binary".into()),
                }
            }
        }
        seen
    }

    #[test]
    fn pipelined_requests_come_out_one_by_one() {
        assert_eq!(
            run(&[b"version\r\nget q\r\nset q 0 0 1\r\nx\r\n"]),
            ["Version", "Get", "Set"]
        );
    }

    #[test]
    fn a_request_split_anywhere_comes_out_once() {
        let bytes = b"set q 0 0 5\r\nhello\r\nget q\r\n";
        for cut in 1..bytes.len() {
            let (a, b) = bytes.split_at(cut);
            assert_eq!(run(&[a, b]), ["Set", "Get"], "cut at {cut}");
        }
    }

    #[test]
    fn a_refused_data_block_is_dropped_as_it_arrives() {
        // The block holds a command: it must never run, however it is split.
        let seen = run(&[
            b"add k 0 0 13\r\ndel",
            b"ete victim",
            b"\r\n",
            b"version\r\n",
        ]);
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[1], "Version");
        assert!(seen[0].starts_with("SERVER_ERROR") || seen[0].starts_with("CLIENT_ERROR"));
    }

    #[test]
    fn a_long_line_is_refused_once_and_skipped_to_its_end() {
        let long = [b'a'; 40];
        let seen = run(&[&long, &long, b"\r\nversion\r\n"]);
        let too_long = String::from_utf8_lossy(reply::LINE_TOO_LONG);
        assert_eq!(seen, [too_long.trim_end(), "Version"]);
    }

    #[test]
    fn a_line_trickling_in_is_found_when_its_end_arrives() {
        let mut chunks: Vec<&[u8]> = b"version".chunks(1).collect();
        chunks.push(b"\r\n");
        assert_eq!(run(&chunks), ["Version"]);
    }

    #[test]
    fn mid_request_and_room_for_a_known_length() {
        let mut inbound = Inbound::default();
        assert!(!inbound.is_mid_request());
        inbound
            .buffer_for_read()
            .extend_from_slice(b"set q 0 0 100000\r\n");
        assert_eq!(inbound.next_request(&limits()), Next::NeedMore);
        assert!(inbound.is_mid_request());
        assert!(inbound.buffer_for_read().capacity() >= 100_000 + 18 + 2);
        inbound
            .buffer_for_read()
            .extend_from_slice(&[b'x'; 100_000]);
        inbound.buffer_for_read().extend_from_slice(b"\r\n");
        assert!(matches!(
            inbound.next_request(&limits()),
            Next::Request(Request::Set { .. })
        ));
        assert_eq!(inbound.next_request(&limits()), Next::NeedMore);
        assert!(!inbound.is_mid_request());
        inbound.shrink();
        assert_eq!(inbound.buffer_for_read().capacity(), BUFFER_BYTES_INITIAL);
    }
}
