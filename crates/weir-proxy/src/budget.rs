//! The proxy-wide budget of body bytes held in memory (`[proxy] body_memory_max`).
//!
//! Every buffer of body bytes the proxy keeps beyond what streams through it is
//! reserved here first: a request body read whole before it is forwarded (so that it
//! can be sent again), the copy of a body kept for its capture (counted twice: the
//! copy, and the capture item it is encoded into before the append), and the copy of
//! the primary's answer a diffing route keeps. A reservation is only ever *tried*
//! on the request path, never waited for: past the budget a body streams to the
//! target as it arrives, its capture copy goes to a spill file (see [`CopySink`]),
//! and an answer's copy is dropped (the answer is then not compared). Only a spilled
//! capture waits for room, on its own task, to be read back for its append: it holds
//! nothing of the budget while it waits, so waiters cannot lock each other out.
//!
//! What is not counted: the few KiB per connection of hyper's read and write
//! buffers, and body bytes in passage between the client and the target.

use std::io::{Read, Seek, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use bytes::Bytes;

/// The budget and its figures.
pub struct Budget {
    max: u64,
    used: AtomicU64,
    /// The most reserved at once since the start.
    peak: AtomicU64,
    /// Bodies whose capture copy went to a spill file.
    pub spilled: AtomicU64,
    freed: tokio::sync::Notify,
    /// Where spill files are made (unnamed, gone when closed).
    spill_dir: PathBuf,
}

impl Budget {
    pub fn new(max: u64, spill_dir: PathBuf) -> Arc<Budget> {
        Arc::new(Budget {
            max,
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            spilled: AtomicU64::new(0),
            freed: tokio::sync::Notify::new(),
            spill_dir,
        })
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    pub fn used(&self) -> u64 {
        self.used.load(Relaxed)
    }

    pub fn peak(&self) -> u64 {
        self.peak.load(Relaxed)
    }

    /// Takes `n` bytes if they fit, at once.
    fn take(&self, n: u64) -> bool {
        let mut used = self.used.load(Relaxed);
        loop {
            let Some(after) = used.checked_add(n).filter(|a| *a <= self.max) else {
                return false;
            };
            match self
                .used
                .compare_exchange_weak(used, after, Relaxed, Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(after, Relaxed);
                    return true;
                }
                Err(now) => used = now,
            }
        }
    }

    fn give_back(&self, n: u64) {
        if n > 0 {
            self.used.fetch_sub(n, Relaxed);
            self.freed.notify_waiters();
        }
    }

    /// A reservation of `n` bytes if they fit now.
    pub fn try_reserve(self: &Arc<Self>, n: u64) -> Option<Reservation> {
        self.take(n).then(|| Reservation {
            budget: Arc::clone(self),
            bytes: n,
        })
    }

    /// A reservation of `n` bytes, waiting for room; `None` when `n` is over the
    /// whole budget (it would never fit).
    pub async fn reserve(self: &Arc<Self>, n: u64) -> Option<Reservation> {
        if n > self.max {
            return None;
        }
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(r) = self.try_reserve(n) {
                return Some(r);
            }
            freed.await;
        }
    }
}

/// Bytes of the budget, given back when dropped.
pub struct Reservation {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Reservation {
    /// Takes `n` more bytes if they fit now.
    pub fn try_grow(&mut self, n: u64) -> bool {
        let ok = self.budget.take(n);
        if ok {
            self.bytes += n;
        }
        ok
    }
}

impl Reservation {
    /// Moves `n` of its bytes (at most all) to a reservation of their own.
    pub fn split(&mut self, n: u64) -> Reservation {
        let n = n.min(self.bytes);
        self.bytes -= n;
        Reservation {
            budget: Arc::clone(&self.budget),
            bytes: n,
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

/// Bytes that hold their reservation until the last clone of them is dropped.
pub fn held_bytes(buf: Vec<u8>, reservation: Reservation) -> Bytes {
    struct Held(Vec<u8>, #[allow(dead_code)] Reservation);
    impl AsRef<[u8]> for Held {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }
    Bytes::from_owner(Held(buf, reservation))
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Reservation({} bytes)", self.bytes)
    }
}

/// A body kept for its capture: in memory (its reservation covers it and the item
/// it is encoded into), or in a spill file.
#[derive(Debug)]
pub enum KeptBody {
    Memory(Bytes, Option<Reservation>),
    Spilled(std::fs::File, u64),
}

/// Where a body's copy goes as it streams: memory while the budget allows (twice
/// each byte, see the module's notes), then a spill file when `spill` (the copy so
/// far is moved there), else nowhere (dropped).
pub enum CopySink {
    Memory {
        buf: Vec<u8>,
        reserved: Reservation,
        spill: bool,
    },
    Empty {
        budget: Arc<Budget>,
        spill: bool,
    },
    File(std::fs::File, u64),
    /// Past the capture limit, or no room and no spill file.
    Off(CopyOff),
}

/// Why a copy was given up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyOff {
    TooLarge,
    /// No room in the budget and no spill file (not allowed, or it failed).
    OverBudget,
}

impl CopySink {
    pub fn new(budget: &Arc<Budget>, spill: bool) -> CopySink {
        CopySink::Empty {
            budget: Arc::clone(budget),
            spill,
        }
    }

    /// Keeps `data`, the next bytes of the body; `expected` is its whole length when
    /// known (the buffer is made that size at once).
    pub fn push(&mut self, data: &[u8], expected: Option<u64>) {
        match self {
            CopySink::Empty { budget, spill } => {
                let (budget, spill) = (Arc::clone(budget), *spill);
                let cap = expected.map_or(data.len(), |e| (e as usize).max(data.len()));
                *self = match budget.try_reserve(2 * cap as u64) {
                    Some(reserved) => {
                        let mut buf = Vec::with_capacity(cap);
                        buf.extend_from_slice(data);
                        CopySink::Memory {
                            buf,
                            reserved,
                            spill,
                        }
                    }
                    None => spill_to_file(budget, spill, &[], data),
                };
            }
            CopySink::Memory {
                buf,
                reserved,
                spill,
            } => {
                if grow(buf, reserved, data.len()) {
                    buf.extend_from_slice(data);
                } else {
                    let spill = *spill;
                    let budget = Arc::clone(&reserved.budget);
                    let before = std::mem::take(buf);
                    *self = spill_to_file(budget, spill, &before, data);
                }
            }
            CopySink::File(file, len) => match file.write_all(data) {
                Ok(()) => *len += data.len() as u64,
                Err(e) => {
                    tracing::warn!(error = %e, "a spill file could not be written: the capture is skipped");
                    *self = CopySink::Off(CopyOff::OverBudget);
                }
            },
            CopySink::Off(_) => {}
        }
    }

    /// Gives the copy up (past the capture limit).
    pub fn give_up(&mut self) {
        *self = CopySink::Off(CopyOff::TooLarge);
    }

    /// The copy once the whole body has passed.
    pub fn finish(self) -> Result<KeptBody, CopyOff> {
        match self {
            CopySink::Empty { .. } => Ok(KeptBody::Memory(Bytes::new(), None)),
            CopySink::Memory { buf, reserved, .. } => {
                // The item's half of the reservation stays with the capture.
                let mut body = reserved;
                let item = body.split(body.bytes / 2);
                Ok(KeptBody::Memory(held_bytes(buf, body), Some(item)))
            }
            CopySink::File(file, len) => Ok(KeptBody::Spilled(file, len)),
            CopySink::Off(why) => Err(why),
        }
    }
}

/// Makes room in `buf` for `n` more bytes, its reservation covering twice its
/// capacity (the buffer grows as a `Vec` does, doubling, else to just what it needs).
fn grow(buf: &mut Vec<u8>, reserved: &mut Reservation, n: usize) -> bool {
    let need = buf.len() + n;
    if need <= buf.capacity() {
        return true;
    }
    let cap = buf.capacity();
    for new_cap in [need.max(2 * cap), need] {
        if reserved.try_grow(2 * (new_cap - cap) as u64) {
            buf.reserve_exact(new_cap - buf.len());
            return true;
        }
    }
    false
}

/// A spill file with `before` then `data` in it, or `Off` when there is to be none.
fn spill_to_file(budget: Arc<Budget>, spill: bool, before: &[u8], data: &[u8]) -> CopySink {
    if !spill {
        return CopySink::Off(CopyOff::OverBudget);
    }
    let written = tempfile::tempfile_in(&budget.spill_dir).and_then(|mut f| {
        f.write_all(before)?;
        f.write_all(data)?;
        Ok(f)
    });
    match written {
        Ok(f) => {
            budget.spilled.fetch_add(1, Relaxed);
            CopySink::File(f, (before.len() + data.len()) as u64)
        }
        Err(e) => {
            tracing::warn!(dir = %budget.spill_dir.display(), error = %e, "no spill file could be made: the capture is skipped");
            CopySink::Off(CopyOff::OverBudget)
        }
    }
}

/// Reads a spill file of `len` bytes onto the end of `out`.
pub fn read_spilled(file: &mut std::fs::File, len: u64, out: &mut Vec<u8>) -> std::io::Result<()> {
    file.seek(std::io::SeekFrom::Start(0))?;
    let start = out.len();
    file.take(len).read_to_end(out)?;
    if (out.len() - start) as u64 != len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "a spill file shorter than what was written",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stay_within_the_budget() {
        let b = Budget::new(100, std::env::temp_dir());
        let r = b.try_reserve(60).unwrap();
        assert!(b.try_reserve(41).is_none());
        let mut s = b.try_reserve(40).unwrap();
        assert!(!s.try_grow(1));
        drop(r);
        assert!(s.try_grow(60));
        assert_eq!(b.used(), 100);
        drop(s);
        assert_eq!((b.used(), b.peak()), (0, 100));
    }

    #[test]
    fn a_copy_spills_past_the_budget_and_reads_back() {
        let b = Budget::new(10, std::env::temp_dir());
        let mut sink = CopySink::new(&b, true);
        sink.push(b"abcd", None);
        assert_eq!(b.used(), 8);
        sink.push(b"efgh", None);
        assert_eq!(b.used(), 0);
        let Ok(KeptBody::Spilled(mut f, len)) = sink.finish() else {
            panic!("not spilled")
        };
        let mut out = b"x".to_vec();
        read_spilled(&mut f, len, &mut out).unwrap();
        assert_eq!(out, b"xabcdefgh");
        let mut sink = CopySink::new(&b, false);
        sink.push(b"abcdefgh", None);
        assert!(matches!(sink.finish(), Err(CopyOff::OverBudget)));
        let mut sink = CopySink::new(&b, true);
        sink.push(b"ab", Some(2));
        let Ok(KeptBody::Memory(body, item)) = sink.finish() else {
            panic!("not in memory")
        };
        assert_eq!((&body[..], b.used()), (&b"ab"[..], 4));
        drop(item);
        assert_eq!(b.used(), 2);
        drop(body);
        assert_eq!(b.used(), 0);
    }

    #[tokio::test]
    async fn a_waiter_gets_room_when_it_is_freed() {
        let b = Budget::new(10, std::env::temp_dir());
        assert!(b.reserve(11).await.is_none());
        let r = b.try_reserve(10).unwrap();
        let b2 = Arc::clone(&b);
        let waiter = tokio::spawn(async move { b2.reserve(5).await.map(|r| r.bytes) });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        drop(r);
        assert_eq!(waiter.await.unwrap(), Some(5));
    }
}
