//! One connection's socket and buffers, and the framing state between requests.
//!
//! The parser ([`crate::parse()`]) says what to drop; this keeps what is left to drop
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
        let discard = self.discard.take()?;
        match drain(discard, &mut self.buf) {
            Ok(done) => Some(done),
            Err(pending) => {
                self.discard = Some(pending);
                None
            }
        }
    }
}

/// Drops from the front of `buf` what `discard` still has to drop: the refusal
/// once all of it is dropped, else what remains to drop when more bytes come.
fn drain(mut discard: Discard, buf: &mut Vec<u8>) -> Result<Discard, Discard> {
    if discard.bytes > 0 {
        let now = usize::try_from(discard.bytes)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        buf.drain(..now);
        discard.bytes -= now as u64;
    }
    if discard.bytes == 0 && discard.skip_line {
        match memchr::memmem::find(buf, b"\r\n") {
            Some(end) => {
                buf.drain(..end + 2);
                discard.skip_line = false;
            }
            None => {
                // Keep a final `\r`: its `\n` may come next.
                let keep = usize::from(buf.ends_with(b"\r"));
                buf.drain(..buf.len() - keep);
            }
        }
    }
    if discard.bytes == 0 && !discard.skip_line {
        Ok(discard)
    } else {
        Err(discard)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{parse, ParseLimits, Parsed};
    use proptest::prelude::*;

    /// What a connection makes of `stream` arriving in `cuts`-sized reads: the
    /// replies of refusals and the requests' command names, in order.
    fn frame(stream: &[u8], cuts: &[usize]) -> Vec<String> {
        let limits = ParseLimits::default();
        let (mut buf, mut pending, mut seen) = (Vec::new(), None::<Discard>, Vec::new());
        let mut at = 0;
        for &cut in cuts.iter().chain(std::iter::once(&usize::MAX)) {
            let end = at + cut.min(stream.len() - at);
            buf.extend_from_slice(&stream[at..end]);
            at = end;
            loop {
                if let Some(d) = pending.take() {
                    match drain(d, &mut buf) {
                        Ok(done) => seen.push(String::from_utf8_lossy(done.reply).into_owned()),
                        Err(left) => {
                            pending = Some(left);
                            break;
                        }
                    }
                }
                let consumed = match parse(&buf, &limits) {
                    Parsed::Incomplete => break,
                    Parsed::Refused(r) => {
                        pending = Some(Discard::of(&r));
                        r.consumed
                    }
                    Parsed::Complete { request, consumed } => {
                        seen.push(request.command().name().to_owned());
                        consumed
                    }
                };
                buf.drain(..consumed);
            }
            if at == stream.len() {
                break;
            }
        }
        seen
    }

    proptest! {
        /// However the bytes are cut into reads, a refused put's body and a line too
        /// long are dropped whole, answered once, and the request after them is read.
        #[test]
        fn refusals_are_answered_once_whatever_the_reads(
            cuts in proptest::collection::vec(1usize..400, 0..40),
            body in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let mut stream = format!("put 0 0 1 {}\r\n", 65_536 + body.len()).into_bytes();
            stream.extend(std::iter::repeat_n(b'x', 65_536));
            stream.extend_from_slice(&body);
            stream.extend_from_slice(b"\r\n");
            stream.extend(std::iter::repeat_n(b'y', 300 + body.len()));
            stream.extend_from_slice(b"\r\nstats\r\n");
            let seen = frame(&stream, &cuts);
            prop_assert_eq!(seen, vec!["JOB_TOO_BIG\r\n", "BAD_FORMAT\r\n", "stats"]);
        }
    }
}
