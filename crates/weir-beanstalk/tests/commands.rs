//! Each command, in its good forms and its bad ones: what the parser makes of one
//! line (or one `put`), field by field.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure is a panic

mod common;

use weir_beanstalk::reply;
use weir_beanstalk::{parse, ParseLimits, Parsed, Refusal, Request, Tube};

fn request(buf: &[u8]) -> Request<'_> {
    match parse(buf, &ParseLimits::default()) {
        Parsed::Complete { request, consumed } => {
            assert_eq!(consumed, buf.len(), "{:?}", String::from_utf8_lossy(buf));
            request
        }
        other => panic!("{:?}: {other:?}", String::from_utf8_lossy(buf)),
    }
}

fn refusal(buf: &[u8]) -> Refusal {
    match parse(buf, &ParseLimits::default()) {
        Parsed::Refused(refusal) => refusal,
        other => panic!("{:?}: {other:?}", String::from_utf8_lossy(buf)),
    }
}

/// `line` is refused with `BAD_FORMAT`, the line dropped, the connection kept.
fn bad_format(line: &[u8]) {
    assert_eq!(
        refusal(line),
        Refusal::new(line.len(), reply::BAD_FORMAT),
        "{:?}",
        String::from_utf8_lossy(line)
    );
}

fn tube(name: &str) -> Tube<'_> {
    Tube::parse(name.as_bytes(), 200).unwrap()
}

#[test]
fn put() {
    let put = request(b"put 1 2 3 5\r\nhello\r\n");
    let expected = Request::Put {
        pri: 1,
        delay: 2,
        ttr: 3,
        data: b"hello",
    };
    assert_eq!(put, expected);
    let max = request(b"put 4294967295 4294967295 4294967295 0\r\n\r\n");
    assert!(matches!(
        max,
        Request::Put {
            pri: u32::MAX,
            delay: u32::MAX,
            ttr: u32::MAX,
            data: b""
        }
    ));
    assert!(matches!(
        request(b"put 0 0 0 1\r\nx\r\n"),
        Request::Put { ttr: 0, .. }
    ));
}

#[test]
fn put_bodies_are_data_whatever_they_hold() {
    let put = request(b"put 0 0 1 25\r\ndelete 1\r\nquit\r\nput 0 0\r\n\r\n");
    assert!(matches!(
        put,
        Request::Put {
            data: b"delete 1\r\nquit\r\nput 0 0\r\n",
            ..
        }
    ));
    let binary = request(b"put 0 0 1 3\r\n\x00\r\xff\r\n");
    assert!(matches!(
        binary,
        Request::Put {
            data: b"\x00\r\xff",
            ..
        }
    ));
}

#[test]
fn put_waits_for_its_whole_body_and_crlf() {
    for partial in [
        &b"put 0 0 1 5\r\nhel"[..],
        b"put 0 0 1 5\r\nhello",
        b"put 0 0 1 5\r\nhello\r",
    ] {
        assert_eq!(parse(partial, &ParseLimits::default()), Parsed::Incomplete);
    }
}

#[test]
fn put_body_not_ended_by_crlf_is_expected_crlf_after_count_plus_two() {
    let buf = b"put 0 0 1 3\r\nhello\r\n";
    assert_eq!(refusal(buf), Refusal::new(18, reply::EXPECTED_CRLF));
    assert_eq!(common::outcomes(buf), "EXPECTED_CRLF UNKNOWN_COMMAND");
    assert_eq!(
        refusal(b"put 0 0 1 1\r\nx\nY"),
        Refusal::new(16, reply::EXPECTED_CRLF)
    );
}

#[test]
fn put_too_big_drops_the_body_unread() {
    let line = b"put 0 0 1 65536\r\n";
    let expected = Refusal {
        discard_bytes: 65538,
        ..Refusal::new(line.len(), reply::JOB_TOO_BIG)
    };
    assert_eq!(refusal(line), expected);
    // Checked before the junk after the count, as beanstalkd does.
    let junk = b"put 0 0 1 65536 x\r\n";
    assert_eq!(refusal(junk).reply, reply::JOB_TOO_BIG);
    let limits = ParseLimits {
        job_bytes_max: 4,
        ..ParseLimits::default()
    };
    assert!(matches!(
        parse(b"put 0 0 1 4\r\nabcd\r\n", &limits),
        Parsed::Complete { .. }
    ));
    assert!(
        matches!(parse(b"put 0 0 1 5\r\nabcde\r\n", &limits), Parsed::Refused(r) if r.reply == reply::JOB_TOO_BIG)
    );
}

#[test]
fn a_bad_put_line_drops_the_body_by_its_count_or_closes() {
    for line in [
        &b"put -1 0 1 5\r\n"[..],
        b"put 0 0.5 1 5\r\n",
        b"put 0 0 1 5 \r\n",
        b"put 0 0 1 5 x\r\n",
        b"put 4294967296 0 1 5\r\n",
    ] {
        let expected = Refusal {
            discard_bytes: 7,
            ..Refusal::new(line.len(), reply::BAD_FORMAT)
        };
        assert_eq!(
            refusal(line),
            expected,
            "{:?}",
            String::from_utf8_lossy(line)
        );
    }
    for line in [
        &b"put 0 0 1\r\n"[..],
        b"put 0 0 1 -5\r\n",
        b"put 0 0 1 4294967296\r\n",
        b"put x\r\n",
        b"put \r\n",
    ] {
        let expected = Refusal {
            close: true,
            ..Refusal::new(line.len(), reply::BAD_FORMAT)
        };
        assert_eq!(
            refusal(line),
            expected,
            "{:?}",
            String::from_utf8_lossy(line)
        );
    }
}

#[test]
fn use_watch_ignore_stats_tube() {
    assert_eq!(request(b"use foo\r\n"), Request::Use { tube: tube("foo") });
    assert_eq!(
        request(b"watch a-+/;.$_()Z9\r\n"),
        Request::Watch {
            tube: tube("a-+/;.$_()Z9")
        }
    );
    assert_eq!(
        request(b"ignore default\r\n"),
        Request::Ignore {
            tube: tube("default")
        }
    );
    assert_eq!(
        request(b"stats-tube t\r\n"),
        Request::StatsTube { tube: tube("t") }
    );
    let long = format!("use {}\r\n", "a".repeat(200));
    assert!(
        matches!(request(long.as_bytes()), Request::Use { tube } if tube.as_str().len() == 200)
    );
    for word in ["use", "watch", "ignore", "stats-tube"] {
        for name in [
            "",
            " foo",
            "foo ",
            "-foo",
            "foo*",
            "a b",
            "caf\u{e9}",
            &"a".repeat(201),
        ] {
            bad_format(format!("{word} {name}\r\n").as_bytes());
        }
    }
}

#[test]
fn reserve_and_reserve_with_timeout() {
    assert_eq!(request(b"reserve\r\n"), Request::Reserve);
    assert_eq!(
        request(b"reserve-with-timeout 0\r\n"),
        Request::ReserveWithTimeout { seconds: 0 }
    );
    assert_eq!(
        request(b"reserve-with-timeout 4294967295\r\n"),
        Request::ReserveWithTimeout { seconds: u32::MAX }
    );
    for bad in [
        "reserve \r\n",
        "reserve x\r\n",
        "reserve-with-timeout\r\n",
        "reserve-with-timeout -1\r\n",
        "reserve-with-timeout abc\r\n",
        "reserve-with-timeout 1 \r\n",
        "reserve-with-timeout 4294967296\r\n",
    ] {
        bad_format(bad.as_bytes());
    }
}

/// Makes the request of a command that takes one job id.
type IdRequest = fn(u64) -> Request<'static>;

#[test]
fn commands_that_take_one_job_id() {
    let cases: [(&str, IdRequest); 6] = [
        ("reserve-job", |id| Request::ReserveJob { id }),
        ("delete", |id| Request::Delete { id }),
        ("touch", |id| Request::Touch { id }),
        ("peek", |id| Request::Peek { id }),
        ("kick-job", |id| Request::KickJob { id }),
        ("stats-job", |id| Request::StatsJob { id }),
    ];
    for (word, make) in cases {
        assert_eq!(request(format!("{word} 1\r\n").as_bytes()), make(1));
        assert_eq!(request(format!("{word}  007\r\n").as_bytes()), make(7));
        assert_eq!(
            request(format!("{word} 18446744073709551615\r\n").as_bytes()),
            make(u64::MAX)
        );
        for arg in [
            "",
            "-1",
            "+1",
            "0x1",
            "1.0",
            "1 ",
            "1 2",
            "18446744073709551616",
            "one",
        ] {
            bad_format(format!("{word} {arg}\r\n").as_bytes());
        }
    }
}

#[test]
fn release_and_bury() {
    assert_eq!(
        request(b"release 1 2 3\r\n"),
        Request::Release {
            id: 1,
            pri: 2,
            delay: 3
        }
    );
    assert_eq!(
        request(b"bury 5 4294967295\r\n"),
        Request::Bury {
            id: 5,
            pri: u32::MAX
        }
    );
    for bad in [
        "release 1 2\r\n",
        "release 1 2 3 4\r\n",
        "release 1 -1 0\r\n",
        "release 1 2 4294967296\r\n",
        "bury 1\r\n",
        "bury 1 2 3\r\n",
        "bury 1 4294967296\r\n",
        "bury x 1\r\n",
    ] {
        bad_format(bad.as_bytes());
    }
}

#[test]
fn kick() {
    assert_eq!(request(b"kick 10\r\n"), Request::Kick { bound: 10 });
    for bad in [
        "kick \r\n",
        "kick -1\r\n",
        "kick 5x\r\n",
        "kick 1 \r\n",
        "kick 4294967296\r\n",
    ] {
        bad_format(bad.as_bytes());
    }
}

#[test]
fn commands_without_arguments() {
    let cases = [
        ("peek-ready", Request::PeekReady),
        ("peek-delayed", Request::PeekDelayed),
        ("peek-buried", Request::PeekBuried),
        ("stats", Request::Stats),
        ("list-tubes", Request::ListTubes),
        ("list-tube-used", Request::ListTubeUsed),
        ("list-tubes-watched", Request::ListTubesWatched),
    ];
    for (word, expected) in cases {
        assert_eq!(request(format!("{word}\r\n").as_bytes()), expected);
        bad_format(format!("{word} \r\n").as_bytes());
        bad_format(format!("{word} x\r\n").as_bytes());
        bad_format(format!("{word}x\r\n").as_bytes());
    }
}

#[test]
fn pause_tube() {
    assert_eq!(
        request(b"pause-tube foo 10\r\n"),
        Request::PauseTube {
            tube: tube("foo"),
            delay: 10
        }
    );
    // beanstalkd matches `pause-tube` without its space and skips spaces after it.
    assert_eq!(
        request(b"pause-tubefoo 1\r\n"),
        Request::PauseTube {
            tube: tube("foo"),
            delay: 1
        }
    );
    assert_eq!(
        request(b"pause-tube   foo   1\r\n"),
        Request::PauseTube {
            tube: tube("foo"),
            delay: 1
        }
    );
    let long = format!("pause-tube {} 1\r\n", "a".repeat(201));
    for bad in [
        "pause-tube\r\n",
        "pause-tube foo\r\n",
        "pause-tube foo 1 2\r\n",
        "pause-tube foo -1\r\n",
        "pause-tube foo 4294967296\r\n",
        "pause-tube -x 1\r\n",
        "pause-tube foo* 1\r\n",
        &long,
    ] {
        bad_format(bad.as_bytes());
    }
}

#[test]
fn quit_is_anything_that_starts_with_quit() {
    for line in [&b"quit\r\n"[..], b"quit \r\n", b"quitter\r\n"] {
        assert_eq!(request(line), Request::Quit);
    }
}

#[test]
fn unknown_commands() {
    for line in [
        &b"\r\n"[..],
        b"foo\r\n",
        b"STATS\r\n",
        b"Put 0 0 1 1\r\n",
        b" stats\r\n",
        b"delete\t1\r\n",
        b"peek\r\n",
        b"kick\r\n",
        b"use\r\n",
        b"put\r\n",
        b"\x80\xff\r\n",
    ] {
        assert_eq!(
            refusal(line),
            Refusal::new(line.len(), reply::UNKNOWN_COMMAND)
        );
    }
}

#[test]
fn a_nul_byte_makes_any_line_bad() {
    bad_format(b"\x00\r\n");
    bad_format(b"stats\x00\r\n");
    bad_format(b"use a\x00b\r\n");
}

#[test]
fn only_crlf_ends_a_line() {
    assert_eq!(
        parse(b"stats\n", &ParseLimits::default()),
        Parsed::Incomplete
    );
    assert_eq!(
        parse(b"stats\r", &ParseLimits::default()),
        Parsed::Incomplete
    );
    bad_format(b"stats\nlist-tubes\r\n");
    bad_format(b"stats\rx\r\n");
}

#[test]
fn lines_of_up_to_224_bytes_with_their_crlf_are_read() {
    let longest = format!("delete {}1\r\n", "0".repeat(214));
    assert_eq!(longest.len(), 224);
    assert_eq!(request(longest.as_bytes()), Request::Delete { id: 1 });
    let too_long = format!("delete {}1\r\nstats\r\n", "0".repeat(215));
    assert_eq!(
        refusal(too_long.as_bytes()),
        Refusal::new(225, reply::BAD_FORMAT)
    );
    assert_eq!(common::outcomes(too_long.as_bytes()), "BAD_FORMAT stats");
}

#[test]
fn a_line_too_long_is_refused_before_its_end_arrives() {
    let limits = ParseLimits::default();
    assert_eq!(parse(&[b'x'; 223], &limits), Parsed::Incomplete);
    let skip = Refusal {
        skip_line: true,
        ..Refusal::new(224, reply::BAD_FORMAT)
    };
    assert_eq!(parse(&[b'x'; 224], &limits), Parsed::Refused(skip));
    // A final `\r` is left for the skip to find with its `\n`.
    let mut ends_in_cr = vec![b'x'; 300];
    ends_in_cr.push(b'\r');
    let skip = Refusal {
        skip_line: true,
        ..Refusal::new(300, reply::BAD_FORMAT)
    };
    assert_eq!(parse(&ends_in_cr, &limits), Parsed::Refused(skip));
    ends_in_cr.extend_from_slice(b"\nstats\r\n");
    assert_eq!(common::outcomes(&ends_in_cr), "BAD_FORMAT stats");
}

#[test]
fn the_limits_are_beanstalkd_defaults() {
    let limits = ParseLimits::default();
    assert_eq!(limits.line_bytes_max, 224);
    assert_eq!(limits.job_bytes_max, 65_535);
    assert_eq!(limits.tube_bytes_max, 200);
}

#[test]
fn pipelined_requests_parse_one_after_another() {
    let stream = b"use a\r\nput 0 0 1 3\r\nabc\r\nwatch a\r\nignore default\r\nreserve-with-timeout 0\r\nfoo\r\ndelete 1\r\nquit\r\nstats\r\n";
    assert_eq!(
        common::outcomes(stream),
        "use put watch ignore reserve-with-timeout UNKNOWN_COMMAND delete quit"
    );
}
