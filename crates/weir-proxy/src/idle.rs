//! A body that fails when no data arrives for a while: a target that sends an
//! answer's head and then stalls cannot hold the client's connection (and its slot
//! under `connections_max`) for ever. The wait is the route's `request_timeout_ms`,
//! counted afresh after every frame.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::capture::BoxError;

pub struct IdleBody<B> {
    inner: B,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
}

impl<B> IdleBody<B> {
    pub fn new(inner: B, idle: Duration) -> IdleBody<B> {
        IdleBody {
            inner,
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
        }
    }
}

#[derive(Debug)]
struct Stalled(Duration);

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the target sent nothing for {} ms", self.0.as_millis())
    }
}

impl std::error::Error for Stalled {}

impl<B> Body for IdleBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                let deadline = Instant::now() + this.idle;
                this.timer.as_mut().reset(deadline);
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(Stalled(this.idle))))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full, StreamBody};

    #[tokio::test]
    async fn a_stalled_body_fails_and_a_flowing_one_passes() {
        let whole = IdleBody::new(
            Full::new(Bytes::from_static(b"abc")),
            Duration::from_millis(50),
        );
        assert_eq!(whole.collect().await.unwrap().to_bytes(), "abc");
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
        let stalled = IdleBody::new(
            StreamBody::new(tokio_stream_shim(rx)),
            Duration::from_millis(50),
        );
        let started = std::time::Instant::now();
        let e = stalled.collect().await.expect_err("a stalled body fails");
        assert!(e.to_string().contains("sent nothing"), "{e}");
        assert!(started.elapsed() >= Duration::from_millis(50));
        drop(tx);
    }

    /// An mpsc receiver as a stream, without the tokio-stream crate.
    fn tokio_stream_shim<T>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> + Unpin {
        Box::pin(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
    }
}
