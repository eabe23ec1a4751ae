//! A minimal memcache text-protocol client for load generation.
//!
//! The load generator must never be the bottleneck, so a connection keeps one reusable
//! read buffer, finds line ends with memchr, writes prebuilt request bytes and parses
//! only what it must (the reply's first word and a `VALUE` line's length). It speaks
//! both Kestrel's queue dialect and plain memcached: `set` answers `STORED`, `get`
//! answers `VALUE KEY FLAGS LEN` + data + `END`, or just `END` for a miss.
//!
//! Every reply is checked: a server that closes the connection, answers an error or
//! sends garbage gives a clear error naming what arrived, never a panic.

use std::net::SocketAddr;

use anyhow::{anyhow, bail, Context, Result};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest reply line we accept; a `VALUE` line for a 100-byte key is far shorter.
const LINE_LENGTH_MAX: usize = 8192;

/// Bytes of a request that a pipelined writer sends per write call.
const PIPELINE_WRITE_BYTES: usize = 256 * 1024;

/// The request bytes of `set KEY 0 0 LEN\r\nDATA\r\n`.
pub fn set_request(key: &str, data: &[u8]) -> Vec<u8> {
    let mut req = format!("set {key} 0 0 {}\r\n", data.len()).into_bytes();
    req.extend_from_slice(data);
    req.extend_from_slice(b"\r\n");
    req
}

/// The request bytes of `get KEY\r\n`.
pub fn get_request(key: &str) -> Vec<u8> {
    format!("get {key}\r\n").into_bytes()
}

/// A payload of `size` bytes (printable, so a dump of the traffic stays readable).
pub fn payload(size: usize) -> Vec<u8> {
    (0..size).map(|i| b'a' + (i % 26) as u8).collect()
}

pub(crate) fn preview(bytes: &[u8]) -> String {
    let shown = &bytes[..bytes.len().min(120)];
    let mut s = String::from_utf8_lossy(shown).into_owned();
    if bytes.len() > shown.len() {
        s.push_str("...");
    }
    s
}

/// A reusable read buffer that hands out reply lines and skips data blocks.
pub struct ReplyBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl ReplyBuf {
    pub fn with_capacity(bytes: usize) -> ReplyBuf {
        ReplyBuf {
            buf: vec![0; bytes.max(64)],
            start: 0,
            end: 0,
        }
    }

    async fn fill<R: AsyncRead + Unpin>(&mut self, r: &mut R) -> Result<()> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.buf.len() {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else {
                let grown = self.buf.len() * 2;
                self.buf.resize(grown, 0);
            }
        }
        let n = r
            .read(&mut self.buf[self.end..])
            .await
            .context("reading a reply from the server")?;
        if n == 0 {
            bail!("the server closed the connection (waiting for a reply)");
        }
        self.end += n;
        Ok(())
    }

    /// The next reply line without its `\r\n`, as a range of `self.buf`; consumed.
    async fn line<R: AsyncRead + Unpin>(&mut self, r: &mut R) -> Result<(usize, usize)> {
        let mut searched = 0;
        loop {
            let window = &self.buf[self.start + searched..self.end];
            if let Some(i) = memchr::memchr(b'\n', window) {
                let s = self.start;
                let nl = s + searched + i;
                if nl == s || self.buf[nl - 1] != b'\r' {
                    bail!(
                        "reply line not ended by \\r\\n: {:?}",
                        preview(&self.buf[s..=nl])
                    );
                }
                self.start = nl + 1;
                return Ok((s, nl - 1));
            }
            searched = self.end - self.start;
            if searched > LINE_LENGTH_MAX {
                bail!(
                    "reply line longer than {LINE_LENGTH_MAX} bytes: {:?}",
                    preview(&self.buf[self.start..self.end])
                );
            }
            self.fill(r).await?;
        }
    }

    /// Consumes `n` bytes of a data block.
    async fn skip<R: AsyncRead + Unpin>(&mut self, r: &mut R, mut n: usize) -> Result<()> {
        loop {
            let available = self.end - self.start;
            if available >= n {
                self.start += n;
                return Ok(());
            }
            n -= available;
            self.start = self.end;
            self.fill(r).await?;
        }
    }

    /// The next reply line without its `\r\n`; consumed. For the clients of other
    /// line protocols (beanstalkd's).
    pub(crate) async fn next_line<R: AsyncRead + Unpin>(&mut self, r: &mut R) -> Result<&[u8]> {
        let (s, e) = self.line(r).await?;
        Ok(&self.buf[s..e])
    }

    /// The next `n` bytes (a data block), in one piece; consumed. The buffer grows to
    /// hold a block larger than itself.
    pub(crate) async fn block<R: AsyncRead + Unpin>(
        &mut self,
        r: &mut R,
        n: usize,
    ) -> Result<&[u8]> {
        while self.end - self.start < n {
            if self.buf.len() - self.start < n {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
                if self.buf.len() < n {
                    let grown = n.max(self.buf.len() * 2);
                    self.buf.resize(grown, 0);
                }
            }
            self.fill(r).await?;
        }
        let s = self.start;
        self.start += n;
        Ok(&self.buf[s..s + n])
    }

    /// Whether every byte read so far has been consumed.
    #[cfg(test)]
    pub(crate) fn is_drained(&self) -> bool {
        self.start == self.end
    }

    /// Reads a `set` reply; anything but `STORED` is an error.
    pub async fn expect_stored<R: AsyncRead + Unpin>(&mut self, r: &mut R) -> Result<()> {
        let (s, e) = self.line(r).await?;
        let line = &self.buf[s..e];
        if line != b"STORED" {
            bail!("set got {:?}, expected STORED", preview(line));
        }
        Ok(())
    }

    /// Reads a `set` reply that may be a refusal: `STORED`, or a `SERVER_ERROR ...`
    /// line (the server is up but could not store the item); anything else is an error.
    pub async fn read_set_reply<R: AsyncRead + Unpin>(&mut self, r: &mut R) -> Result<SetReply> {
        let (s, e) = self.line(r).await?;
        let line = &self.buf[s..e];
        if line == b"STORED" {
            return Ok(SetReply::Stored);
        }
        if line.starts_with(b"SERVER_ERROR") {
            return Ok(SetReply::ServerError(preview(line)));
        }
        bail!(
            "set got {:?}, expected STORED or SERVER_ERROR",
            preview(line)
        )
    }

    /// Reads a `get` reply for one key: `Some(len)` for an item, `None` for a miss.
    pub async fn read_get<R: AsyncRead + Unpin>(&mut self, r: &mut R) -> Result<Option<usize>> {
        let (s, e) = self.line(r).await?;
        let line = &self.buf[s..e];
        if line == b"END" {
            return Ok(None);
        }
        let len = parse_value_line(line)?;
        self.skip(r, len).await?;
        let (s, e) = self.line(r).await?;
        if s != e {
            bail!(
                "data block of {len} bytes not followed by \\r\\n (got {:?})",
                preview(&self.buf[s..e])
            );
        }
        let (s, e) = self.line(r).await?;
        if &self.buf[s..e] != b"END" {
            bail!(
                "get got {:?} after one value, expected END",
                preview(&self.buf[s..e])
            );
        }
        Ok(Some(len))
    }

    /// Reads a `stats` reply: every `STAT NAME VALUE` line up to `END`.
    pub async fn read_stats<R: AsyncRead + Unpin>(
        &mut self,
        r: &mut R,
    ) -> Result<Vec<(String, String)>> {
        let mut stats = Vec::new();
        loop {
            let (s, e) = self.line(r).await?;
            let line = &self.buf[s..e];
            if line == b"END" {
                return Ok(stats);
            }
            let text = std::str::from_utf8(line)
                .map_err(|_| anyhow!("stats line is not UTF-8: {:?}", preview(line)))?;
            let mut parts = text.splitn(3, ' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("STAT"), Some(name), Some(value)) => {
                    stats.push((name.to_string(), value.to_string()))
                }
                _ => bail!("unexpected stats line {text:?}"),
            }
        }
    }
}

/// The data length of `VALUE KEY FLAGS LEN [CAS]`.
fn parse_value_line(line: &[u8]) -> Result<usize> {
    let bad = || anyhow!("get got {:?}, expected VALUE or END", preview(line));
    if !line.starts_with(b"VALUE ") {
        return Err(bad());
    }
    let mut fields = line.split(|&b| b == b' ').filter(|f| !f.is_empty());
    let len_field = fields.nth(3).ok_or_else(bad)?;
    let len = std::str::from_utf8(len_field)
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .ok_or_else(bad)?;
    Ok(len)
}

/// The answer to a `set` when refusals are expected (a backend in a leader election).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetReply {
    Stored,
    /// The `SERVER_ERROR ...` line as sent.
    ServerError(String),
}

/// One client connection.
pub struct Conn {
    stream: TcpStream,
    replies: ReplyBuf,
}

impl Conn {
    /// Connects with TCP_NODELAY (each request is one small write) and linger 0, so
    /// closing thousands of connections leaves no TIME_WAIT sockets to exhaust ports.
    pub async fn connect(addr: SocketAddr, read_buffer_bytes: usize) -> Result<Conn> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true).context("setting TCP_NODELAY")?;
        // Not fatal where unsupported: it only saves ports.
        let _ = stream.set_zero_linger();
        Ok(Conn {
            stream,
            replies: ReplyBuf::with_capacity(read_buffer_bytes),
        })
    }

    /// Sends a prebuilt `set` request and checks for `STORED`.
    pub async fn set(&mut self, request: &[u8]) -> Result<()> {
        self.stream
            .write_all(request)
            .await
            .context("sending set")?;
        self.replies.expect_stored(&mut self.stream).await
    }

    /// Sends a prebuilt `set` request; `STORED` or a `SERVER_ERROR` line.
    pub async fn set_reply(&mut self, request: &[u8]) -> Result<SetReply> {
        self.stream
            .write_all(request)
            .await
            .context("sending set")?;
        self.replies.read_set_reply(&mut self.stream).await
    }

    /// Sends a prebuilt `get` request; `Some(len)` for an item, `None` for a miss.
    pub async fn get(&mut self, request: &[u8]) -> Result<Option<usize>> {
        self.stream
            .write_all(request)
            .await
            .context("sending get")?;
        self.replies.read_get(&mut self.stream).await
    }

    /// `stats`, as name/value pairs.
    pub async fn stats(&mut self) -> Result<Vec<(String, String)>> {
        self.stream
            .write_all(b"stats\r\n")
            .await
            .context("sending stats")?;
        self.replies.read_stats(&mut self.stream).await
    }

    /// Sends `request` `count` times pipelined while reading the replies concurrently
    /// (so neither side's socket buffer can deadlock the other); `on_replies` is told
    /// of progress every few thousand replies. Returns (hits, misses) for gets.
    pub async fn pipelined(
        &mut self,
        request: &[u8],
        count: u64,
        kind: Pipelined,
        on_replies: &(dyn Fn(u64) + Sync),
    ) -> Result<(u64, u64)> {
        let (mut rd, mut wr) = self.stream.split();
        let replies = &mut self.replies;
        let writer = write_repeated(&mut wr, request, count);
        let reader = async {
            let mut hits = 0u64;
            let mut misses = 0u64;
            let mut since_report = 0u64;
            for _ in 0..count {
                match kind {
                    Pipelined::Set => {
                        replies.expect_stored(&mut rd).await?;
                        hits += 1;
                    }
                    Pipelined::Get => match replies.read_get(&mut rd).await? {
                        Some(_) => hits += 1,
                        None => misses += 1,
                    },
                }
                since_report += 1;
                if since_report == 4096 {
                    on_replies(since_report);
                    since_report = 0;
                }
            }
            on_replies(since_report);
            Ok::<_, anyhow::Error>((hits, misses))
        };
        let ((), counts) = tokio::try_join!(writer, reader)?;
        Ok(counts)
    }
}

/// What a pipelined run sends.
#[derive(Clone, Copy, Debug)]
pub enum Pipelined {
    Set,
    Get,
}

pub(crate) async fn write_repeated<W: AsyncWrite + Unpin>(
    w: &mut W,
    request: &[u8],
    count: u64,
) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    let per_batch = (PIPELINE_WRITE_BYTES / request.len().max(1)).max(1) as u64;
    let batch: Vec<u8> = request.repeat(per_batch.min(count) as usize);
    let mut left = count;
    while left > 0 {
        let n = left.min(per_batch);
        w.write_all(&batch[..n as usize * request.len()])
            .await
            .context("sending pipelined requests")?;
        left -= n;
    }
    w.flush().await.context("sending pipelined requests")?;
    Ok(())
}

/// The value of one `stats` field as a number.
pub fn stat_u64(stats: &[(String, String)], name: &str) -> Option<u64> {
    stats
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn parse_gets(bytes: &'static [u8]) -> Result<Vec<Option<usize>>> {
        let mut r = bytes;
        let mut b = ReplyBuf::with_capacity(8);
        let mut out = Vec::new();
        while !r.is_empty() || b.start != b.end {
            out.push(b.read_get(&mut r).await?);
        }
        Ok(out)
    }

    #[tokio::test]
    async fn parses_get_replies_across_small_buffers() {
        let got = parse_gets(b"END\r\nVALUE q 0 5\r\nhello\r\nEND\r\nVALUE q 7 0\r\n\r\nEND\r\n")
            .await
            .unwrap();
        assert_eq!(got, vec![None, Some(5), Some(0)]);
    }

    #[tokio::test]
    async fn rejects_garbage() {
        assert!(parse_gets(b"SERVER_ERROR disk\r\n").await.is_err());
        assert!(parse_gets(b"VALUE q 0 5\r\nhelloXXEND\r\n").await.is_err());
        assert!(parse_gets(b"VALUE q 0 x\r\n").await.is_err());
        assert!(parse_gets(b"END\n").await.is_err());
        // A closed connection mid-reply.
        assert!(parse_gets(b"VALUE q 0 5\r\nhel").await.is_err());
    }

    #[tokio::test]
    async fn parses_set_replies_and_refusals() {
        let mut r: &[u8] = b"STORED\r\nSERVER_ERROR backend unavailable\r\nEND\r\n";
        let mut b = ReplyBuf::with_capacity(16);
        assert_eq!(b.read_set_reply(&mut r).await.unwrap(), SetReply::Stored);
        assert_eq!(
            b.read_set_reply(&mut r).await.unwrap(),
            SetReply::ServerError("SERVER_ERROR backend unavailable".into())
        );
        assert!(b.read_set_reply(&mut r).await.is_err());
    }

    #[tokio::test]
    async fn parses_stats() {
        let mut r: &[u8] = b"STAT pid 12\r\nSTAT queue_a_items 3\r\nEND\r\n";
        let mut b = ReplyBuf::with_capacity(16);
        let stats = b.read_stats(&mut r).await.unwrap();
        assert_eq!(stat_u64(&stats, "queue_a_items"), Some(3));
        assert_eq!(stat_u64(&stats, "pid"), Some(12));
    }
}
