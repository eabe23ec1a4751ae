//! A door in miniature for the tests: feeds a byte stream to the parser as a
//! connection would, dropping what each refusal says to drop, and records what came
//! out.

#![allow(dead_code)]

use weir_beanstalk::{parse, Command, ParseLimits, Parsed};

/// What a stream parsed into.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Run {
    /// Per request: the command's name, or the refusal's reply word (`BAD_FORMAT`);
    /// then `close` if a refusal closed the connection.
    pub outcomes: Vec<String>,
    /// The refusals' replies, in order, each written once what it drops is dropped
    /// (as beanstalkd writes them).
    pub replies: Vec<u8>,
    /// The connection closed: a refusal said so, or `quit`.
    pub closed: bool,
    /// Bytes left, waiting for more (a request not complete yet).
    pub rest: usize,
}

/// The word of a reply line: `BAD_FORMAT` for `BAD_FORMAT\r\n`.
pub fn word(reply: &[u8]) -> String {
    String::from_utf8_lossy(reply.strip_suffix(b"\r\n").unwrap_or(reply)).into_owned()
}

/// Parses `stream` to its end, as a door would, checking at every step that the
/// parser consumes at least one byte and no more than it has.
pub fn run(stream: &[u8], limits: &ParseLimits) -> Run {
    run_reads(&[stream], limits)
}

/// [`run`] with the stream arriving in `reads`, one after the other: the door
/// parses what it has after each read, and drops what a refusal says to drop as it
/// arrives.
pub fn run_reads(reads: &[&[u8]], limits: &ParseLimits) -> Run {
    let mut door = Door::default();
    for read in reads {
        door.buf.extend_from_slice(read);
        if door.serve(limits) {
            break;
        }
    }
    door.run.rest = door.buf.len();
    door.run
}

/// A connection's state between reads.
#[derive(Default)]
struct Door {
    buf: Vec<u8>,
    run: Run,
    /// Bytes of a refused `put` body still to drop.
    discard: u64,
    /// Dropping through the next `\r\n` (a line too long).
    skip_line: bool,
    /// The reply (and close) of the refusal whose dropping is under way.
    pending: Option<(&'static [u8], bool)>,
}

impl Door {
    /// Serves what the buffer holds; true once the connection is closed.
    fn serve(&mut self, limits: &ParseLimits) -> bool {
        loop {
            if !self.drop_refused() {
                return false;
            }
            if let Some((reply, close)) = self.pending.take() {
                self.run.replies.extend_from_slice(reply);
                if close {
                    self.run.outcomes.push("close".to_string());
                    self.run.closed = true;
                    return true;
                }
            }
            let (outcome, consumed, quit) = match parse(&self.buf, limits) {
                Parsed::Incomplete => return false,
                Parsed::Complete { request, consumed } => {
                    let command = request.command();
                    (
                        command.name().to_string(),
                        consumed,
                        command == Command::Quit,
                    )
                }
                Parsed::Refused(refusal) => {
                    self.discard = refusal.discard_bytes;
                    self.skip_line = refusal.skip_line;
                    self.pending = Some((refusal.reply, refusal.close));
                    (word(refusal.reply), refusal.consumed, false)
                }
            };
            assert!(
                consumed >= 1 && consumed <= self.buf.len(),
                "consumed {consumed}"
            );
            self.buf.drain(..consumed);
            self.run.outcomes.push(outcome);
            if quit {
                self.run.closed = true;
                return true;
            }
        }
    }

    /// Drops what the last refusal said to drop, as far as the buffer goes; true
    /// when nothing is left to drop.
    fn drop_refused(&mut self) -> bool {
        if self.discard > 0 {
            let n = usize::try_from(self.discard).map_or(self.buf.len(), |d| d.min(self.buf.len()));
            self.buf.drain(..n);
            self.discard -= n as u64;
            if self.discard > 0 {
                return false;
            }
        }
        if self.skip_line {
            let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") else {
                let keep = usize::from(self.buf.ends_with(b"\r"));
                self.buf.drain(..self.buf.len() - keep);
                return false;
            };
            self.buf.drain(..end + 2);
            self.skip_line = false;
        }
        true
    }
}

/// The stream as the outcomes' names, joined by spaces.
pub fn outcomes(stream: &[u8]) -> String {
    run(stream, &ParseLimits::default()).outcomes.join(" ")
}
