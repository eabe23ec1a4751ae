//! One connection's socket and buffers, and the framing state between requests.
//!
//! The parser ([`crate::parse`]) says what to drop; this keeps what is left to drop
//! across reads ([`Discard`]: the rest of a refused `put` body, or a line too long
//! whose end has not arrived) and writes the refusal's reply only once it is all
//! dropped, as beanstalkd does. Replies collect in `out` and go in one write per
//! batch of requests.

use std::io;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::parse::Refusal;

/// Bytes asked of each read.
const READ_CHUNK: usize = 16 * 1024;

/// What is still to drop before a refusal's reply is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Discard {
    pub bytes: u64,
    pub skip_line: bool,
    pub reply: &'static [u8],
    pub close: bool,
}

impl Discard {
    pub fn of(refusal: &Refusal) -> Discard {
        Discard {
            bytes: refusal.discard_bytes,
            skip_line: refusal.skip_line,
            reply: refusal.reply,
            close: refusal.close,
        }
    }
}

pub struct Connection {
    stream: TcpStream,
    /// Bytes read and not yet consumed.
    pub buf: Vec<u8>,
    /// Replies not yet written.
    pub out: Vec<u8>,
    /// A refusal still dropping bytes.
    pub discard: Option<Discard>,
}

impl Connection {
    pub fn new(stream: TcpStream) -> Connection {
        Connection {
            stream,
            buf: Vec::with_capacity(READ_CHUNK),
            out: Vec::new(),
            discard: None,
        }
    }

    /// Reads more bytes into `buf`; 0 at end of file.
    pub async fn read(&mut self) -> io::Result<usize> {
        self.buf.reserve(READ_CHUNK);
        self.stream.read_buf(&mut self.buf).await
    }

    /// Writes the replies collected so far.
    pub async fn flush(&mut self) -> io::Result<()> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out).await?;
            self.out.clear();
        }
        Ok(())
    }

    /// Drops the first `n` bytes of `buf`.
    pub fn consume(&mut self, n: usize) {
        self.buf.drain(..n.min(self.buf.len()));
    }

    /// Whether part of a request has arrived and not the rest.
    pub fn is_mid_request(&self) -> bool {
        !self.buf.is_empty() || self.discard.is_some()
    }

    /// Drops what a pending refusal still has to drop from `buf`. Returns the
    /// refusal once everything is dropped (its reply is then due), `None` while more
    /// bytes must come first or when nothing is pending.
    pub fn drain_discard(&mut self) -> Option<Discard> {
        let mut discard = self.discard?;
        if discard.bytes > 0 {
            let now = usize::try_from(discard.bytes)
                .unwrap_or(usize::MAX)
                .min(self.buf.len());
            self.consume(now);
            discard.bytes -= now as u64;
        }
        if discard.bytes == 0 && discard.skip_line {
            match memchr::memmem::find(&self.buf, b"\r\n") {
                Some(end) => {
                    self.consume(end + 2);
                    discard.skip_line = false;
                }
                None => {
                    // Keep a final `\r`: its `\n` may come next.
                    let keep = usize::from(self.buf.ends_with(b"\r"));
                    self.consume(self.buf.len() - keep);
                }
            }
        }
        if discard.bytes == 0 && !discard.skip_line {
            self.discard = None;
            return Some(discard);
        }
        self.discard = Some(discard);
        None
    }
}
