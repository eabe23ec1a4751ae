//! The request parser under random input: it never panics, never claims more bytes
//! than it was given, a valid request split anywhere parses as incomplete until its
//! last byte arrives, then exactly as when sent whole, and a storage command's data
//! block is never read as commands, whatever it holds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

use proptest::prelude::*;
use weir_memcache::parse::{parse, Parse, ParseLimits, Request};
use weir_memcache::request::{parse_read_key, parse_write_key};

fn limits() -> ParseLimits {
    ParseLimits {
        line_bytes_max: 300,
        item_size_bytes_max: 1000,
        get_keys_max: 8,
    }
}

/// Bytes that look a little like requests, so the parser's deeper paths are reached.
fn request_like() -> impl Strategy<Value = Vec<u8>> {
    let word = prop_oneof![
        Just(b"set ".to_vec()),
        Just(b"get ".to_vec()),
        Just(b"gets ".to_vec()),
        Just(b"delete ".to_vec()),
        Just(b"flush ".to_vec()),
        Just(b"flush_all".to_vec()),
        Just(b"monitor ".to_vec()),
        Just(b"confirm ".to_vec()),
        Just(b"dump_stats ".to_vec()),
        Just(b"add ".to_vec()),
        Just(b"cas ".to_vec()),
        Just(b"ms ".to_vec()),
        Just(vec![0x80, 0x01]),
        Just(b"q".to_vec()),
        Just(b"q.r/open/close/t=5".to_vec()),
        Just(b"a+b/sync".to_vec()),
        Just(b" 0 0 ".to_vec()),
        Just(b"3".to_vec()),
        Just(b"-1".to_vec()),
        Just(b"noreply".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"abc".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..8),
    ];
    proptest::collection::vec(word, 0..24).prop_map(|parts| parts.concat())
}

fn check(buf: &[u8]) {
    let mut keys = Vec::new();
    match parse(buf, &limits(), &mut keys) {
        Parse::Request {
            request: Request::Get { keys, .. },
            consumed,
        } => {
            assert!(consumed >= 1 && consumed <= buf.len());
            // Each key read back from its span is the key the parser checked.
            for key in keys.iter() {
                assert_eq!(parse_read_key(key.text), Ok(key));
            }
        }
        Parse::Incomplete { bytes_needed } => {
            assert!(bytes_needed == 0 || bytes_needed > buf.len());
        }
        Parse::Request { consumed, .. } => assert!(consumed >= 1 && consumed <= buf.len()),
        Parse::Reject(r) => {
            assert!(r.consumed >= 1 && r.consumed <= buf.len());
            assert!(r.reply.ends_with(b"\r\n"));
        }
        Parse::Binary { .. } => assert_eq!(buf[0], 0x80),
    }
}

/// What a connection does with `buf`: the request kinds (or refusals) in order, until
/// the bytes run out or a refusal closes; refused data blocks are skipped.
fn run(buf: &[u8]) -> Vec<String> {
    let mut seen = Vec::new();
    let mut keys = Vec::new();
    let mut rest = buf;
    while !rest.is_empty() {
        match parse(rest, &limits(), &mut keys) {
            Parse::Incomplete { .. } => break,
            Parse::Binary { .. } => {
                seen.push("binary".into());
                break;
            }
            Parse::Request { consumed, request } => {
                seen.push(format!("{:?}", request.kind()));
                rest = &rest[consumed..];
            }
            Parse::Reject(r) => {
                seen.push(format!(
                    "refused {}",
                    String::from_utf8_lossy(r.reply).trim()
                ));
                if r.close {
                    seen.push("closed".into());
                    break;
                }
                let skip = r.consumed as u64 + r.discard_bytes;
                rest = &rest[(skip.min(rest.len() as u64)) as usize..];
                if r.skip_line {
                    break;
                }
            }
        }
    }
    seen
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..700)) {
        check(&buf);
    }

    #[test]
    fn request_like_bytes_never_panic(buf in request_like()) {
        check(&buf);
        // Parse the whole buffer request by request, as the connection does.
        let mut rest = &buf[..];
        let mut keys = Vec::new();
        while !rest.is_empty() {
            let consumed = match parse(rest, &limits(), &mut keys) {
                Parse::Incomplete { .. } | Parse::Binary { .. } => break,
                Parse::Request { consumed, .. } => consumed,
                Parse::Reject(r) => {
                    if r.close { break; }
                    r.consumed
                }
            };
            rest = &rest[consumed..];
        }
    }

    #[test]
    fn a_data_block_never_runs_as_commands(
        command in prop::sample::select(vec!["add", "replace", "append", "prepend", "cas", "ms", "set"]),
        key in prop::sample::select(vec!["k", "bad.key.", "ok_key", "\u{e9}"]),
        noreply in any::<bool>(),
        block in prop::sample::select(vec![
            &b"delete victim\r\n"[..],
            b"flush_all\r\nget q\r\n",
            b"set x 0 0 1\r\nx",
            b"",
            b"\r\n\r\n",
        ]),
    ) {
        // Every storage command, with its length where each puts it, then a sentinel.
        let length = block.len();
        let line = match command {
            "ms" => format!("ms {key} {length}"),
            "cas" => format!("cas {key} 0 0 {length} 7"),
            _ => format!("{command} {key} 0 0 {length}"),
        };
        let noreply = noreply && command != "ms";
        let mut req = line.into_bytes();
        if noreply {
            req.extend_from_slice(b" noreply");
        }
        req.extend_from_slice(b"\r\n");
        req.extend_from_slice(block);
        req.extend_from_slice(b"\r\nversion\r\n");
        let seen = run(&req);
        // Exactly two things happened: the storage command (stored or refused), then
        // the sentinel. Nothing in the block ran.
        prop_assert_eq!(seen.len(), 2, "{:?}", seen);
        prop_assert_eq!(&seen[1], "Version", "{:?}", seen);
        let set_ok = command == "set" && key != "bad.key." && key != "\u{e9}";
        if set_ok {
            prop_assert_eq!(&seen[0], "Set");
        } else {
            prop_assert!(seen[0].starts_with("refused"), "{:?}", seen);
        }
        // A refusal after a final noreply is silent, else one reply: the connection
        // sees it as a reject with `noreply` set.
        if let Parse::Reject(r) = parse(&req, &limits(), &mut Vec::new()) {
            prop_assert_eq!(r.noreply, noreply);
        }
    }

    #[test]
    fn keys_never_panic(key in "\\PC{0,40}") {
        let _ = parse_read_key(&key);
        let _ = parse_write_key(&key);
    }

    #[test]
    fn a_split_set_parses_once_whole(
        data in proptest::collection::vec(any::<u8>(), 0..200),
        flags in any::<u32>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut req = format!("set jobs/sync {flags} 0 {}\r\n", data.len()).into_bytes();
        req.extend_from_slice(&data);
        req.extend_from_slice(b"\r\nget jobs\r\n");
        let whole = req.len() - b"get jobs\r\n".len();
        let cut = cut.index(whole);
        let mut keys = Vec::new();
        let incomplete = matches!(parse(&req[..cut], &limits(), &mut keys), Parse::Incomplete { .. });
        prop_assert!(incomplete, "cut at {}", cut);
        match parse(&req, &limits(), &mut keys) {
            Parse::Request { consumed, request } => {
                prop_assert_eq!(consumed, whole);
                // The whole request, field by field, not just its kind.
                let expected = Request::Set {
                    key: parse_write_key("jobs/sync").unwrap(),
                    flags,
                    exptime: 0,
                    data: &data,
                    noreply: false,
                };
                prop_assert_eq!(request, expected);
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }

    #[test]
    fn a_split_get_parses_once_whole(
        keys in proptest::collection::vec(
            prop::sample::select(vec!["q", "q.r/open", "q+r/close/open", "a/peek", "b/t=5", "c/abort"]),
            1..6,
        ),
        cut in any::<prop::sample::Index>(),
    ) {
        let line = keys.join(" ");
        let req = format!("get {line}\r\n").into_bytes();
        let cut = cut.index(req.len());
        let incomplete = matches!(
            parse(&req[..cut], &limits(), &mut Vec::new()),
            Parse::Incomplete { .. }
        );
        prop_assert!(incomplete, "cut at {}", cut);
        let mut spans = Vec::new();
        match parse(&req, &limits(), &mut spans) {
            Parse::Request { consumed, request: Request::Get { keys: got, cas: false } } => {
                prop_assert_eq!(consumed, req.len());
                let expected: Vec<_> = keys.iter().map(|k| parse_read_key(k).unwrap()).collect();
                prop_assert_eq!(got.iter().collect::<Vec<_>>(), expected);
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }
}
