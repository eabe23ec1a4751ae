//! The request parser under random input: it never panics, never claims more bytes
//! than it was given, and a valid request split anywhere parses as incomplete until
//! its last byte arrives, then exactly as when sent whole.

use proptest::prelude::*;
use weir_server::parse::{parse, Parse, ParseLimits};
use weir_server::request::{parse_read_key, parse_write_key};

fn limits() -> ParseLimits {
    ParseLimits {
        line_bytes_max: 300,
        item_size_bytes_max: 1000,
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
    match parse(buf, &limits()) {
        Parse::Incomplete { bytes_needed } => {
            assert!(bytes_needed == 0 || bytes_needed > buf.len());
        }
        Parse::Request { consumed, .. } => assert!(consumed >= 1 && consumed <= buf.len()),
        Parse::Reject(r) => {
            assert!(r.consumed >= 1 && r.consumed <= buf.len());
            assert!(r.reply.ends_with(b"\r\n"));
        }
    }
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
        while !rest.is_empty() {
            let consumed = match parse(rest, &limits()) {
                Parse::Incomplete { .. } => break,
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
        let incomplete = matches!(parse(&req[..cut], &limits()), Parse::Incomplete { .. });
        prop_assert!(incomplete, "cut at {}", cut);
        match parse(&req, &limits()) {
            Parse::Request { consumed, request } => {
                prop_assert_eq!(consumed, whole);
                prop_assert_eq!(request.kind(), weir_server::parse::CommandKind::Set);
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }
}
