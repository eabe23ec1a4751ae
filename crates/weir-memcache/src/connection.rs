//! `Connection`: one client's socket, split into what comes in and what goes out.
//!
//! [`Inbound`] (in `inbound.rs`) holds the received bytes and all framing: it hands
//! out the next request and drops its bytes. [`Outbound`] holds the socket and the
//! replies not yet written. A command is given the outbound half only: it appends
//! replies and, where the protocol streams or is about to wait, writes them; it never
//! touches the read buffer or the framing state. Every complete request of one read is
//! executed before anything is written, and all their replies go out in one write.
//!
//! Buffers start small so thousands of idle connections stay cheap, grow for a large
//! item, and are given back afterwards ([`BUFFER_BYTES_RETAINED_MAX`]), so one big
//! item does not pin memory for the life of the connection.

use std::io;

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::inbound::{Inbound, BUFFER_BYTES_RETAINED_MAX};
use crate::metrics::LoopMetrics;
use crate::shared::OUTPUT_BYTES_FLUSH_AT;

/// Bytes read ahead while a command waits (a blocking `get`, `monitor`); past this the
/// connection stops reading until the command ends.
pub const READ_AHEAD_BYTES_MAX: usize = 64 * 1024;
/// Bytes one read-ahead call makes room for.
const READ_AHEAD_CHUNK_BYTES: usize = 1024;

pub struct Connection {
    inbound: Inbound,
    outbound: Outbound,
}

/// The socket and what goes out on it.
pub struct Outbound {
    stream: TcpStream,
    /// Replies not yet written.
    replies: BytesMut,
    /// Bytes received while a command waited (see [`Outbound::until_closed`]); handed
    /// to the inbound side when the command ends.
    read_ahead: BytesMut,
}

impl Connection {
    pub fn new(stream: TcpStream) -> Connection {
        Connection {
            inbound: Inbound::default(),
            outbound: Outbound {
                stream,
                replies: BytesMut::new(),
                read_ahead: BytesMut::new(),
            },
        }
    }

    /// Both halves, to run requests from one while replying on the other.
    pub fn halves(&mut self) -> (&mut Inbound, &mut Outbound) {
        (&mut self.inbound, &mut self.outbound)
    }

    /// Whether a request has begun but not ended (so a timeout applies).
    pub fn is_mid_request(&self) -> bool {
        self.inbound.is_mid_request()
    }

    /// Reads more bytes; 0 means the peer closed.
    pub async fn read(&mut self) -> io::Result<usize> {
        let buffer = self.inbound.buffer_for_read();
        self.outbound.stream.read_buf(buffer).await
    }

    /// Writes every pending reply and gives back buffers that grew; returns the
    /// number of bytes written.
    pub async fn write_replies(&mut self) -> io::Result<usize> {
        let n = self.outbound.write().await?;
        if self.outbound.replies.capacity() > BUFFER_BYTES_RETAINED_MAX {
            self.outbound.replies = BytesMut::new();
        }
        self.inbound.shrink();
        Ok(n)
    }
}

impl Outbound {
    /// The replies not yet written, to append to.
    pub fn replies(&mut self) -> &mut BytesMut {
        &mut self.replies
    }

    /// Appends one fixed reply.
    pub fn put(&mut self, reply: &[u8]) {
        self.replies.put_slice(reply);
    }

    /// Writes the pending replies now (a command that streams, or is about to wait);
    /// returns the number of bytes written.
    pub async fn write(&mut self) -> io::Result<usize> {
        let n = self.replies.len();
        if n > 0 {
            self.stream.write_all(&self.replies).await?;
            self.replies.clear();
        }
        Ok(n)
    }

    /// Writes the pending replies once they pass [`OUTPUT_BYTES_FLUSH_AT`] (the one
    /// place that threshold is applied), counting the bytes; false when the client is
    /// gone.
    pub async fn write_if_over(&mut self, metrics: &LoopMetrics) -> bool {
        if self.replies.len() < OUTPUT_BYTES_FLUSH_AT {
            return true;
        }
        match self.write().await {
            Ok(n) => {
                metrics.bytes_written.add(n as u64);
                true
            }
            Err(_) => false,
        }
    }

    /// Reads into the read-ahead buffer until the peer closes (or fails); never
    /// returns otherwise. Raced against a waiting command, it notices a client that
    /// went away so the wait can be dropped and nothing is taken on its behalf.
    pub async fn until_closed(&mut self) {
        loop {
            if self.read_ahead.len() >= READ_AHEAD_BYTES_MAX {
                std::future::pending::<()>().await;
            }
            self.read_ahead.reserve(READ_AHEAD_CHUNK_BYTES);
            match self.stream.read_buf(&mut self.read_ahead).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }

    /// Moves bytes read ahead during a command's wait to the inbound side.
    pub fn hand_over_read_ahead(&mut self, inbound: &mut Inbound) {
        if !self.read_ahead.is_empty() {
            inbound.receive(&self.read_ahead);
            self.read_ahead = BytesMut::new();
        }
    }
}
