//! Feeds arbitrary bytes to the request parser the way a connection does: request
//! after request, honouring refusals, with small limits so every path is reachable.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_memcache::parse::{parse, Parse, ParseLimits, Request};
use weir_memcache::request::parse_read_key;

fuzz_target!(|data: &[u8]| {
    let limits = ParseLimits {
        line_bytes_max: 256,
        item_size_bytes_max: 512,
        get_keys_max: 8,
    };
    let mut rest = data;
    let mut keys = Vec::new();
    while !rest.is_empty() {
        let consumed = match parse(rest, &limits, &mut keys) {
            Parse::Incomplete { bytes_needed } => {
                assert!(bytes_needed == 0 || bytes_needed > rest.len());
                break;
            }
            Parse::Binary { .. } => {
                assert_eq!(rest[0], 0x80);
                break;
            }
            Parse::Request {
                request: Request::Get { keys, .. },
                consumed,
            } => {
                for key in keys.iter() {
                    assert_eq!(parse_read_key(key.text), Ok(key));
                }
                consumed
            }
            Parse::Request { consumed, .. } => consumed,
            Parse::Reject(r) => {
                assert!(r.reply.ends_with(b"\r\n"));
                if r.close {
                    break;
                }
                r.consumed
            }
        };
        assert!(consumed >= 1 && consumed <= rest.len());
        rest = &rest[consumed..];
    }
});
