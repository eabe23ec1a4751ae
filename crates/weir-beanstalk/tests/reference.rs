//! The parser against the real beanstalkd: `reference/replies.txt` holds what
//! beanstalkd 1.12 answered to each case (recorded by `scripts/beanstalk-reference`,
//! whose docs describe the format). For every case the parser alone can decide, the
//! parser must give the same reply bytes and the same close decision; for cases that
//! need jobs and tubes, the right requests; for the cases where weir refuses on purpose
//! what beanstalkd takes, the outcome the file states, and a reply that still differs.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure is a panic

mod common;

use weir_beanstalk::ParseLimits;

const REPLIES: &str = include_str!("reference/replies.txt");

/// One recorded case.
#[derive(Debug, Default)]
struct Case {
    name: String,
    send: Vec<u8>,
    /// `None` when the reply was not recorded (volatile).
    reply: Option<Vec<u8>>,
    closed: bool,
    check: String,
    expect: String,
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for record in REPLIES.split("\n\n") {
        let mut case = Case::default();
        for line in record.lines().filter(|l| !l.starts_with('#')) {
            let (key, value) = line
                .split_once(": ")
                .unwrap_or((line.trim_end_matches(':'), ""));
            match key {
                "case" => case.name = value.to_string(),
                "send" => case.send = unescape(value),
                "reply" if value == "(volatile)" => case.reply = None,
                "reply" => case.reply = Some(unescape(value)),
                "closed" => case.closed = value == "yes",
                "check" => case.check = value.to_string(),
                "expect" => case.expect = value.to_string(),
                "note" => {}
                other => panic!("unknown field {other:?} in {record:?}"),
            }
        }
        if !case.name.is_empty() {
            cases.push(case);
        }
    }
    cases
}

/// The file's escapes: `\\`, `\r`, `\n`, `\t`, `\xHH`, `\{N,HH}`.
fn unescape(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            out.push(bytes[i]);
            i += 1;
            continue;
        }
        let hex = |s: &[u8]| u8::from_str_radix(std::str::from_utf8(s).unwrap(), 16).unwrap();
        match bytes[i + 1] {
            b'\\' => out.push(b'\\'),
            b'r' => out.push(b'\r'),
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'x' => {
                out.push(hex(&bytes[i + 2..i + 4]));
                i += 2;
            }
            b'{' => {
                let close = i + text[i..].find('}').unwrap();
                let (count, byte) = text[i + 2..close].split_once(',').unwrap();
                let count: usize = count.parse().unwrap();
                out.extend(std::iter::repeat_n(hex(byte.as_bytes()), count));
                i = close - 1;
            }
            other => panic!("unknown escape \\{}", other as char),
        }
        i += 2;
    }
    out
}

#[test]
fn the_escapes_read_back() {
    assert_eq!(unescape(r"a\\b\r\n\t\x00\xff"), b"a\\b\r\n\t\x00\xff");
    assert_eq!(unescape(r"x\{3,61}y"), b"xaaay");
}

#[test]
fn the_file_holds_every_kind_of_case() {
    let cases = cases();
    assert!(cases.len() > 100, "{} cases", cases.len());
    for check in ["parser", "storage", "differs"] {
        assert!(cases.iter().any(|c| c.check == check), "no {check} case");
    }
}

/// Replies beanstalkd writes for a refusal: only these may come out of the parser.
fn is_refusal_or_quit(outcome: &str) -> bool {
    outcome == "quit"
        || outcome == "close"
        || outcome.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
}

#[test]
fn the_parser_answers_as_beanstalkd_where_the_parser_decides() {
    let limits = ParseLimits::default();
    let mut checked = 0;
    for case in cases().iter().filter(|c| c.check == "parser") {
        let run = common::run(&case.send, &limits);
        assert!(
            run.outcomes.iter().all(|o| is_refusal_or_quit(o)),
            "{}: the parser made requests of it: {:?}",
            case.name,
            run.outcomes
        );
        let reply = case.reply.as_ref().expect("a parser case has its reply");
        assert_eq!(
            String::from_utf8_lossy(&run.replies),
            String::from_utf8_lossy(reply),
            "{}: replies",
            case.name
        );
        assert_eq!(run.closed, case.closed, "{}: closed", case.name);
        checked += 1;
    }
    assert!(checked > 80, "{checked} parser cases");
}

#[test]
fn requests_that_need_storage_parse_to_the_right_commands() {
    for case in cases().iter().filter(|c| c.check == "storage") {
        assert!(!case.expect.is_empty(), "{}: no expect", case.name);
        assert_eq!(common::outcomes(&case.send), case.expect, "{}", case.name);
    }
}

#[test]
fn where_weir_differs_it_does_what_the_file_says_and_beanstalkd_does_not() {
    let limits = ParseLimits::default();
    for case in cases().iter().filter(|c| c.check == "differs") {
        let run = common::run(&case.send, &limits);
        assert_eq!(run.outcomes.join(" "), case.expect, "{}", case.name);
        if run.outcomes.iter().all(|o| is_refusal_or_quit(o)) {
            let same = case.reply.as_ref() == Some(&run.replies) && case.closed == run.closed;
            assert!(!same, "{}: beanstalkd now answers as weir does", case.name);
        }
    }
}
