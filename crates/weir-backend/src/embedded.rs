//! The embedded backend: the weir engine in this process, the default.
//!
//! Handles are the engine's own (`weir::Queue`, `weir::Reader`); the hot calls in
//! `lib.rs` forward to the engine's futures. What is here is what surrounds them:
//! creating queues and readers without blocking an event loop, and the whole-store
//! commands, which do file work and so run on tokio's blocking pool.
//!
//! A queue (or reader) that exists is a map lookup, done in place. One that does not
//! is created, which is file work (a directory, a journal, a first segment, the reader
//! list): that runs on the blocking pool, and at most [`CREATIONS_AT_ONCE`] run at a
//! time, process-wide, so a client naming new queues as fast as it can neither stalls
//! its event loop nor takes the blocking pool (and the disk) from everyone else. The
//! cap on the number of queues (`max_queues`) is the engine's, checked under the
//! store's map lock, so it is exact however many connections create at once.

use tokio::sync::Semaphore;
use weir::{Queue, QueueStats, Reader, Store, StoreOptions};

use crate::error::{Error, Kind, Result};
use crate::local_map::LocalMap;
use crate::position::{ScanFrom, SeekTo};

/// Queue and reader creations running at once: enough to overlap a few file
/// systems' latencies, few enough that creation storms leave the blocking pool to
/// fsync waits.
pub const CREATIONS_AT_ONCE: usize = 4;

pub struct Embedded {
    store: Store,
    creations: Semaphore,
}

impl Embedded {
    pub fn new(store: Store) -> Embedded {
        Embedded {
            store,
            creations: Semaphore::new(CREATIONS_AT_ONCE),
        }
    }

    /// Opens the data directory `dir` with the default settings, for a tool that
    /// works on a stopped weir's directory (`weir capture export/import --data-dir`,
    /// `weir replay --data-dir`), so that it reaches the store through the backend
    /// as a running weir does. [`Kind::Locked`](crate::Kind) when a weir (another
    /// process) holds the directory.
    pub fn open(dir: &std::path::Path) -> Result<Embedded> {
        Ok(Embedded::new(Store::open_with(
            dir,
            StoreOptions::default(),
        )?))
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The map `name` of the data directory (`DATA_DIR/maps/NAME.map`: see
    /// [`crate::LocalMap`]), opened on the blocking pool (it is read whole).
    pub async fn shared_map(&self, name: &str) -> Result<LocalMap> {
        let dir = self.store.dir().to_owned();
        let name = name.to_owned();
        match tokio::task::spawn_blocking(move || LocalMap::open(&dir, &name)).await {
            Ok(opened) => opened,
            Err(e) => Err(Error::new(Kind::Other, format!("opening a map: {e}"))),
        }
    }

    pub fn existing_queue(&self, name: &str) -> Result<Option<Queue>> {
        Ok(self.store.existing_queue(name)?)
    }

    /// The queue `name`, created on first use.
    pub async fn queue(&self, name: &str) -> Result<Queue> {
        if let Some(queue) = self.store.existing_queue(name)? {
            return Ok(queue);
        }
        let store = self.store.clone();
        let name = name.to_owned();
        self.off_loop(move || store.queue(&name)).await
    }

    /// The reader `name` of `queue`, created on first use.
    pub async fn reader(&self, queue: &Queue, name: &str) -> Result<Reader> {
        if queue.has_reader(name) {
            return Ok(queue.reader(name)?);
        }
        let queue = queue.clone();
        let name = name.to_owned();
        self.off_loop(move || queue.reader(&name)).await
    }

    /// The reader `name` of `queue`, made to start after the newest item when it
    /// does not exist; one that exists is not moved ([`weir::Queue::reader_at_end`]).
    pub async fn reader_at_end(&self, queue: &Queue, name: &str) -> Result<Reader> {
        let queue = queue.clone();
        let name = name.to_owned();
        self.off_loop(move || queue.reader_at_end(&name)).await
    }

    /// Clears the queue's `open_timeout`, so that its leases never time out (in this
    /// process, until the settings are reloaded). On the blocking pool when there is
    /// one to clear: new settings may write the appends staged so far.
    pub async fn clear_lease_timeout(&self, queue: &Queue) -> Result<()> {
        if queue.config().open_timeout.is_none() {
            return Ok(());
        }
        let queue = queue.clone();
        blocking(move || {
            let mut config = queue.config();
            config.open_timeout = None;
            queue.set_config(config);
            Ok(())
        })
        .await
    }

    /// Runs a creation on the blocking pool, within [`CREATIONS_AT_ONCE`].
    async fn off_loop<T: Send + 'static>(
        &self,
        create: impl FnOnce() -> weir::Result<T> + Send + 'static,
    ) -> Result<T> {
        // The semaphore is never closed, so acquiring cannot fail; if it did, running
        // without the bound is still correct.
        let _permit = self.creations.acquire().await.ok();
        blocking(create).await
    }

    pub async fn delete_queue(&self, queue: &str) -> Result<bool> {
        let store = self.store.clone();
        let queue = queue.to_owned();
        blocking(move || store.delete_queue(&queue)).await
    }

    pub async fn delete_reader(&self, queue: &str, reader: &str) -> Result<bool> {
        let store = self.store.clone();
        let (queue, reader) = (queue.to_owned(), reader.to_owned());
        blocking(move || match store.existing_queue(&queue)? {
            Some(q) => q.delete_reader(&reader),
            None => Ok(false),
        })
        .await
    }

    /// The names of `queue`'s readers; none for a queue that does not exist (which
    /// is not made). A queue that cannot be opened is an error.
    pub async fn reader_names(&self, queue: &str) -> Result<Vec<String>> {
        let store = self.store.clone();
        let queue = queue.to_owned();
        blocking(move || {
            Ok(store
                .existing_queue(&queue)?
                .map(|q| q.reader_names())
                .unwrap_or_default())
        })
        .await
    }

    /// `flush q` (every reader) or `flush q.r`; never creates either.
    pub async fn flush(&self, queue: &str, reader: Option<&str>) -> Result<u64> {
        let store = self.store.clone();
        let queue = queue.to_owned();
        let reader = reader.map(str::to_owned);
        blocking(move || {
            let Some(q) = store.existing_queue(&queue)? else {
                return Ok(0);
            };
            match reader {
                None => q.flush(),
                Some(r) if q.has_reader(&r) => q.reader(&r)?.flush(),
                Some(_) => Ok(0),
            }
        })
        .await
    }

    pub async fn flush_all(&self, keep: fn(&str) -> bool) -> Result<()> {
        let store = self.store.clone();
        blocking(move || {
            for queue in store.queues().into_iter().filter(|q| !keep(q.name())) {
                queue.flush()?;
            }
            Ok(())
        })
        .await
    }

    /// Drops (or moves to `expire_to`) what has expired, in one queue or all.
    pub async fn expire(&self, queue: Option<&str>) -> Result<u64> {
        let store = self.store.clone();
        let name = queue.map(str::to_owned);
        blocking(move || {
            let queues = match name {
                Some(name) => store.existing_queue(&name)?.into_iter().collect(),
                None => store.queues(),
            };
            let mut count = 0u64;
            for q in queues {
                count += q.expire()?;
            }
            Ok(count)
        })
        .await
    }

    /// The named queues' stats (every queue's when `None`), in the store's order;
    /// names that are not queues are left out.
    pub async fn stats(&self, names: Option<Vec<String>>) -> Result<Vec<QueueStats>> {
        let store = self.store.clone();
        blocking(move || {
            let queues = match names {
                None => store.queues(),
                Some(names) => names
                    .iter()
                    .filter_map(|n| store.existing_queue(n).ok().flatten())
                    .collect(),
            };
            Ok(queues.iter().map(Queue::stats).collect())
        })
        .await
    }

    pub async fn set_options(&self, options: StoreOptions) -> Result<()> {
        let store = self.store.clone();
        blocking(move || {
            store.set_options(options);
            Ok(())
        })
        .await
    }

    pub async fn close(&self) -> Result<()> {
        let store = self.store.clone();
        blocking(move || store.close()).await
    }
}

/// [`crate::Queue::append_batch`] on the engine: all or none, one fsync, on the
/// blocking pool (an fsync may wait there).
pub(crate) async fn append_batch(
    queue: &Queue,
    items: &[&[u8]],
    options: weir::AppendOptions,
) -> Result<u64> {
    let queue = queue.clone();
    let owned: Vec<Vec<u8>> = items.iter().map(|i| i.to_vec()).collect();
    blocking(move || {
        let refs: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        queue.append_batch(&refs, options)
    })
    .await
}

/// [`crate::Queue::bounds`] on the engine: from memory, no file read.
pub(crate) async fn bounds(queue: &Queue) -> Result<(u64, u64)> {
    // In place, as a take is: the engine reads them from memory under the queue's
    // lock. The blocking pool would cost two thread switches per call, and the bus's
    // janitor asks every topic every second.
    Ok(queue.seq_bounds()?)
}

/// [`crate::Queue::seq_at_time`] on the engine: a search over record headers.
pub(crate) async fn seq_at_time(queue: &Queue, ms: u64) -> Result<u64> {
    let queue = queue.clone();
    blocking(move || queue.seq_at_time(ms)).await
}

/// [`crate::Queue::seek_reader`] on the engine: a search by time reads record
/// headers, and the move is journaled (durable on return under `synced`).
pub(crate) async fn seek_reader(queue: &Queue, reader: &str, to: SeekTo) -> Result<Option<u64>> {
    let queue = queue.clone();
    let reader = reader.to_owned();
    blocking(move || {
        if !queue.has_reader(&reader) {
            return Ok(None);
        }
        let seq = match to {
            SeekTo::Seq(seq) => seq,
            SeekTo::Time(ms) => queue.seq_at_time(ms)?,
            SeekTo::End => u64::MAX,
        };
        // Not through a reader handle, whose seek would make the reader again had
        // it been deleted since the look above.
        queue.seek_reader(&reader, seq)
    })
    .await
}

/// Runs engine file work on tokio's blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> weir::Result<T> + Send + 'static,
) -> Result<T> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => Ok(result?),
        Err(e) => Err(Error::Engine(weir::Error::from_io(
            "running on the blocking pool",
            std::io::Error::other(e.to_string()),
        ))),
    }
}

/// A walk over the items one queue keeps ([`crate::Scan`]), in the engine: its
/// iterator, which reads files, and so runs a page at a time on the blocking pool.
pub struct EmbeddedScan {
    /// `None` once the walk has ended (or an iterator failed on the pool).
    iter: Option<weir::Iter>,
    /// Items before this seq are skipped (a scan from a time).
    start: u64,
}

impl Embedded {
    /// Starts a walk over what `queue` keeps, from its oldest item or from the first
    /// appended at or after a time; [`Kind::NotFound`](crate::Kind) when the queue
    /// does not exist.
    pub async fn scan(&self, queue: &str, from: ScanFrom) -> Result<EmbeddedScan> {
        let store = self.store.clone();
        let name = queue.to_owned();
        blocking(move || {
            let queue = store
                .existing_queue(&name)?
                .ok_or_else(|| weir::Error::NotFound {
                    what: format!("queue {name}"),
                })?;
            let start = match from {
                ScanFrom::Oldest => 0,
                ScanFrom::Time(ms) => queue.seq_at_time(ms)?,
            };
            Ok(EmbeddedScan {
                iter: Some(queue.iter()?),
                start,
            })
        })
        .await
    }
}

impl EmbeddedScan {
    /// Up to `max` more items (at least one unless the walk has ended).
    pub async fn next_page(&mut self, max: usize) -> Result<Vec<weir::Item>> {
        let Some(mut iter) = self.iter.take() else {
            return Ok(Vec::new());
        };
        let start = self.start;
        // An error ends the walk: the iterator stays on the pool's side.
        let (iter, page) = blocking(move || {
            let mut page = Vec::new();
            while page.len() < max {
                let Some(item) = iter.next() else {
                    return Ok((None, page));
                };
                let item = item?;
                if item.seq >= start {
                    page.push(item);
                }
            }
            Ok((Some(iter), page))
        })
        .await?;
        self.iter = iter;
        Ok(page)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::Kind;

    #[tokio::test]
    async fn creates_on_first_use_within_the_cap(
    ) -> std::result::Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Store::open_with(
            dir.path(),
            StoreOptions {
                queues_max: 2,
                ..StoreOptions::default()
            },
        )?;
        let backend = Embedded::new(store.clone());
        let a = backend.queue("a").await?;
        assert_eq!(backend.queue("a").await?.name(), "a");
        let r = backend.reader(&a, "fan").await?;
        assert_eq!((r.queue_name(), r.name()), ("a", "fan"));
        assert_eq!(backend.reader(&a, "fan").await?.name(), "fan");
        backend.queue("b").await?;
        let e = backend.queue("c").await.err().ok_or("a third queue")?;
        assert_eq!(e.kind(), Kind::TooManyQueues);
        assert_eq!(
            backend.queue("bad/name").await.err().map(|e| e.kind()),
            Some(Kind::InvalidName)
        );
        assert_eq!(store.queue_names(), ["a", "b"]);
        Ok(())
    }

    #[tokio::test]
    async fn a_data_directory_opens_once_and_says_when_it_is_locked(
    ) -> std::result::Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let first = crate::Backend::Embedded(Embedded::open(dir.path())?);
        first
            .queue("kept")
            .await?
            .append(b"1", weir::AppendOptions::default())
            .await?;
        let locked = Embedded::open(dir.path()).err().ok_or("opened twice")?;
        assert_eq!(locked.kind(), Kind::Locked);
        assert!(
            locked.to_string().contains("in use by another process"),
            "{locked}"
        );
        first.close().await?;
        drop(first);
        let again = Embedded::open(dir.path())?;
        assert!(again.existing_queue("kept")?.is_some());
        Ok(())
    }

    #[tokio::test]
    async fn a_scan_walks_what_is_kept_page_by_page(
    ) -> std::result::Result<(), Box<dyn std::error::Error>> {
        use crate::ScanFrom;
        let dir = tempfile::tempdir()?;
        let backend = Embedded::new(Store::open(dir.path())?);
        let q = backend.queue("walk").await?;
        for item in ["1", "2", "3", "4", "5"] {
            q.append(item.as_bytes(), weir::AppendOptions::default())?;
        }
        let reader = q.reader("")?;
        assert!(reader.take()?.is_some());
        let backend = &backend;
        let walk = |from| async move {
            let mut scan = backend.scan("walk", from).await?;
            let mut got = Vec::new();
            loop {
                let page = scan.next_page(2).await?;
                assert!(page.len() <= 2);
                if page.is_empty() {
                    return Ok::<_, Error>(got);
                }
                got.extend(page.into_iter().map(|i| i.data));
            }
        };
        assert_eq!(walk(ScanFrom::Oldest).await?, [&b"2"[..], b"3", b"4", b"5"]);
        assert_eq!(walk(ScanFrom::Time(0)).await?.len(), 4);
        assert!(walk(ScanFrom::Time(u64::MAX)).await?.is_empty());
        // Nothing was consumed.
        assert_eq!(reader.take()?.map(|i| i.data), Some("2".into()));
        let missing = backend.scan("nothing", ScanFrom::Oldest).await.err();
        assert_eq!(missing.map(|e| e.kind()), Some(Kind::NotFound));
        Ok(())
    }

    #[tokio::test]
    async fn a_reader_made_at_the_end_skips_what_is_kept(
    ) -> std::result::Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let backend = crate::Backend::Embedded(Embedded::new(Store::open(dir.path())?));
        let (q, _) = backend.queue_for_readers("rec", &["record"], true).await?;
        q.append(b"1", weir::AppendOptions::default()).await?;
        let (q, readers) = backend
            .queue_for_readers("rec", &["record", "s"], true)
            .await?;
        let none = readers[1]
            .take(weir::TakeMode::Take, Duration::ZERO)
            .await?;
        assert!(none.is_none());
        q.append(b"2", weir::AppendOptions::default()).await?;
        let two = readers[1]
            .take(weir::TakeMode::Take, Duration::ZERO)
            .await?;
        assert_eq!(two.map(|t| t.item.data), Some("2".into()));
        let one = readers[0]
            .take(weir::TakeMode::Take, Duration::ZERO)
            .await?;
        assert_eq!(
            one.map(|t| t.item.data),
            Some("1".into()),
            "record keeps its place"
        );
        // Without it, a new reader starts at the oldest item kept.
        let (_, readers) = backend.queue_for_readers("rec", &["t"], false).await?;
        let first = readers[0]
            .take(weir::TakeMode::Take, Duration::ZERO)
            .await?;
        assert_eq!(first.map(|t| t.item.data), Some("2".into()));
        Ok(())
    }
}
