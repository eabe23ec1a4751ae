//! `Connection`: one client's socket, its read buffer and its reply buffer.
//!
//! Framing lives here so that command handlers speak in requests and replies only.
//! The read side is one `BytesMut` that the parser looks into; every complete request
//! in it is executed before anything is written, and all their replies go out in one
//! write. Buffers start small ([`BUFFER_BYTES_INITIAL`]) so thousands of idle
//! connections stay cheap, grow for a large item, and are given back afterwards
//! ([`BUFFER_BYTES_RETAINED_MAX`]), so one big item does not pin memory for the life
//! of the connection.
//!
//! Two states outlive a single parse: bytes still to discard (the data block of a
//! refused `set`) and "skip to the end of this line" (a line that was too long).

use std::io;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::metrics::LoopMetrics;
use crate::shared::OUTPUT_BYTES_FLUSH_AT;

/// Capacity of a fresh read buffer.
pub const BUFFER_BYTES_INITIAL: usize = 1024;
/// A buffer grown past this is replaced by a fresh one once it is empty.
pub const BUFFER_BYTES_RETAINED_MAX: usize = 64 * 1024;
/// Bytes read ahead while a command waits (a blocking `get`, `monitor`); past this the
/// connection stops reading until the command ends.
pub const READ_AHEAD_BYTES_MAX: usize = 64 * 1024;

pub struct Connection {
    pub stream: TcpStream,
    /// Bytes received and not yet parsed.
    pub input: BytesMut,
    /// Replies not yet written.
    pub output: BytesMut,
    /// Bytes received while a command waited; moved to `input` when it ends.
    pub read_ahead: BytesMut,
    /// Bytes still to drop before the next request.
    discard_bytes: u64,
    /// Drop everything up to the next `\n` before the next request.
    skip_line: bool,
    /// `input` (then starting at this address) was searched for a line end up to this
    /// length without finding one. A long line trickling in a byte at a time would
    /// otherwise be searched from its start on every read: quadratic in its length.
    /// Any change to the buffer's start (a request consumed, a reallocation) makes
    /// the address differ, and the memo is dropped.
    no_line_end_before: Option<(usize, usize)>,
}

impl Connection {
    pub fn new(stream: TcpStream) -> Connection {
        Connection {
            stream,
            input: BytesMut::with_capacity(BUFFER_BYTES_INITIAL),
            output: BytesMut::new(),
            read_ahead: BytesMut::new(),
            discard_bytes: 0,
            skip_line: false,
            no_line_end_before: None,
        }
    }

    /// The parser found no complete line in `input` (see `no_line_end_before`).
    pub fn note_no_line_end(&mut self) {
        self.no_line_end_before = Some((self.input.as_ptr() as usize, self.input.len()));
    }

    /// Whether `input` still holds no line end, looking only at the bytes that
    /// arrived since [`Connection::note_no_line_end`]; false once one is there, or the
    /// line is too long (the parser refuses it then).
    pub fn line_still_incomplete(&mut self, line_bytes_max: usize) -> bool {
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
        self.note_no_line_end();
        true
    }

    /// Whether a request has begun but not ended (so a timeout applies).
    pub fn is_mid_request(&self) -> bool {
        !self.input.is_empty() || self.discard_bytes > 0 || self.skip_line
    }

    pub fn start_discard(&mut self, discard_bytes: u64, skip_line: bool) {
        self.discard_bytes = discard_bytes;
        self.skip_line = skip_line;
        self.apply_discard();
    }

    /// Drops what a refused request left behind; true when what is left in `input`
    /// starts a new request.
    pub fn apply_discard(&mut self) -> bool {
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

    /// Moves bytes read ahead during a wait into `input`.
    pub fn take_read_ahead(&mut self) {
        if !self.read_ahead.is_empty() {
            self.input.extend_from_slice(&self.read_ahead);
            self.read_ahead = BytesMut::new();
        }
    }

    /// Makes room for at least `bytes_needed` bytes in total in `input`.
    pub fn reserve_for(&mut self, bytes_needed: usize) {
        if bytes_needed > self.input.len() {
            self.input.reserve(bytes_needed - self.input.len());
        }
    }

    /// Reads more bytes into `input`; 0 means the peer closed.
    pub async fn read(&mut self) -> io::Result<usize> {
        if self.input.capacity() - self.input.len() < 512 {
            self.input.reserve(BUFFER_BYTES_INITIAL);
        }
        self.stream.read_buf(&mut self.input).await
    }

    /// Writes every pending reply; returns the number of bytes written.
    pub async fn flush(&mut self) -> io::Result<usize> {
        let n = self.output.len();
        if n > 0 {
            self.stream.write_all(&self.output).await?;
            self.output.clear();
        }
        self.shrink();
        Ok(n)
    }

    /// Gives back buffers that grew for a large item.
    fn shrink(&mut self) {
        if self.output.capacity() > BUFFER_BYTES_RETAINED_MAX {
            self.output = BytesMut::new();
        }
        if self.input.is_empty() && self.input.capacity() > BUFFER_BYTES_RETAINED_MAX {
            self.input = BytesMut::with_capacity(BUFFER_BYTES_INITIAL);
        }
    }
}

/// Writes `output` to `stream` now (a command that streams, or is about to wait).
pub async fn write_now(stream: &mut TcpStream, output: &mut BytesMut) -> io::Result<usize> {
    let n = output.len();
    if n > 0 {
        stream.write_all(output).await?;
        output.clear();
    }
    Ok(n)
}

/// Reads into `read_ahead` until the peer closes (or fails); never returns otherwise.
/// Raced against a waiting command, it notices a client that went away so the wait
/// can be dropped and nothing is taken on its behalf.
pub async fn until_closed(stream: &mut TcpStream, read_ahead: &mut BytesMut) {
    loop {
        if read_ahead.len() >= READ_AHEAD_BYTES_MAX {
            std::future::pending::<()>().await;
        }
        read_ahead.reserve(1024);
        match stream.read_buf(read_ahead).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Writes the pending replies once they pass [`OUTPUT_BYTES_FLUSH_AT`] (the one place
/// that threshold is applied), counting the bytes; false when the client is gone.
pub async fn write_if_over(
    stream: &mut TcpStream,
    output: &mut BytesMut,
    metrics: &LoopMetrics,
) -> bool {
    if output.len() < OUTPUT_BYTES_FLUSH_AT {
        return true;
    }
    match write_now(stream, output).await {
        Ok(n) => {
            metrics.bytes_written.add(n as u64);
            true
        }
        Err(_) => false,
    }
}
