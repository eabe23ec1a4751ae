//! Per-queue settings (durability and limits) and store-wide options.
//!
//! The defaults are what a user who sets nothing gets: `periodic` durability, no count
//! or size limit on the queue, items up to 64 MiB, leases that never time out.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;

/// How hard an append (and a reader's confirmation) is pushed towards the disk before
/// the call returns. See `docs/storage.md` for exactly what each mode can lose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// The fastest: appends are staged in the process and written to the file (the OS
    /// page cache) 64 KiB at a time, or once the oldest has waited 50 ms; fsync'ed
    /// only on close, an explicit sync, or an append with `sync`, never on a timer. A
    /// killed process can lose the newest staged appends (at most 64 KiB of them); an
    /// OS crash or power cut can lose whatever the kernel had not written back since
    /// the last fsync. Confirmations are written through at once, as in every mode.
    Buffered,
    /// Written into the OS page cache before the call returns, fsync'ed every
    /// `interval` by a background thread. A killed process loses nothing; an OS crash
    /// or power cut can lose up to one interval.
    Periodic(Duration),
    /// The call returns only after the bytes are fdatasync'ed. Concurrent callers share
    /// one fsync (group commit).
    Synced,
}

impl Durability {
    /// The default periodic fsync interval: what an OS crash may lose, against what
    /// the fsyncs cost. One second, as Redis's `appendfsync everysec`; Kestrel,
    /// Darner and Siberite do not fsync on a timer by default at all. Measured on the
    /// flood benchmark, 200 ms cost about 5% more server CPU per request than 1 s.
    pub const PERIODIC_INTERVAL_DEFAULT: Duration = Duration::from_millis(1000);
}

impl Default for Durability {
    fn default() -> Self {
        Durability::Periodic(Self::PERIODIC_INTERVAL_DEFAULT)
    }
}

/// Settings of one queue. `u64::MAX` means "no limit" for the count and size limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueConfig {
    pub durability: Durability,
    /// Most items the queue keeps (for its slowest reader).
    pub max_items: u64,
    /// Most payload bytes the queue keeps (for its slowest reader).
    pub max_bytes: u64,
    /// Largest single item accepted.
    pub max_item_size_bytes: u64,
    /// Items older than this are treated as expired.
    pub max_age: Option<Duration>,
    /// When full: drop the oldest items to make room (true) or refuse the append (false).
    pub discard_old_when_full: bool,
    /// Expired items are appended to this queue instead of being dropped.
    pub expire_to: Option<String>,
    /// A lease not confirmed within this time is released.
    pub open_timeout: Option<Duration>,
    /// An item handed out this many times to a reader without being confirmed is not
    /// handed out again: the next take that reaches it moves it to `dead_letter_to`
    /// (or drops it, with none) instead. `None`: no limit.
    pub max_deliveries: Option<u32>,
    /// Where items past `max_deliveries` go (a queue name; created when first needed).
    pub dead_letter_to: Option<String>,
    /// Jobs put with this priority go to the queue's own log; other priorities get a
    /// lane each (see [`crate::jobs`]).
    pub priority_default: u32,
    /// Most priorities with jobs at once in one tube, the default one included: a put
    /// with one more is refused (each is a lane, with files of its own).
    pub priorities_max: u32,
    /// Size at which a segment file is sealed and a new one started.
    pub segment_size_bytes: u64,
}

impl QueueConfig {
    pub const MAX_ITEM_SIZE_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
    pub const SEGMENT_SIZE_BYTES_DEFAULT: u64 = 32 * 1024 * 1024;
    /// beanstalkd clients' most common default priority (pheanstalk's; greenstalk's
    /// is 65536): set `priority_default` to what your clients send most.
    pub const PRIORITY_DEFAULT: u32 = 1024;
    pub const PRIORITIES_MAX_DEFAULT: u32 = 32;
}

// The default item limit is one the record format can describe, and a default
// segment holds at least its file header and one record header.
const _: () =
    assert!(QueueConfig::MAX_ITEM_SIZE_BYTES_DEFAULT <= crate::frame::RECORD_PAYLOAD_BYTES_MAX);
const _: () = assert!(
    QueueConfig::SEGMENT_SIZE_BYTES_DEFAULT
        > crate::segment::FILE_HEADER_BYTES + crate::frame::RECORD_HEADER_BYTES as u64
);

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            durability: Durability::default(),
            max_items: u64::MAX,
            max_bytes: u64::MAX,
            max_item_size_bytes: Self::MAX_ITEM_SIZE_BYTES_DEFAULT,
            max_age: None,
            discard_old_when_full: false,
            expire_to: None,
            open_timeout: None,
            max_deliveries: None,
            dead_letter_to: None,
            priority_default: Self::PRIORITY_DEFAULT,
            priorities_max: Self::PRIORITIES_MAX_DEFAULT,
            segment_size_bytes: Self::SEGMENT_SIZE_BYTES_DEFAULT,
        }
    }
}

/// Picks the settings of a queue by name; lets a front door apply name patterns.
pub type ConfigFn = Arc<dyn Fn(&str) -> QueueConfig + Send + Sync>;

/// Options of a whole store.
#[derive(Clone)]
pub struct StoreOptions {
    /// Settings for queues that `config_for` does not decide.
    pub defaults: QueueConfig,
    /// Per-queue settings; when set it decides every queue's settings.
    pub config_for: Option<ConfigFn>,
    /// Most queues the store creates: one more new name gets
    /// [`crate::Error::TooManyQueues`]. Queues already on disk when the store opens
    /// are always opened, even past it. No limit by default.
    pub queues_max: usize,
    /// Disk space set aside (a preallocated file, `space-reserve`) that appends never
    /// get, so that readers can still consume, and free space, once appends have
    /// filled the disk; 0 turns it off. Read when the store opens. See
    /// `docs/storage.md`.
    pub space_reserve_bytes: u64,
    /// Most descriptors the store keeps open for its queues' files (segments, reader
    /// journals). A queue in use holds two to four (its segment being written, its
    /// reader journal, the sealed segments its readers are in); a queue unused for
    /// 10 s closes them all; past this budget the queues used least recently close
    /// theirs at once. Not counted: short-lived ones (an fsync of a sealed segment, an
    /// iterator's). Default: half the process's open-files limit (`RLIMIT_NOFILE`)
    /// when the options are made.
    pub files_open_max: usize,
    /// What the store takes as the current time for item expiry, enqueue times and
    /// lease timeouts: the system clock by default, a [`crate::ManualClock`] in tests.
    /// Read when the store opens (`set_options` does not change it).
    pub clock: Clock,
}

impl StoreOptions {
    /// The default of `space_reserve_bytes`: enough reader-journal records to consume
    /// a whole 32 MiB segment of small items, and the journal's rotation besides.
    pub const SPACE_RESERVE_BYTES_DEFAULT: u64 = 8 * 1024 * 1024;
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            defaults: QueueConfig::default(),
            config_for: None,
            queues_max: usize::MAX,
            space_reserve_bytes: Self::SPACE_RESERVE_BYTES_DEFAULT,
            files_open_max: open_files_limit() / 2,
            clock: Clock::system(),
        }
    }
}

impl StoreOptions {
    /// The settings that apply to `queue`.
    pub fn config(&self, queue: &str) -> QueueConfig {
        // A tube's lanes have its settings (see `crate::jobs`), but for the lanes
        // where jobs wait (buried, delayed): nothing expires, is dead-lettered or
        // discarded there, and no lease of theirs times out.
        let tube = crate::jobs::lane_name::tube_of_lane(queue).unwrap_or(queue);
        let mut config = match &self.config_for {
            Some(f) => f(tube),
            None => self.defaults.clone(),
        };
        if crate::jobs::lane_name::is_parking_lane(queue) {
            config.max_age = None;
            config.expire_to = None;
            config.max_deliveries = None;
            config.dead_letter_to = None;
            config.max_items = u64::MAX;
            config.max_bytes = u64::MAX;
            config.discard_old_when_full = false;
            config.open_timeout = None;
        }
        config
    }
}

/// The process's soft limit on open files (`RLIMIT_NOFILE`), or 1024 when it cannot be
/// read.
pub fn open_files_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass and nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 1024;
    }
    usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
}

impl fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreOptions")
            .field("defaults", &self.defaults)
            .field("config_for", &self.config_for.as_ref().map(|_| "fn"))
            .field("queues_max", &self.queues_max)
            .field("space_reserve_bytes", &self.space_reserve_bytes)
            .field("files_open_max", &self.files_open_max)
            .finish()
    }
}
