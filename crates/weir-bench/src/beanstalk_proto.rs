//! A minimal beanstalkd-protocol client for load generation (the commands the
//! `beanstalk` benchmark needs: `use`, `watch`, `ignore`, `put`,
//! `reserve-with-timeout`, `delete`, `stats`).
//!
//! Like the memcache client (`proto.rs`, whose read buffer it shares) it writes
//! prebuilt request bytes, finds line ends with memchr and checks every reply
//! strictly: `INSERTED id`, `RESERVED id len` with the very body sent, `DELETED`.
//! Anything else (`TIMED_OUT`, `DEADLINE_SOON`, `BURIED`, `OUT_OF_MEMORY`, a closed
//! connection, garbage) is an error naming what arrived, never a panic.

use std::net::SocketAddr;

use anyhow::{anyhow, bail, Context, Result};
use tokio::io::{AsyncRead, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::proto::{preview, write_repeated, ReplyBuf};

/// Seconds a reserved job may stay reserved before the server releases it; far above
/// any step's round trip, so a slow machine never sees `DEADLINE_SOON`.
const TTR_SECONDS: u32 = 120;

/// The request bytes of `put PRI DELAY TTR LEN\r\nDATA\r\n`.
pub fn put_request(delay_seconds: u32, data: &[u8]) -> Vec<u8> {
    let mut req = format!("put 1024 {delay_seconds} {TTR_SECONDS} {}\r\n", data.len()).into_bytes();
    req.extend_from_slice(data);
    req.extend_from_slice(b"\r\n");
    req
}

/// The request bytes of a `put` of `data` followed by `reserve-with-timeout 0` (one
/// write: the server handles them in order, so the reservation finds the job).
pub fn put_reserve_request(data: &[u8]) -> Vec<u8> {
    let mut req = put_request(0, data);
    req.extend_from_slice(b"reserve-with-timeout 0\r\n");
    req
}

/// Splits a reply line into its words; the line must be ASCII.
fn words<'a>(line: &'a [u8], what: &str) -> Result<Vec<&'a str>> {
    let text = std::str::from_utf8(line)
        .map_err(|_| anyhow!("{what} got a reply that is not text: {:?}", preview(line)))?;
    Ok(text.split(' ').collect())
}

fn number(word: &str, line: &[u8], what: &str) -> Result<u64> {
    if word.is_empty() || !word.bytes().all(|b| b.is_ascii_digit()) {
        bail!("{what} got {:?}: not a number", preview(line));
    }
    word.parse()
        .map_err(|_| anyhow!("{what} got {:?}: number out of range", preview(line)))
}

/// `INSERTED <id>` → the id; `BURIED <id>` and every error line are errors.
pub fn parse_inserted(line: &[u8]) -> Result<u64> {
    match words(line, "put")?.as_slice() {
        ["INSERTED", id] => number(id, line, "put"),
        _ => bail!("put got {:?}, expected INSERTED <id>", preview(line)),
    }
}

/// `RESERVED <id> <bytes>` → (id, bytes); `TIMED_OUT`, `DEADLINE_SOON` and the rest
/// are errors.
pub fn parse_reserved(line: &[u8]) -> Result<(u64, usize)> {
    match words(line, "reserve")?.as_slice() {
        ["RESERVED", id, len] => {
            let id = number(id, line, "reserve")?;
            let len = number(len, line, "reserve")?;
            let len = usize::try_from(len)
                .map_err(|_| anyhow!("reserve got {:?}: body too large", preview(line)))?;
            Ok((id, len))
        }
        _ => bail!(
            "reserve got {:?}, expected RESERVED <id> <bytes>",
            preview(line)
        ),
    }
}

/// `OK <bytes>` (the head of a `stats` reply) → bytes.
pub fn parse_ok(line: &[u8]) -> Result<usize> {
    match words(line, "stats")?.as_slice() {
        ["OK", len] => usize::try_from(number(len, line, "stats")?)
            .map_err(|_| anyhow!("stats got {:?}: too large", preview(line))),
        _ => bail!("stats got {:?}, expected OK <bytes>", preview(line)),
    }
}

/// `WORD <n>` (`WATCHING 1`) → n.
pub fn parse_counted(line: &[u8], word: &str, what: &str) -> Result<u64> {
    match words(line, what)?.as_slice() {
        [w, n] if *w == word => number(n, line, what),
        _ => bail!("{what} got {:?}, expected {word} <n>", preview(line)),
    }
}

/// A reply that must be exactly `expected` (`DELETED`, `USING t`).
pub fn expect_line(line: &[u8], expected: &str, what: &str) -> Result<()> {
    if line != expected.as_bytes() {
        bail!("{what} got {:?}, expected {expected}", preview(line));
    }
    Ok(())
}

/// The `name: value` pairs of the YAML document `stats` answers (a `---` line, then
/// one pair a line).
pub fn parse_stats_yaml(body: &[u8]) -> Result<Vec<(String, String)>> {
    let text = std::str::from_utf8(body)
        .map_err(|_| anyhow!("stats body is not UTF-8: {:?}", preview(body)))?;
    let mut out = Vec::new();
    for line in text.lines() {
        if line == "---" || line.is_empty() {
            continue;
        }
        let (name, value) = line
            .split_once(": ")
            .ok_or_else(|| anyhow!("stats line {line:?} is not `name: value`"))?;
        out.push((name.to_string(), value.trim().to_string()));
    }
    Ok(out)
}

/// Reads one job body of `len` bytes and its `\r\n`; it must equal `expected`.
async fn read_body<R: AsyncRead + Unpin>(
    replies: &mut ReplyBuf,
    r: &mut R,
    len: usize,
    expected: &[u8],
) -> Result<()> {
    let block = replies.block(r, len + 2).await?;
    if &block[len..] != b"\r\n" {
        bail!("a job body of {len} bytes not followed by \\r\\n");
    }
    if &block[..len] != expected {
        bail!(
            "reserved a job whose body is {:?}, not the one put",
            preview(&block[..len])
        );
    }
    Ok(())
}

/// Reads the replies to a [`put_reserve_request`]: `INSERTED id`, then `RESERVED id
/// len` with the same id and the body sent. Returns the id.
pub async fn read_put_reserve<R: AsyncRead + Unpin>(
    replies: &mut ReplyBuf,
    r: &mut R,
    body: &[u8],
) -> Result<u64> {
    let put = parse_inserted(replies.next_line(r).await?)?;
    let (id, len) = parse_reserved(replies.next_line(r).await?)?;
    if id != put {
        bail!("put job {put} then reserved job {id}: the tube holds another job");
    }
    if len != body.len() {
        bail!("reserved job {id} of {len} bytes, put {} bytes", body.len());
    }
    read_body(replies, r, len, body).await?;
    Ok(id)
}

/// Reads a `stats` reply: `OK len` and the YAML body.
pub async fn read_stats<R: AsyncRead + Unpin>(
    replies: &mut ReplyBuf,
    r: &mut R,
) -> Result<Vec<(String, String)>> {
    let len = parse_ok(replies.next_line(r).await?)?;
    let block = replies.block(r, len + 2).await?;
    if &block[len..] != b"\r\n" {
        bail!("a stats body of {len} bytes not followed by \\r\\n");
    }
    parse_stats_yaml(&block[..len])
}

/// One client connection.
pub struct BsConn {
    stream: TcpStream,
    replies: ReplyBuf,
}

impl BsConn {
    /// Connects with TCP_NODELAY and linger 0, as the memcache client does.
    pub async fn connect(addr: SocketAddr) -> Result<BsConn> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true).context("setting TCP_NODELAY")?;
        let _ = stream.set_zero_linger();
        Ok(BsConn {
            stream,
            replies: ReplyBuf::with_capacity(4096),
        })
    }

    async fn send(&mut self, request: &[u8], what: &str) -> Result<()> {
        self.stream
            .write_all(request)
            .await
            .with_context(|| format!("sending {what}"))
    }

    /// `use TUBE` for puts and `watch TUBE` + `ignore default` for reservations: the
    /// connection then works on `tube` alone.
    pub async fn work_on(&mut self, tube: &str) -> Result<()> {
        let request = format!("use {tube}\r\nwatch {tube}\r\nignore default\r\n");
        self.send(request.as_bytes(), "use/watch").await?;
        let line = self.replies.next_line(&mut self.stream).await?;
        expect_line(line, &format!("USING {tube}"), "use")?;
        let line = self.replies.next_line(&mut self.stream).await?;
        if tube != "default" {
            parse_counted(line, "WATCHING", "watch")?;
            let line = self.replies.next_line(&mut self.stream).await?;
            expect_line(line, "WATCHING 1", "ignore default")?;
        } else {
            parse_counted(line, "WATCHING", "watch")?;
            // Ignoring the last watched tube is refused; the reply says so.
            let line = self.replies.next_line(&mut self.stream).await?;
            expect_line(line, "NOT_IGNORED", "ignore default")?;
        }
        Ok(())
    }

    /// Sends a prebuilt [`put_reserve_request`] and checks both replies; the job's id.
    pub async fn put_reserve(&mut self, request: &[u8], body: &[u8]) -> Result<u64> {
        self.send(request, "put + reserve").await?;
        read_put_reserve(&mut self.replies, &mut self.stream, body).await
    }

    /// `delete ID`, expecting `DELETED`.
    pub async fn delete(&mut self, id: u64) -> Result<()> {
        let request = itoa_request(b"delete ", id);
        self.send(&request, "delete").await?;
        let line = self.replies.next_line(&mut self.stream).await?;
        expect_line(line, "DELETED", "delete")
    }

    /// `stats`, as name/value pairs.
    pub async fn stats(&mut self) -> Result<Vec<(String, String)>> {
        self.send(b"stats\r\n", "stats").await?;
        read_stats(&mut self.replies, &mut self.stream).await
    }

    /// Sends the prebuilt `put` `count` times pipelined while reading the replies
    /// concurrently; every reply must be `INSERTED`. `on_replies` hears of progress.
    pub async fn put_pipelined(
        &mut self,
        request: &[u8],
        count: u64,
        on_replies: &(dyn Fn(u64) + Sync),
    ) -> Result<()> {
        let (mut rd, mut wr) = self.stream.split();
        let replies = &mut self.replies;
        let writer = write_repeated(&mut wr, request, count);
        let reader = async {
            let mut since_report = 0u64;
            for _ in 0..count {
                parse_inserted(replies.next_line(&mut rd).await?)?;
                since_report += 1;
                if since_report == 4096 {
                    on_replies(since_report);
                    since_report = 0;
                }
            }
            on_replies(since_report);
            Ok::<_, anyhow::Error>(())
        };
        tokio::try_join!(writer, reader)?;
        Ok(())
    }
}

/// `PREFIX<n>\r\n` without going through the formatting machinery.
fn itoa_request(prefix: &[u8], n: u64) -> Vec<u8> {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut v = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let mut out = Vec::with_capacity(prefix.len() + 22);
    out.extend_from_slice(prefix);
    out.extend_from_slice(&digits[i..]);
    out.extend_from_slice(b"\r\n");
    out
}

/// The value of one `stats` field as a number.
pub fn stat_u64(stats: &[(String, String)], name: &str) -> Option<u64> {
    stats
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_single_line_replies() {
        assert_eq!(parse_inserted(b"INSERTED 42").unwrap(), 42);
        assert_eq!(parse_reserved(b"RESERVED 7 100").unwrap(), (7, 100));
        assert_eq!(parse_ok(b"OK 905").unwrap(), 905);
        assert_eq!(
            parse_counted(b"WATCHING 2", "WATCHING", "watch").unwrap(),
            2
        );
        assert!(expect_line(b"DELETED", "DELETED", "delete").is_ok());
        assert_eq!(itoa_request(b"delete ", 0), b"delete 0\r\n");
        assert_eq!(itoa_request(b"delete ", 1234567), b"delete 1234567\r\n");
        assert_eq!(put_request(3600, b"ab"), b"put 1024 3600 120 2\r\nab\r\n");
    }

    #[test]
    fn rejects_bad_replies() {
        for bad in [
            &b"BURIED 42"[..],
            b"INSERTED",
            b"INSERTED x",
            b"INSERTED -1",
            b"INSERTED 1 2",
            b"INSERTED 99999999999999999999999",
            b"OUT_OF_MEMORY",
            b"JOB_TOO_BIG",
            b"inserted 1",
            b"INSERTED  1",
            b"\xff\xfe",
        ] {
            assert!(parse_inserted(bad).is_err(), "accepted {bad:?}");
        }
        for bad in [
            &b"TIMED_OUT"[..],
            b"DEADLINE_SOON",
            b"RESERVED 1",
            b"RESERVED 1 x",
            b"RESERVED a 1",
            b"RESERVED 1 2 3",
        ] {
            assert!(parse_reserved(bad).is_err(), "accepted {bad:?}");
        }
        assert!(expect_line(b"NOT_FOUND", "DELETED", "delete").is_err());
        assert!(expect_line(b"DELETED ", "DELETED", "delete").is_err());
        assert!(parse_ok(b"OK").is_err());
        assert!(parse_counted(b"WATCHING", "WATCHING", "watch").is_err());
        assert!(parse_stats_yaml(b"---\nno colon here\n").is_err());
    }

    #[test]
    fn parses_stats_yaml() {
        let stats =
            parse_stats_yaml(b"---\ncurrent-jobs-ready: 3\nversion: \"1.12\"\npid: 9\n").unwrap();
        assert_eq!(stat_u64(&stats, "current-jobs-ready"), Some(3));
        assert_eq!(stat_u64(&stats, "pid"), Some(9));
        assert_eq!(stat_u64(&stats, "version"), None);
    }

    async fn put_reserve_from(bytes: &'static [u8], body: &[u8]) -> Result<u64> {
        let mut r = bytes;
        // A tiny buffer: lines and bodies arrive split over many reads.
        let mut b = ReplyBuf::with_capacity(8);
        let id = read_put_reserve(&mut b, &mut r, body).await?;
        assert!(b.is_drained() && r.is_empty(), "bytes left over");
        Ok(id)
    }

    #[tokio::test]
    async fn reads_put_reserve_replies() {
        let body = b"0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz";
        let id = put_reserve_from(
            b"INSERTED 5\r\nRESERVED 5 72\r\n0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz\r\n",
            body,
        )
        .await
        .unwrap();
        assert_eq!(id, 5);
    }

    #[tokio::test]
    async fn rejects_bad_put_reserve_replies() {
        let cases: [&'static [u8]; 7] = [
            // Another job than the one put.
            b"INSERTED 5\r\nRESERVED 4 3\r\nabc\r\n",
            // Another length, another body, no CRLF after the body.
            b"INSERTED 5\r\nRESERVED 5 2\r\nab\r\n",
            b"INSERTED 5\r\nRESERVED 5 3\r\nabd\r\n",
            b"INSERTED 5\r\nRESERVED 5 3\r\nabcXY",
            b"INSERTED 5\r\nTIMED_OUT\r\n",
            // The connection closes mid-body; a bare \n ends a line.
            b"INSERTED 5\r\nRESERVED 5 3\r\nab",
            b"INSERTED 5\nRESERVED 5 3\r\nabc\r\n",
        ];
        for bytes in cases {
            let mut r = bytes;
            let mut b = ReplyBuf::with_capacity(8);
            assert!(
                read_put_reserve(&mut b, &mut r, b"abc").await.is_err(),
                "accepted {:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[tokio::test]
    async fn reads_stats_reply() {
        let mut r: &[u8] = b"OK 26\r\n---\ncurrent-jobs-ready: 7\n\r\n";
        let mut b = ReplyBuf::with_capacity(8);
        let stats = read_stats(&mut b, &mut r).await.unwrap();
        assert_eq!(stat_u64(&stats, "current-jobs-ready"), Some(7));
        let mut r: &[u8] = b"OK 26\r\n---\ncurrent-jobs-ready: 7\nXX";
        let mut b = ReplyBuf::with_capacity(8);
        assert!(read_stats(&mut b, &mut r).await.is_err());
    }
}
