//! Properties of the parser over generated input: arbitrary bytes never make it
//! panic or consume more than it has; a stream parses the same however it is split
//! into reads; a `put` body is data whatever it holds; and every strict prefix of a
//! valid pipeline is `Incomplete` after the requests it holds whole.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure is a panic

mod common;

use proptest::prelude::*;
use weir_beanstalk::{parse, ParseLimits, Parsed, Request};

/// A tube name: beanstalkd's characters, not starting with `-`.
fn tube() -> impl Strategy<Value = String> {
    "[A-Za-z0-9+/;.$_()][A-Za-z0-9+/;.$_()-]{0,40}"
}

/// A job body: random bytes, or pieces of requests that must stay data.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"delete 1\r\n".to_vec()),
        Just(b"quit\r\n".to_vec()),
        Just(b"put 0 0 1 3\r\n".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"stats".to_vec()),
        prop::collection::vec(any::<u8>(), 0..16),
    ];
    prop::collection::vec(piece, 0..8).prop_map(|pieces| pieces.concat())
}

/// One valid request (never `quit`, which ends a pipeline) and its command's name.
fn request() -> impl Strategy<Value = (Vec<u8>, &'static str)> {
    let id_word = prop::sample::select(vec![
        "reserve-job",
        "delete",
        "touch",
        "peek",
        "kick-job",
        "stats-job",
    ]);
    let tube_word = prop::sample::select(vec!["use", "watch", "ignore", "stats-tube"]);
    let bare = prop::sample::select(vec![
        "reserve",
        "peek-ready",
        "peek-delayed",
        "peek-buried",
        "stats",
        "list-tubes",
        "list-tube-used",
        "list-tubes-watched",
    ]);
    prop_oneof![
        (any::<u32>(), any::<u32>(), any::<u32>(), body()).prop_map(|(pri, delay, ttr, data)| {
            let mut put = format!("put {pri} {delay} {ttr} {}\r\n", data.len()).into_bytes();
            put.extend_from_slice(&data);
            put.extend_from_slice(b"\r\n");
            (put, "put")
        }),
        (tube_word, tube()).prop_map(|(w, t)| (format!("{w} {t}\r\n").into_bytes(), w)),
        (tube(), any::<u32>())
            .prop_map(|(t, d)| (format!("pause-tube {t} {d}\r\n").into_bytes(), "pause-tube")),
        (id_word, any::<u64>()).prop_map(|(w, id)| (format!("{w} {id}\r\n").into_bytes(), w)),
        (any::<u64>(), any::<u32>(), any::<u32>())
            .prop_map(|(id, p, d)| (format!("release {id} {p} {d}\r\n").into_bytes(), "release")),
        (any::<u64>(), any::<u32>())
            .prop_map(|(id, p)| (format!("bury {id} {p}\r\n").into_bytes(), "bury")),
        any::<u32>().prop_map(|n| (format!("kick {n}\r\n").into_bytes(), "kick")),
        any::<u32>().prop_map(|n| (
            format!("reserve-with-timeout {n}\r\n").into_bytes(),
            "reserve-with-timeout"
        )),
        bare.prop_map(|w| (format!("{w}\r\n").into_bytes(), w)),
    ]
}

/// Requests, and the valid ones' names.
fn pipeline() -> impl Strategy<Value = (Vec<u8>, Vec<&'static str>, Vec<usize>)> {
    prop::collection::vec(request(), 1..12).prop_map(|requests| {
        let mut stream = Vec::new();
        let mut ends = Vec::new();
        for (bytes, _) in &requests {
            stream.extend_from_slice(bytes);
            ends.push(stream.len());
        }
        let names = requests.iter().map(|(_, name)| *name).collect();
        (stream, names, ends)
    })
}

/// Bytes that look like requests, good and bad, or like nothing at all.
fn noise() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..64),
        request().prop_map(|(bytes, _)| bytes),
        Just(b"put 0 0 1 70000\r\n".to_vec()),
        Just(b"put 0 0 1 5 x\r\n".to_vec()),
        Just(b"put -1\r\n".to_vec()),
        Just(vec![b'x'; 230]),
        Just(b"\r\n".to_vec()),
        Just(b"quit\r\n".to_vec()),
    ];
    prop::collection::vec(piece, 0..10).prop_map(|pieces| pieces.concat())
}

/// Limits from tiny (every line too long, every job too big) to the defaults.
fn limits() -> impl Strategy<Value = ParseLimits> {
    prop_oneof![
        Just(ParseLimits::default()),
        (0usize..40, 0u32..20, 0usize..10).prop_map(|(line, job, tube)| ParseLimits {
            line_bytes_max: line,
            job_bytes_max: job,
            tube_bytes_max: tube,
        }),
    ]
}

/// `stream` cut at `cuts` (positions, in any order, any of them past the end).
fn split<'a>(stream: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
    cuts.sort_unstable();
    let mut reads = Vec::new();
    let mut start = 0;
    for cut in cuts {
        reads.push(&stream[start..cut]);
        start = cut;
    }
    reads.push(&stream[start..]);
    reads
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic_nor_overconsume(bytes in prop::collection::vec(any::<u8>(), 0..600), limits in limits()) {
        // `run` asserts every step consumes within the buffer.
        common::run(&bytes, &limits);
        match parse(&bytes, &limits) {
            Parsed::Complete { consumed, .. } => prop_assert!(consumed >= 1 && consumed <= bytes.len()),
            Parsed::Refused(refusal) => prop_assert!(refusal.consumed >= 1 && refusal.consumed <= bytes.len()),
            Parsed::Incomplete => {}
        }
    }

    #[test]
    fn noise_parses_the_same_however_it_is_split(stream in noise(), cuts in prop::collection::vec(any::<usize>(), 0..8), limits in limits()) {
        let whole = common::run(&stream, &limits);
        let split = common::run_reads(&split(&stream, &cuts), &limits);
        prop_assert_eq!(whole.outcomes, split.outcomes);
        prop_assert_eq!(whole.replies, split.replies);
        prop_assert_eq!(whole.closed, split.closed);
    }

    #[test]
    fn a_valid_pipeline_parses_to_its_requests_however_it_is_split((stream, names, _) in pipeline(), cuts in prop::collection::vec(any::<usize>(), 0..8)) {
        let run = common::run_reads(&split(&stream, &cuts), &ParseLimits::default());
        prop_assert_eq!(run.outcomes, names);
        prop_assert!(run.replies.is_empty());
        prop_assert_eq!(run.rest, 0);
    }

    #[test]
    fn a_put_body_is_data_whatever_it_holds(data in body(), pri in any::<u32>()) {
        let mut put = format!("put {pri} 0 1 {}\r\n", data.len()).into_bytes();
        put.extend_from_slice(&data);
        put.extend_from_slice(b"\r\n");
        let parsed = parse(&put, &ParseLimits::default());
        let expected = Parsed::Complete {
            request: Request::Put { pri, delay: 0, ttr: 1, data: &data },
            consumed: put.len(),
        };
        prop_assert_eq!(parsed, expected);
    }

    #[test]
    fn every_prefix_of_a_valid_pipeline_waits_after_its_whole_requests((stream, names, ends) in pipeline()) {
        for cut in 0..stream.len() {
            let run = common::run(&stream[..cut], &ParseLimits::default());
            let whole = ends.iter().filter(|&&end| end <= cut).count();
            prop_assert_eq!(&run.outcomes[..], &names[..whole]);
            let last_end = if whole == 0 { 0 } else { ends[whole - 1] };
            prop_assert_eq!(run.rest, cut - last_end);
        }
    }
}

/// Every prefix of one fixed pipeline, byte by byte: `Incomplete` until each
/// request's last byte, then that request.
#[test]
fn every_prefix_of_a_fixed_pipeline_is_incomplete_until_it_is_whole() {
    let requests: [&[u8]; 8] = [
        b"use jobs\r\n",
        b"put 1 0 60 10\r\nquit\r\nx\r\ny\r\n",
        b"watch jobs\r\n",
        b"reserve-with-timeout 5\r\n",
        b"release 1 2 3\r\n",
        b"put 0 0 1 0\r\n\r\n",
        b"pause-tube jobs 10\r\n",
        b"list-tubes-watched\r\n",
    ];
    let stream = requests.concat();
    let mut end = 0;
    for request in requests {
        let start = end;
        end += request.len();
        for cut in start..end {
            assert_eq!(
                parse(&stream[start..cut], &ParseLimits::default()),
                Parsed::Incomplete,
                "{cut}"
            );
        }
        assert!(matches!(
            parse(&stream[start..], &ParseLimits::default()),
            Parsed::Complete { consumed, .. } if consumed == request.len()
        ));
    }
}
