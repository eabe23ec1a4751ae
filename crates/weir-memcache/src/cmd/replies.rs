//! The replies commands share: a failure's (the backend's error kinds as memcache
//! error lines), a number, a line, a `VALUE` block; and the blocking pool for work too
//! long for an event loop.

use bytes::{BufMut, BytesMut};
use weir_backend::{Item, Kind};

use crate::reply;

/// A failure that becomes a reply.
#[derive(Debug)]
pub enum Failure {
    Engine(weir_backend::Error),
    /// A blocking task died; should not happen.
    Internal(String),
}

impl From<weir_backend::Error> for Failure {
    fn from(e: weir_backend::Error) -> Failure {
        Failure::Engine(e)
    }
}

/// Runs work that is long for an event loop (the text of thousands of queues'
/// stats) on the blocking pool, so no runtime thread is held by it.
pub async fn blocking<T, F>(f: F) -> Result<T, Failure>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Failure::Internal(e.to_string()))
}

/// The reply for a failure.
pub fn put_failure(out: &mut BytesMut, failure: &Failure) {
    match failure {
        Failure::Engine(e) => put_engine_error(out, e),
        Failure::Internal(message) => put_server_error(out, message),
    }
}

pub fn put_engine_error(out: &mut BytesMut, e: &weir_backend::Error) {
    match e.kind() {
        Kind::TooLarge => out.put_slice(reply::TOO_LARGE),
        Kind::Full => out.put_slice(reply::NOT_STORED),
        Kind::InvalidName => out.put_slice(reply::BAD_QUEUE_NAME),
        Kind::InvalidArgument => out.put_slice(reply::INVALID_ARGUMENT),
        Kind::DiskFull => out.put_slice(reply::DISK_FULL),
        Kind::Closed => out.put_slice(reply::SHUTTING_DOWN),
        Kind::TooManyQueues => out.put_slice(reply::TOO_MANY_QUEUES),
        // The server's failure, not the client's: SERVER_ERROR, and the connection
        // stays open for the retry.
        Kind::Unavailable => {
            let text = e.to_string();
            if text.starts_with(reply::UNAVAILABLE_PREFIX) {
                put_server_error(out, &text);
            } else {
                put_server_error(out, &format!("{}: {text}", reply::UNAVAILABLE_PREFIX));
            }
        }
        _ => put_server_error(out, &e.to_string()),
    }
}

/// Longest error text put in a reply line.
const ERROR_TEXT_BYTES_MAX: usize = 200;

/// `SERVER_ERROR text`, with the text made safe for one line.
pub fn put_server_error(out: &mut BytesMut, text: &str) {
    out.put_slice(b"SERVER_ERROR ");
    put_one_line(out, text);
    out.put_slice(b"\r\n");
}

/// `text` on one line: control characters become spaces, at most
/// `ERROR_TEXT_BYTES_MAX` bytes.
pub fn put_one_line(out: &mut BytesMut, text: &str) {
    for b in text.bytes().take(ERROR_TEXT_BYTES_MAX) {
        out.put_u8(if b.is_ascii_control() { b' ' } else { b });
    }
}

/// Appends the decimal form of `n`.
pub fn put_u64(out: &mut BytesMut, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.put_slice(&digits[i..]);
}

/// `VALUE KEY FLAGS LEN [CAS]\r\nDATA\r\n`. The key is echoed as the client sent it
/// (options included): memcache clients match replies to requests by key.
pub fn put_value(out: &mut BytesMut, key: &str, item: &Item, cas: bool) {
    out.reserve(key.len() + item.data.len() + 64);
    out.put_slice(b"VALUE ");
    out.put_slice(key.as_bytes());
    out.put_u8(b' ');
    put_u64(out, u64::from(item.flags));
    out.put_u8(b' ');
    put_u64(out, item.data.len() as u64);
    if cas {
        out.put_u8(b' ');
        put_u64(out, item.seq);
    }
    out.put_slice(b"\r\n");
    out.put_slice(&item.data);
    out.put_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_lines() {
        let mut out = BytesMut::new();
        for n in [0, 7, 10, 12345, u64::MAX] {
            out.clear();
            put_u64(&mut out, n);
            assert_eq!(&out[..], n.to_string().as_bytes());
        }
        out.clear();
        put_server_error(&mut out, "bad\r\nthing");
        assert_eq!(&out[..], b"SERVER_ERROR bad  thing\r\n");
    }
}
