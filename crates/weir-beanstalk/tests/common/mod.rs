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
    let mut run = Run::default();
    let mut buf = stream;
    loop {
        match parse(buf, limits) {
            Parsed::Incomplete => break,
            Parsed::Complete { request, consumed } => {
                assert!(
                    consumed >= 1 && consumed <= buf.len(),
                    "consumed {consumed}"
                );
                run.outcomes.push(request.command().name().to_string());
                buf = &buf[consumed..];
                if request.command() == Command::Quit {
                    run.closed = true;
                    break;
                }
            }
            Parsed::Refused(refusal) => {
                let consumed = refusal.consumed;
                assert!(
                    consumed >= 1 && consumed <= buf.len(),
                    "consumed {consumed}"
                );
                run.outcomes.push(word(refusal.reply));
                buf = &buf[consumed..];
                let Some(rest) = drop_after(buf, refusal.discard_bytes, refusal.skip_line) else {
                    buf = &[];
                    break;
                };
                buf = rest;
                run.replies.extend_from_slice(refusal.reply);
                if refusal.close {
                    run.outcomes.push("close".to_string());
                    run.closed = true;
                    break;
                }
            }
        }
    }
    run.rest = buf.len();
    run
}

/// `buf` after dropping `discard` bytes, then through the next `\r\n` if
/// `skip_line`; `None` when the stream ends first.
fn drop_after(buf: &[u8], discard: u64, skip_line: bool) -> Option<&[u8]> {
    let discard = usize::try_from(discard).ok()?;
    let mut buf = buf.get(discard..)?;
    if skip_line {
        let end = buf.windows(2).position(|w| w == b"\r\n")?;
        buf = &buf[end + 2..];
    }
    Some(buf)
}

/// The stream as the outcomes' names, joined by spaces.
pub fn outcomes(stream: &[u8]) -> String {
    run(stream, &ParseLimits::default()).outcomes.join(" ")
}
