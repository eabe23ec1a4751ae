//! Captures as a file: one JSON object per line, so that a recording can leave the
//! machine it was made on (`weir capture export`), come back into another weir
//! (`weir capture import`) and be replayed from anywhere (`weir replay`).
//!
//! A line holds `seq` (the capture's sequence number in the queue it came from;
//! ignored on import, where the queue gives new ones), `method`, `uri` (path and
//! query), `headers` (a list of `[name, value]` pairs, in order, repeats kept),
//! `at_ms` (when the proxy received the request, Unix ms), `body` (base64), and when
//! the primary's answer was captured, `response`: `status`, `headers`, `body`
//! (base64) and `body_whole` (false when the answer's body was not kept whole).
//! Unknown keys are ignored, so a newer weir's files load in an older one.
//!
//! Reading checks every line (method, URI, header names and values as HTTP allows
//! them, status, base64) and refuses one longer than [`LINE_BYTES_MAX`], naming the
//! line. The queue side goes through the backend interface, as every other use of
//! storage does, so it works alike on either backend and on a running weir or a
//! stopped weir's data directory: [`walk_captures`] and [`walk_scan`] read a capture
//! queue through a [`weir_backend::Scan`] (made with [`scan_from`]) without consuming
//! it; appending is `tools::captures::append_captures`.

use std::io::BufRead;

use base64::Engine as _;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::capture::{Captured, CapturedResponse};

/// Longest line read (32 MiB): a capture of about 24 MiB of bodies once base64 is
/// undone, well past the default `capture_bytes_max` of 1 MiB per body.
pub const LINE_BYTES_MAX: usize = 32 * 1024 * 1024;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// A line as written.
#[derive(Serialize)]
struct LineOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    seq: Option<u64>,
    method: &'a str,
    uri: &'a str,
    headers: &'a [(String, String)],
    #[serde(skip_serializing_if = "Option::is_none")]
    host: Option<&'a str>,
    at_ms: u64,
    body: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    response: Option<ResponseOut<'a>>,
}

#[derive(Serialize)]
struct ResponseOut<'a> {
    status: u16,
    headers: &'a [(String, String)],
    body: String,
    body_whole: bool,
}

/// A line as read.
#[derive(Deserialize)]
struct LineIn {
    #[serde(default)]
    seq: Option<u64>,
    method: String,
    uri: String,
    #[serde(default)]
    headers: Vec<(String, String)>,
    #[serde(default)]
    host: Option<String>,
    at_ms: u64,
    #[serde(default)]
    body: String,
    #[serde(default)]
    response: Option<ResponseIn>,
}

#[derive(Deserialize)]
struct ResponseIn {
    status: u16,
    #[serde(default)]
    headers: Vec<(String, String)>,
    #[serde(default)]
    body: String,
    body_whole: bool,
}

/// A line that could not be read: its number (from 1) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    pub line: u64,
    pub reason: String,
}

impl std::fmt::Display for LineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.reason)
    }
}

impl std::error::Error for LineError {}

/// One capture as a line, `\n` included.
pub fn encode_line(seq: Option<u64>, c: &Captured) -> Vec<u8> {
    let line = LineOut {
        seq,
        method: &c.method,
        uri: &c.uri,
        headers: &c.headers,
        host: c.host.as_deref(),
        at_ms: c.at_ms,
        body: B64.encode(&c.body),
        response: c.response.as_ref().map(|r| ResponseOut {
            status: r.status,
            headers: &r.headers,
            body: B64.encode(&r.body),
            body_whole: r.body_whole,
        }),
    };
    // Strings, numbers and lists of strings: serializing cannot fail.
    let mut out = serde_json::to_vec(&line).unwrap_or_default();
    out.push(b'\n');
    out
}

/// One line (without its `\n`) back into a capture, checked; with the `seq` it
/// carried, if any.
pub fn decode_line(line: &[u8]) -> Result<(Option<u64>, Captured), String> {
    let l: LineIn = serde_json::from_slice(line).map_err(|e| {
        // serde's own position counts lines of the one line read: the column is
        // what helps.
        let text = e.to_string();
        let reason = text
            .rsplit_once(" at line ")
            .map_or(text.as_str(), |(r, _)| r);
        format!("not a capture: {reason} (at column {})", e.column())
    })?;
    check_request(&l)?;
    let body = B64
        .decode(l.body.as_bytes())
        .map_err(|e| format!("body: not base64: {e}"))?;
    let response = match l.response {
        None => None,
        Some(r) => Some(response_in(r)?),
    };
    let captured = Captured {
        method: l.method,
        uri: l.uri,
        headers: l.headers,
        host: l.host,
        at_ms: l.at_ms,
        body: Bytes::from(body),
        response,
    };
    Ok((l.seq, captured))
}

fn response_in(r: ResponseIn) -> Result<CapturedResponse, String> {
    if !(100..=999).contains(&r.status) {
        return Err(format!("response.status {}: 100 to 999", r.status));
    }
    check_headers("response.headers", &r.headers)?;
    let body = B64
        .decode(r.body.as_bytes())
        .map_err(|e| format!("response.body: not base64: {e}"))?;
    Ok(CapturedResponse {
        status: r.status,
        headers: r.headers,
        body_whole: r.body_whole,
        body_len: body.len() as u64,
        body: Bytes::from(body),
    })
}

/// What a replay needs to make a request of it: a method, a path, headers HTTP takes.
fn check_request(l: &LineIn) -> Result<(), String> {
    hyper::Method::from_bytes(l.method.as_bytes())
        .map_err(|_| format!("method {:?}: not an HTTP method", l.method))?;
    if !l.uri.starts_with('/') || l.uri.parse::<hyper::http::uri::PathAndQuery>().is_err() {
        return Err(format!(
            "uri {:?}: a path (and query) starting with /",
            l.uri
        ));
    }
    check_headers("headers", &l.headers)?;
    match &l.host {
        Some(h) if hyper::header::HeaderValue::from_str(h).is_err() => {
            Err(format!("host {h:?}: not a header value"))
        }
        _ => Ok(()),
    }
}

fn check_headers(key: &str, headers: &[(String, String)]) -> Result<(), String> {
    for (name, value) in headers {
        hyper::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("{key}: {name:?} is not a header name"))?;
        hyper::header::HeaderValue::from_str(value)
            .map_err(|_| format!("{key}: the value of {name} is not a header value"))?;
    }
    Ok(())
}

/// A capture read from a file: its line's number, the seq it carried, the capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileCapture {
    pub line: u64,
    pub seq: Option<u64>,
    pub captured: Captured,
}

/// Reads lines of at most `max` bytes, numbered from 1; blank lines are skipped.
pub struct Lines<R> {
    reader: R,
    max: usize,
    number: u64,
    buf: Vec<u8>,
}

impl<R: BufRead> Lines<R> {
    pub fn new(reader: R, max: usize) -> Lines<R> {
        Lines {
            reader,
            max,
            number: 0,
            buf: Vec::new(),
        }
    }

    /// The next non-blank line (without its line end) and its number; `None` at the
    /// end. A line over the limit, or a read error, is an error (and the last).
    pub fn next_line(&mut self) -> Option<Result<(u64, &[u8]), LineError>> {
        loop {
            self.buf.clear();
            self.number += 1;
            match self.read_bounded() {
                Ok(0) => return None,
                Ok(_) => {}
                Err(reason) => {
                    return Some(Err(LineError {
                        line: self.number,
                        reason,
                    }))
                }
            }
            let line = trim_line_end(&self.buf);
            if !line.iter().all(u8::is_ascii_whitespace) {
                let end = line.len();
                return Some(Ok((self.number, &self.buf[..end])));
            }
        }
    }

    /// Reads up to the next `\n` (kept) into `buf`, refusing more than `max` bytes
    /// before it without reading them all.
    fn read_bounded(&mut self) -> Result<usize, String> {
        loop {
            let chunk = self
                .reader
                .fill_buf()
                .map_err(|e| format!("reading: {e}"))?;
            if chunk.is_empty() {
                return self.judged();
            }
            let (take, done) = match newline_at(chunk) {
                Some(i) => (i + 1, true),
                None => (chunk.len(), false),
            };
            if self.buf.len() + take > self.max + 2 {
                return Err(format!("longer than the limit of {} bytes", self.max));
            }
            self.buf.extend_from_slice(&chunk[..take]);
            self.reader.consume(take);
            if done {
                return self.judged();
            }
        }
    }

    /// The length read, once the line (without its end) is known to fit.
    fn judged(&self) -> Result<usize, String> {
        if trim_line_end(&self.buf).len() > self.max {
            return Err(format!("longer than the limit of {} bytes", self.max));
        }
        Ok(self.buf.len())
    }

    /// The next capture, checked, with the number of its line and the seq it carried.
    pub fn next_capture(&mut self) -> Option<Result<FileCapture, LineError>> {
        let (number, line) = match self.next_line()? {
            Ok(l) => l,
            Err(e) => return Some(Err(e)),
        };
        Some(
            decode_line(line)
                .map(|(seq, captured)| FileCapture {
                    line: number,
                    seq,
                    captured,
                })
                .map_err(|reason| LineError {
                    line: number,
                    reason,
                }),
        )
    }
}

fn newline_at(chunk: &[u8]) -> Option<usize> {
    chunk.iter().position(|&b| b == b'\n')
}

fn trim_line_end(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Every capture of an in-memory text, each as the item a capture queue stores; the
/// first bad line stops it.
pub fn items_of(text: &[u8], max_line: usize) -> Result<Vec<Vec<u8>>, LineError> {
    let mut lines = Lines::new(text, max_line);
    let mut items = Vec::new();
    while let Some(next) = lines.next_capture() {
        items.push(next?.captured.encode());
    }
    Ok(items)
}

/// What an export wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Exported {
    pub captures: u64,
    /// Items that did not decode as captures (damaged): left out, logged.
    pub skipped: u64,
}

/// What a walk over a capture queue hands on: the captures received at `since_ms`
/// or later, at most `limit` of them; damaged items are left out (logged, counted).
struct Filter<'a> {
    queue: &'a str,
    since_ms: Option<u64>,
    limit: Option<u64>,
    done: Exported,
}

impl Filter<'_> {
    fn full(&self) -> bool {
        self.limit.is_some_and(|l| self.done.captures >= l)
    }

    /// The capture `item` holds, when the walk hands it on.
    fn capture(&mut self, item: &weir_backend::Item) -> Option<Captured> {
        let c = match Captured::decode(&item.data) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(
                    queue = self.queue,
                    seq = item.seq,
                    "skipping a damaged capture: {e}"
                );
                self.done.skipped += 1;
                return None;
            }
        };
        if self.since_ms.is_some_and(|ms| c.at_ms < ms) {
            return None;
        }
        Some(c)
    }
}

/// Items a [`walk_scan`] reads at a time.
const SCAN_PAGE: usize = 64;

/// How far before `since` a walk starts. A capture is appended after its request
/// arrived, so on one clock the first capture received at `since` lies at or after
/// the first item appended then; but a JetStream cluster stamps items with its own
/// clock, which may run behind the proxy's. The captures walked past are left out
/// by their own time (`at_ms`).
const SINCE_CLOCK_MARGIN_MS: u64 = 5 * 60 * 1000;

/// Where a walk of the captures received at `since_ms` or later starts.
pub fn scan_from(since_ms: Option<u64>) -> weir_backend::ScanFrom {
    since_ms.map_or(weir_backend::ScanFrom::Oldest, |ms| {
        weir_backend::ScanFrom::Time(ms.saturating_sub(SINCE_CLOCK_MARGIN_MS))
    })
}

/// Walks the captures of `scan` (made with [`scan_from`]) without consuming
/// anything: those received at `since_ms` or later, at most `limit`, each handed to
/// `each` with its seq; `each` answers whether to go on. Items appended after the
/// walk began are not included; damaged ones are left out (logged, counted).
pub async fn walk_captures<F: std::future::Future<Output = bool>>(
    mut scan: weir_backend::Scan,
    queue: &str,
    since_ms: Option<u64>,
    limit: Option<u64>,
    mut each: impl FnMut(u64, Captured) -> F,
) -> weir_backend::Result<Exported> {
    let mut filter = Filter {
        queue,
        since_ms,
        limit,
        done: Exported::default(),
    };
    while !filter.full() {
        // No more than the limit needs (each item is a round trip on JetStream).
        let left = limit.map_or(u64::MAX, |l| l - filter.done.captures);
        let page = scan.next_page(left.min(SCAN_PAGE as u64) as usize).await?;
        if page.is_empty() {
            break;
        }
        for item in page {
            if filter.full() {
                break;
            }
            let Some(c) = filter.capture(&item) else {
                continue;
            };
            if !each(item.seq, c).await {
                return Ok(filter.done);
            }
            filter.done.captures += 1;
        }
    }
    Ok(filter.done)
}

/// [`walk_captures`], each capture as its line (what an export writes), handed to
/// `out`, which answers whether to go on.
pub async fn walk_scan<F: std::future::Future<Output = bool>>(
    scan: weir_backend::Scan,
    queue: &str,
    since_ms: Option<u64>,
    limit: Option<u64>,
    mut out: impl FnMut(Vec<u8>) -> F,
) -> weir_backend::Result<Exported> {
    walk_captures(scan, queue, since_ms, limit, |seq, c| {
        out(encode_line(Some(seq), &c))
    })
    .await
}

/// Reads a whole capture file, checking every line; nothing is kept but the count.
/// What `weir capture import` and `weir replay --from-file` run first, so that a
/// file with a bad line sends nothing.
pub fn check_all<R: BufRead>(reader: R, max_line: usize) -> Result<u64, LineError> {
    let mut lines = Lines::new(reader, max_line);
    let mut n = 0;
    while let Some(next) = lines.next_capture() {
        next?;
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Captured {
        Captured {
            method: "POST".into(),
            uri: "/api/items?x=1&y=%20".into(),
            headers: vec![
                ("content-type".into(), "application/json".into()),
                ("cookie".into(), "a=1".into()),
                ("cookie".into(), "b=2".into()),
            ],
            host: None,
            at_ms: 1_700_000_000_123,
            body: Bytes::from_static(b"{\"k\":1}\x00\xff\n"),
            response: None,
        }
    }

    #[test]
    fn a_capture_round_trips_with_and_without_an_answer() {
        let c = sample();
        let line = encode_line(Some(7), &c);
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        let (seq, back) = decode_line(&line[..line.len() - 1]).unwrap();
        assert_eq!((seq, back), (Some(7), c.clone()));
        let mut answered = c;
        answered.response = Some(CapturedResponse {
            status: 201,
            headers: vec![("x-a".into(), "b".into())],
            body_whole: true,
            body_len: 3,
            body: Bytes::from_static(b"\x01\x02\x03"),
        });
        let line = encode_line(None, &answered);
        let (seq, back) = decode_line(&line).unwrap();
        assert_eq!((seq, back), (None, answered));
    }

    #[test]
    fn bad_lines_are_refused_with_the_reason() {
        let cases: &[(&str, &str)] = &[
            ("{", "not a capture"),
            ("[]", "not a capture"),
            (r#"{"method":"GET","uri":"/"}"#, "at_ms"),
            (r#"{"method":"G T","uri":"/","at_ms":1}"#, "method"),
            (r#"{"method":"GET","uri":"x","at_ms":1}"#, "uri"),
            (r#"{"method":"GET","uri":"/a b","at_ms":1}"#, "uri"),
            (r#"{"method":"GET","uri":"/","at_ms":-1}"#, "not a capture"),
            (
                r#"{"method":"GET","uri":"/","at_ms":1,"body":"!!"}"#,
                "body",
            ),
            (
                r#"{"method":"GET","uri":"/","at_ms":1,"headers":[["a b","c"]]}"#,
                "header name",
            ),
            (
                r#"{"method":"GET","uri":"/","at_ms":1,"headers":[["a","c\n"]]}"#,
                "header value",
            ),
            (
                r#"{"method":"GET","uri":"/","at_ms":1,"headers":[["a"]]}"#,
                "not a capture",
            ),
            (
                r#"{"method":"GET","uri":"/","at_ms":1,"response":{"status":42,"body_whole":true}}"#,
                "status",
            ),
            (
                r#"{"method":"GET","uri":"/","at_ms":1,"response":{"status":200,"body":"*","body_whole":true}}"#,
                "response.body",
            ),
        ];
        for (line, why) in cases {
            let e = decode_line(line.as_bytes()).unwrap_err();
            assert!(e.contains(why), "{line}: {e}");
        }
        // Unknown keys are ignored; missing optional ones take their defaults.
        let (_, c) = decode_line(br#"{"method":"GET","uri":"/","at_ms":1,"later":true}"#).unwrap();
        assert!(c.headers.is_empty() && c.body.is_empty() && c.response.is_none());
    }

    #[test]
    fn lines_are_numbered_blank_ones_skipped_and_long_ones_refused() {
        let good = encode_line(Some(1), &sample());
        let mut text = good.clone();
        text.extend_from_slice(b"\n   \r\n");
        text.extend_from_slice(&good[..good.len() - 1]);
        text.extend_from_slice(b"\r\n");
        text.extend_from_slice(b"{oops}\n");
        let mut lines = Lines::new(&text[..], LINE_BYTES_MAX);
        let first = lines.next_capture().unwrap().unwrap();
        assert_eq!((first.line, first.seq), (1, Some(1)));
        assert_eq!(lines.next_capture().unwrap().unwrap().line, 4);
        let e = lines.next_capture().unwrap().unwrap_err();
        assert_eq!(e.line, 5);
        assert!(e.to_string().starts_with("line 5: not a capture"), "{e}");
        assert!(lines.next_capture().is_none());
        assert_eq!(items_of(&text, LINE_BYTES_MAX).unwrap_err().line, 5);
        assert_eq!(check_all(&text[..], LINE_BYTES_MAX).unwrap_err().line, 5);
        // The limit holds for a line with or without its end, and one at the limit is
        // read.
        let max = good.len() - 1;
        assert_eq!(check_all(&good[..], max).unwrap(), 1);
        assert_eq!(check_all(&good[..max], max).unwrap(), 1);
        let e = check_all(&good[..], max - 1).unwrap_err();
        assert!(e.line == 1 && e.reason.contains("limit of"), "{e}");
        let e = check_all(&good[..max], max - 1).unwrap_err();
        assert!(e.reason.contains("limit of"), "{e}");
        // A last line with no line end is read.
        let mut two = good.clone();
        two.extend_from_slice(&good[..max]);
        assert_eq!(items_of(&two, LINE_BYTES_MAX).unwrap().len(), 2);
        assert_eq!(check_all(&b""[..], 10).unwrap(), 0);
    }

    /// An export through the backend (as `walk_scan` makes one): the lines and what
    /// was done, stopping after `stop_after` lines.
    async fn export(
        backend: &weir_backend::Backend,
        queue: &str,
        since: Option<u64>,
        limit: Option<u64>,
        stop_after: usize,
    ) -> (Exported, Vec<Vec<u8>>) {
        let scan = backend.scan(queue, scan_from(since)).await.unwrap();
        let mut got = Vec::new();
        let done = walk_scan(scan, queue, since, limit, |line| {
            got.push(line);
            let go_on = got.len() < stop_after;
            async move { go_on }
        })
        .await
        .unwrap();
        (done, got)
    }

    #[tokio::test]
    async fn a_queue_exports_through_the_backend_without_consuming_and_takes_a_batch() {
        let dir = tempfile::tempdir().unwrap();
        let backend =
            weir_backend::Backend::Embedded(weir_backend::Embedded::open(dir.path()).unwrap());
        let name = "proxy:capture:t";
        let append = crate::tools::captures::append_captures;
        let mut items = Vec::new();
        for i in 0..5u64 {
            let mut c = sample();
            c.at_ms = 1_000 + i;
            c.uri = format!("/n/{i}");
            let line = encode_line(None, &c);
            items.extend(items_of(&line, LINE_BYTES_MAX).unwrap());
        }
        assert_eq!(append(&backend, name, &items).await.unwrap(), Some(1));
        assert_eq!(append(&backend, name, &[]).await.unwrap(), None);
        let queue = backend.queue(name).await.unwrap();
        queue.append(b"damaged", Default::default()).await.unwrap();
        let (done, got) = export(&backend, name, None, None, usize::MAX).await;
        assert_eq!(
            done,
            Exported {
                captures: 5,
                skipped: 1
            }
        );
        let (seq, first) = decode_line(&got[0]).unwrap();
        assert_eq!(
            (seq, first.uri.as_str(), first.at_ms),
            (Some(1), "/n/0", 1_000)
        );
        // Again: nothing was consumed. `since` is the request's time; `limit` counts.
        let (done, got) = export(&backend, name, Some(1_003), Some(1), usize::MAX).await;
        let uris: Vec<String> = got.iter().map(|l| decode_line(l).unwrap().1.uri).collect();
        assert_eq!((done.captures, uris), (1, vec!["/n/3".to_string()]));
        // The walk stops when told to.
        let (_, got) = export(&backend, name, None, None, 2).await;
        assert_eq!(got.len(), 2);
        // A batch is all or nothing: one item over the queue's item limit refuses it.
        let store = backend.engine_store_for_tests().unwrap();
        let engine_queue = store.existing_queue(name).unwrap().unwrap();
        let mut config = engine_queue.config();
        config.max_item_size_bytes = 400;
        engine_queue.set_config(config);
        let mut big = sample();
        big.body = Bytes::from(vec![b'x'; 1000]);
        let batch = vec![sample().encode(), big.encode()];
        assert!(append(&backend, name, &batch).await.is_err());
        assert_eq!(queue.bounds().await.unwrap().1, 7);
        drop((queue, engine_queue));
        backend.close().await.unwrap();
    }
}
