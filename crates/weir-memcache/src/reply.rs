//! Every fixed reply line of the memcache door, spelled once.
//!
//! Commands write these (and the variable lines built in `cmd/mod.rs`: `VALUE`,
//! `SERVER_ERROR text`, stats); tests compare against them. Where a reply differs from
//! memcached's or Kestrel's on purpose, `docs/protocol.md` says so.

// Success.
pub const STORED: &[u8] = b"STORED\r\n";
pub const END: &[u8] = b"END\r\n";
pub const DELETED: &[u8] = b"DELETED\r\n";
/// `flush_all`, as every memcache client expects.
pub const OK: &[u8] = b"OK\r\n";
/// `flush_all` with `flush_all_reply = "kestrel"`.
pub const FLUSHED_ALL_KESTREL: &[u8] = b"Flushed all queues.\r\n";
/// `reload`.
pub const RELOADED: &[u8] = b"Reloaded config.\r\n";
/// `stats reset`.
pub const RESET: &[u8] = b"RESET\r\n";
/// A queue at its `max_items`/`max_bytes` refused an append.
pub const NOT_STORED: &[u8] = b"NOT_STORED\r\n";

// The request itself.
/// An unknown command.
pub const ERROR: &[u8] = b"ERROR\r\n";
pub const BAD_FORMAT: &[u8] = b"CLIENT_ERROR bad command line format\r\n";
pub const LINE_TOO_LONG: &[u8] = b"CLIENT_ERROR line too long\r\n";
pub const BAD_DATA_CHUNK: &[u8] = b"CLIENT_ERROR bad data chunk\r\n";
pub const TOO_LARGE: &[u8] = b"CLIENT_ERROR item too large\r\n";
pub const TOO_MANY_KEYS: &[u8] = b"CLIENT_ERROR too many keys\r\n";
pub const REQUEST_TIMED_OUT: &[u8] = b"CLIENT_ERROR request timed out\r\n";
pub const INVALID_ARGUMENT: &[u8] = b"CLIENT_ERROR invalid argument\r\n";
pub const SHUTDOWN_DISABLED: &[u8] = b"CLIENT_ERROR shutdown is disabled\r\n";

// Keys.
pub const BAD_QUEUE_NAME: &[u8] = b"CLIENT_ERROR bad queue name\r\n";
pub const BAD_OPTION: &[u8] = b"CLIENT_ERROR bad option\r\n";
pub const RESERVED_QUEUE: &[u8] = b"CLIENT_ERROR reserved queue: bus:* belongs to the event bus and proxy:capture:* to the proxy (stats works; delete and flush only with reserved_queues_writable = true)\r\n";
pub const ABORT_NOT_ALONE: &[u8] = b"CLIENT_ERROR abort cannot be combined\r\n";
pub const TOUCH_NOT_ALONE: &[u8] = b"CLIENT_ERROR touch cannot be combined\r\n";
pub const PEEK_COMBINED: &[u8] =
    b"CLIENT_ERROR peek cannot be combined with open, close or abort\r\n";
/// A fanout key (`a+b+c`) naming more queues than allowed.
pub const TOO_MANY_QUEUES_IN_KEY: &[u8] = b"CLIENT_ERROR too many queues\r\n";

// Open reads.
pub const CLOSE_FIRST: &[u8] = b"CLIENT_ERROR close current item first\r\n";
pub const NOT_THAT_MANY_OPEN: &[u8] = b"CLIENT_ERROR not that many open items\r\n";
/// The connection holds `LEASES_PER_CONNECTION_MAX` leases.
pub const TOO_MANY_OPEN_ITEMS: &[u8] = b"CLIENT_ERROR too many open items\r\n";

// Storage commands a queue does not do (their data block is read and dropped).
pub const ADD_UNSUPPORTED: &[u8] = b"CLIENT_ERROR add is not supported by a queue\r\n";
pub const REPLACE_UNSUPPORTED: &[u8] = b"CLIENT_ERROR replace is not supported by a queue\r\n";
pub const APPEND_UNSUPPORTED: &[u8] = b"CLIENT_ERROR append is not supported by a queue\r\n";
pub const PREPEND_UNSUPPORTED: &[u8] = b"CLIENT_ERROR prepend is not supported by a queue\r\n";
pub const CAS_UNSUPPORTED: &[u8] = b"CLIENT_ERROR cas is not supported by a queue\r\n";
pub const MS_UNSUPPORTED: &[u8] = b"CLIENT_ERROR ms is not supported by a queue\r\n";

// The server.
pub const TOO_MANY_CONNECTIONS: &[u8] = b"SERVER_ERROR too many connections\r\n";
pub const DISK_FULL: &[u8] = b"SERVER_ERROR disk full\r\n";
pub const SHUTTING_DOWN: &[u8] = b"SERVER_ERROR shutting down\r\n";
/// The store holds `queues_max` and refused to create one more.
pub const TOO_MANY_QUEUES: &[u8] = b"SERVER_ERROR too many queues\r\n";
/// The start of the text of `SERVER_ERROR backend unavailable: DETAIL`: the backend
/// (a JetStream cluster) cannot be reached or has no leader; nothing is known to have
/// happened, and the request may be retried.
pub const UNAVAILABLE_PREFIX: &str = "backend unavailable";
