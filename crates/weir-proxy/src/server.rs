//! The proxy's listeners: HTTP/1.1 and HTTP/2 over cleartext (h2c, by prior
//! knowledge) on the same port. Limits: `connections_max` per listener (at the cap,
//! the connection idle the longest is closed for the newcomer, so idle sockets cannot
//! lock clients out; one more is refused only when all are in the middle of a
//! request or tunnels), `header_bytes_max` for a request head and `headers_max` for its
//! fields (over either hyper answers 431), `header_timeout_ms` to send a head: the first one whatever the protocol
//! detection (hyper-util's `auto` builder reads before hyper's own header timeout
//! starts), later ones on HTTP/1 by hyper. The accept loop, the cap and the first
//! head's deadline are `weir_http`'s, shared with the bus and the HTTP port. On stop,
//! each connection finishes its request in flight; after `weir_http::STOP_GRACE`
//! (2 s) the rest are dropped (tunnels and HTTP/2 streams run on tasks of their own
//! and end with the proxy's runtime). A connection upgraded to a tunnel (WebSocket) keeps its
//! slot until the tunnel ends, and is never evicted.
//!
//! Reads from a client are at most [`READ_BYTES_MAX`] each ([`CappedReads`]): hyper
//! grows a connection's read buffer to `header_bytes_max` (64 KiB) once reads fill
//! it, and 2,000 uploads then held 2,000 such buffers, outside `body_memory_max`.

use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use weir_http::http_conns::MarkedBody;
use weir_http::{Connection, Listener};

use crate::config::ProxySettings;
use crate::forward::{handle, Proxy};
use crate::upgrade::ConnectionSlot;

/// One read from a client at most: just under hyper's first read buffer (8 KiB),
/// which it doubles, up to `max_buf_size`, only after a read that fills it. A head
/// larger than this still fits: the buffer grows while a head is parsed.
pub const READ_BYTES_MAX: usize = 8 * 1024 - 1;
/// HTTP/2 clients are pinged this often, and closed when a ping is not answered in
/// time: a dead HTTP/2 connection does not hold a slot for ever.
const H2_KEEP_ALIVE: Duration = Duration::from_secs(30);
const H2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `listener` until `shutdown`; `evicted` counts the idle connections closed
/// at `connections_max` for a new one.
pub async fn serve(
    listener: TcpListener,
    name: Arc<str>,
    proxy: Arc<Proxy>,
    settings: Arc<ProxySettings>,
    mut shutdown: watch::Receiver<bool>,
    evicted: Arc<AtomicU64>,
) {
    let serving = Listener::new(
        "proxy",
        settings.connections_max,
        settings.header_timeout,
        evicted,
    )
    .named(Arc::clone(&name));
    let stop = async move {
        let _ = shutdown.changed().await;
    };
    let serve = move |stream, client, connection| {
        let (proxy, name, settings) =
            (Arc::clone(&proxy), Arc::clone(&name), Arc::clone(&settings));
        serve_connection(stream, client, proxy, name, settings, connection)
    };
    serving.serve(listener, stop, serve).await;
}

/// One client connection: HTTP/1.1 or h2c, until it closes or the proxy stops.
async fn serve_connection(
    stream: TcpStream,
    client: std::net::SocketAddr,
    proxy: Arc<Proxy>,
    name: Arc<str>,
    settings: Arc<ProxySettings>,
    connection: Connection,
) {
    let marking = Arc::clone(connection.slot());
    let service = service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        let (proxy, name, slot) = (Arc::clone(&proxy), Arc::clone(&name), Arc::clone(&marking));
        let mark = slot.begin_request();
        req.extensions_mut()
            .insert(ConnectionSlot::new(Arc::clone(&slot)));
        async move {
            let response = handle(proxy, name, client, req).await;
            if response.status() == hyper::StatusCode::SWITCHING_PROTOCOLS {
                // Now a tunnel (it holds a `ConnectionSlot`): busy until it ends.
                slot.retire();
            }
            let response = response.map(|body| MarkedBody::new(body, mark));
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let builder = builder(&settings);
    let io = TokioIo::new(CappedReads(stream));
    let conn = builder.serve_connection_with_upgrades(io, service);
    connection.run_with(conn, |c| c.graceful_shutdown()).await;
}

/// hyper's settings for a client connection: HTTP/1's header timeout and head size,
/// HTTP/2's pings and header list size.
fn builder(settings: &ProxySettings) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_timeout)
        .max_headers(settings.headers_max)
        .max_buf_size(settings.header_bytes_max.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(H2_KEEP_ALIVE))
        .keep_alive_timeout(H2_KEEP_ALIVE_TIMEOUT)
        .max_header_list_size(u32::try_from(settings.header_bytes_max).unwrap_or(u32::MAX));
    builder
}

/// A stream whose reads take [`READ_BYTES_MAX`] bytes at most.
pub struct CappedReads<T>(pub T);

impl<T: AsyncRead + Unpin> AsyncRead for CappedReads<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if buf.remaining() <= READ_BYTES_MAX {
            return Pin::new(&mut self.0).poll_read(cx, buf);
        }
        let mut capped = buf.take(READ_BYTES_MAX);
        std::task::ready!(Pin::new(&mut self.0).poll_read(cx, &mut capped))?;
        let n = capped.filled().len();
        // SAFETY: `capped` is a view of `buf`'s unfilled part, whose first `n` bytes
        // the read filled (as tokio's own `Take` does).
        unsafe { buf.assume_init(n) };
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CappedReads<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn reads_are_capped_and_whole() {
        let (mut a, b) = tokio::io::duplex(1 << 20);
        let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        a.write_all(&data).await.unwrap();
        drop(a);
        let mut b = CappedReads(b);
        let mut buf = vec![0u8; 65536];
        let n = b.read(&mut buf).await.unwrap();
        assert_eq!(n, READ_BYTES_MAX);
        let mut rest = Vec::new();
        b.read_to_end(&mut rest).await.unwrap();
        assert_eq!([&buf[..n], &rest[..]].concat(), data);
    }
}
