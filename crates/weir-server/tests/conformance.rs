//! Conformance: every command and option of docs/protocol.md over a real socket,
//! replies checked byte for byte, every error path, pipelining and split writes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

mod common;

use std::time::{Duration, Instant};

use common::{config_file, Client, Server};

fn server() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    (dir, server)
}

#[test]
fn set_and_get_round_trip_flags_and_empty_items() {
    let (_dir, s) = server();
    let mut c = s.client();
    c.call(b"set q 42 0 5\r\nhello\r\n", b"STORED\r\n");
    c.call(b"set q 4294967295 0 0\r\n\r\n", b"STORED\r\n");
    c.call(b"set q 0 0 4\r\na\r\nb\r\n", b"STORED\r\n");
    c.call(b"get q\r\n", b"VALUE q 42 5\r\nhello\r\nEND\r\n");
    c.call(b"get q\r\n", b"VALUE q 4294967295 0\r\n\r\nEND\r\n");
    c.call(b"get q\r\n", b"VALUE q 0 4\r\na\r\nb\r\nEND\r\n");
    c.call(b"get q\r\n", b"END\r\n");
    // Bare \n line ends, and case-insensitive command words.
    c.call(
        b"SeT q 1 0 2\nhi\nGET q\n",
        b"STORED\r\nVALUE q 1 2\r\nhi\r\nEND\r\n",
    );
}

#[test]
fn gets_returns_the_sequence_number_as_cas() {
    if common::embedded_only("the CAS is the engine's sequence, dense from 1; on JetStream it is the stream's (docs/cluster.md)") {
        return;
    }
    let (_dir, s) = server();
    let mut c = s.client();
    c.call(
        b"set q 0 0 1\r\na\r\nset q 0 0 1\r\nb\r\n",
        b"STORED\r\nSTORED\r\n",
    );
    c.call(b"gets q\r\n", b"VALUE q 0 1 1\r\na\r\nEND\r\n");
    c.call(b"gets q\r\n", b"VALUE q 0 1 2\r\nb\r\nEND\r\n");
}

#[test]
fn noreply_multi_queue_and_sync_sets() {
    let (_dir, s) = server();
    let mut c = s.client();
    c.send(b"set q 0 0 1 noreply\r\nx\r\n");
    c.call(b"set a+b+c/sync 7 0 2\r\nhi\r\n", b"STORED\r\n");
    c.call(b"get q\r\n", b"VALUE q 0 1\r\nx\r\nEND\r\n");
    c.call(
        b"get a b c\r\n",
        b"VALUE a 7 2\r\nhi\r\nVALUE b 7 2\r\nhi\r\nVALUE c 7 2\r\nhi\r\nEND\r\n",
    );
    c.call(
        b"set q/sync 0 0 1\r\ny\r\nget q\r\n",
        b"STORED\r\nVALUE q 0 1\r\ny\r\nEND\r\n",
    );
    // A reader is not a set target; an unknown option is refused.
    c.call(
        b"set q.r 0 0 1\r\nz\r\n",
        b"CLIENT_ERROR bad queue name\r\n",
    );
    c.call(b"set q/open 0 0 1\r\nz\r\n", b"CLIENT_ERROR bad option\r\n");
    c.call(b"get q\r\n", b"END\r\n");
}

#[test]
fn expiry_times() {
    let (_dir, s) = server();
    let mut c = s.client();
    c.call(b"set q 0 -1 1\r\na\r\n", b"STORED\r\n");
    c.call(b"set q 0 100000000 1\r\nb\r\n", b"STORED\r\n"); // Unix time in 1973
    c.call(b"set q 0 1 1\r\nc\r\n", b"STORED\r\n"); // one second from now
    c.call(b"set q 0 4000000000 1\r\nd\r\n", b"STORED\r\n"); // Unix time in 2096
    c.call(b"set q 0 0 1\r\ne\r\n", b"STORED\r\n");
    std::thread::sleep(Duration::from_millis(1100));
    c.call(b"get q\r\n", b"VALUE q 0 1\r\nd\r\nEND\r\n");
    c.call(b"get q\r\n", b"VALUE q 0 1\r\ne\r\nEND\r\n");
    c.call(b"get q\r\n", b"END\r\n");
}

#[test]
fn leases_open_close_abort_peek_and_their_rules() {
    let (_dir, s) = server();
    let mut c = s.client();
    c.call(
        b"set q 0 0 1\r\na\r\nset q 0 0 1\r\nb\r\n",
        b"STORED\r\nSTORED\r\n",
    );
    c.call(b"get q/peek\r\n", b"VALUE q/peek 0 1\r\na\r\nEND\r\n");
    c.call(b"get q/open\r\n", b"VALUE q/open 0 1\r\na\r\nEND\r\n");
    // One open read per queue per connection; no plain get while holding one.
    c.call(
        b"get q/open\r\n",
        b"CLIENT_ERROR close current item first\r\n",
    );
    c.call(b"get q\r\n", b"CLIENT_ERROR close current item first\r\n");
    // Peek is allowed, and sees the next unleased item.
    c.call(b"get q/peek\r\n", b"VALUE q/peek 0 1\r\nb\r\nEND\r\n");
    // Abort gives "a" back, ahead of "b".
    c.call(b"get q/abort\r\n", b"END\r\n");
    c.call(b"get q/open\r\n", b"VALUE q/open 0 1\r\na\r\nEND\r\n");
    // close/open (either order) confirms "a" and leases "b".
    c.call(
        b"get q/open/close\r\n",
        b"VALUE q/open/close 0 1\r\nb\r\nEND\r\n",
    );
    c.call(b"get q/close\r\n", b"END\r\n");
    c.call(b"get q/close\r\n", b"END\r\n"); // nothing open: no-op
    c.call(b"get q/abort\r\n", b"END\r\n");
    c.call(b"get q\r\n", b"END\r\n");
    // Combination rules.
    c.call(
        b"get q/abort/open\r\n",
        b"CLIENT_ERROR abort cannot be combined\r\n",
    );
    c.call(
        b"get q/abort/close\r\n",
        b"CLIENT_ERROR abort cannot be combined\r\n",
    );
    c.call(
        b"get q/abort/peek\r\n",
        b"CLIENT_ERROR abort cannot be combined\r\n",
    );
    c.call(
        b"get q/peek/open\r\n",
        b"CLIENT_ERROR peek cannot be combined with open, close or abort\r\n",
    );
    c.call(
        b"get q/close/peek\r\n",
        b"CLIENT_ERROR peek cannot be combined with open, close or abort\r\n",
    );
    c.call(b"get q/bogus\r\n", b"CLIENT_ERROR bad option\r\n");
    c.call(b"get q/t=abc\r\n", b"CLIENT_ERROR bad option\r\n");
    // Another connection does not see this connection's lease.
    c.call(
        b"set q 0 0 1\r\nc\r\nget q/open/t=10\r\n",
        b"STORED\r\nVALUE q/open/t=10 0 1\r\nc\r\nEND\r\n",
    );
    let mut other = s.client();
    other.call(b"get q\r\n", b"END\r\n");
    other.call(b"get q/close\r\n", b"END\r\n");
    c.call(b"get q/close\r\n", b"END\r\n");
}

#[test]
fn multi_key_get_counts_leases_across_its_keys() {
    let (_dir, s) = server();
    let mut c = s.client();
    c.call(
        b"set q 0 0 1\r\na\r\nset q 0 0 1\r\nb\r\nset q 0 0 1\r\nc\r\n",
        b"STORED\r\nSTORED\r\nSTORED\r\n",
    );
    // max_open_reads is 1: a second open of the same reader in one request is refused,
    // and a refused request takes nothing (peek still sees "a", unleased).
    c.call(
        b"get q/open q/open\r\n",
        b"CLIENT_ERROR close current item first\r\n",
    );
    c.call(b"get q/peek\r\n", b"VALUE q/peek 0 1\r\na\r\nEND\r\n");
    // A plain take after an open of the same reader, in the same request.
    c.call(
        b"get q/open q\r\n",
        b"CLIENT_ERROR close current item first\r\n",
    );
    c.call(b"get q/peek\r\n", b"VALUE q/peek 0 1\r\na\r\nEND\r\n");
    // `q.r` and `q+r` are one reader.
    c.call(
        b"get q.r/open q+r/open\r\n",
        b"CLIENT_ERROR close current item first\r\n",
    );
    // Different readers, or a close in between, are fine.
    c.call(
        b"get q/open q.r/open\r\n",
        b"VALUE q/open 0 1\r\na\r\nVALUE q.r/open 0 1\r\na\r\nEND\r\n",
    );
    c.call(
        b"get q.r/close q+r/open q+r/close\r\n",
        b"VALUE q+r/open 0 1\r\nb\r\nEND\r\n",
    );
    // Holding "a" on q: close/open twice confirms a, leases b, confirms b, leases c.
    c.call(
        b"get q/close/open q/close/open\r\n",
        b"VALUE q/close/open 0 1\r\nb\r\nVALUE q/close/open 0 1\r\nc\r\nEND\r\n",
    );
    c.call(
        b"get q/open\r\n",
        b"CLIENT_ERROR close current item first\r\n",
    );
    // abort releases "c", then open leases it again; close then a plain take finds
    // nothing left.
    c.call(
        b"get q/abort q/open\r\n",
        b"VALUE q/open 0 1\r\nc\r\nEND\r\n",
    );
    c.call(b"get q/close q\r\n", b"END\r\n");
    // Duplicate plain keys take one item each.
    c.call(
        b"set q 0 0 1\r\nd\r\nset q 0 0 1\r\ne\r\n",
        b"STORED\r\nSTORED\r\n",
    );
    c.call(
        b"get q q q\r\n",
        b"VALUE q 0 1\r\nd\r\nVALUE q 0 1\r\ne\r\nEND\r\n",
    );
    // Options with gets: the CAS field follows the length.
    c.call(b"set q 0 0 1\r\nf\r\n", b"STORED\r\n");
    // The sixth item: its seq on the engine, its stream sequence on JetStream (a
    // stream of its own per test; no creation probe takes a sequence any more).
    let cas = 6;
    c.call(
        b"gets q/peek\r\n",
        format!("VALUE q/peek 0 1 {cas}\r\nf\r\nEND\r\n").as_bytes(),
    );
    c.call(
        b"gets q/open/t=10\r\n",
        format!("VALUE q/open/t=10 0 1 {cas}\r\nf\r\nEND\r\n").as_bytes(),
    );
    c.call(b"gets q/close q\r\n", b"END\r\n");
}

#[test]
fn max_open_reads_from_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(dir.path(), "[server]\nopen_reads_max = 2\n");
    let s = Server::start(
        &dir.path().join("data"),
        &["--config", cfg.to_str().unwrap()],
    );
    let mut c = s.client();
    c.call(b"set q+r 0 0 1\r\na\r\n", b"STORED\r\n");
    c.call(
        b"set q 0 0 1\r\nb\r\nset q 0 0 1\r\nc\r\n",
        b"STORED\r\nSTORED\r\n",
    );
    c.call(
        b"get q/open\r\nget q/open\r\n",
        b"VALUE q/open 0 1\r\na\r\nEND\r\nVALUE q/open 0 1\r\nb\r\nEND\r\n",
    );
    c.call(
        b"get q/open\r\n",
        b"CLIENT_ERROR close current item first\r\n",
    );
    // close confirms the oldest.
    c.call(
        b"get q/close/open\r\n",
        b"VALUE q/close/open 0 1\r\nc\r\nEND\r\n",
    );
    c.call(b"get q/abort\r\n", b"END\r\n");
    c.call(
        b"get q/open\r\nget q/open\r\n",
        b"VALUE q/open 0 1\r\nb\r\nEND\r\nVALUE q/open 0 1\r\nc\r\nEND\r\n",
    );
}

#[test]
fn wait_ms_max_caps_t() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(dir.path(), "[server]\nwait_ms_max = 300\n");
    let s = Server::start(
        &dir.path().join("data"),
        &["--config", cfg.to_str().unwrap()],
    );
    let mut c = s.client();
    // Asked for 60 s: waits the cap, then misses.
    let started = Instant::now();
    c.call(b"get q/t=60000\r\n", b"END\r\n");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
    // Under the cap, t=MS is as asked; an item that comes during the wait is taken.
    let started = Instant::now();
    c.call(b"get q/open/t=50\r\n", b"END\r\n");
    assert!(started.elapsed() < Duration::from_millis(250));
    let addr = s.addr;
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        Client::connect(addr).call(b"set q 0 0 1\r\na\r\n", b"STORED\r\n");
    });
    c.call(b"get q/t=60000\r\n", b"VALUE q/t=60000 0 1\r\na\r\nEND\r\n");
    writer.join().unwrap();
}

#[test]
fn readers_fan_out_and_share() {
    let (_dir, s) = server();
    let mut c = s.client();
    // Create the readers first: a reader starts at the oldest item kept.
    c.call(
        b"get q.one\r\nget q+two\r\nget q\r\n",
        b"END\r\nEND\r\nEND\r\n",
    );
    c.call(
        b"set q 0 0 1\r\na\r\nset q 0 0 1\r\nb\r\n",
        b"STORED\r\nSTORED\r\n",
    );
    c.call(b"get q.one\r\n", b"VALUE q.one 0 1\r\na\r\nEND\r\n");
    c.call(b"get q+two\r\n", b"VALUE q+two 0 1\r\na\r\nEND\r\n");
    let mut d = s.client();
    d.call(b"get q+one\r\n", b"VALUE q+one 0 1\r\nb\r\nEND\r\n");
    c.call(b"get q.one\r\n", b"END\r\n");
    c.call(
        b"get q.two/open\r\n",
        b"VALUE q.two/open 0 1\r\nb\r\nEND\r\n",
    );
    // The default reader sees everything too.
    c.call(b"get q\r\n", b"VALUE q 0 1\r\na\r\nEND\r\n");
    c.call(b"get q. \r\n", b"CLIENT_ERROR bad queue name\r\n");
    c.call(b"get q.a.b\r\n", b"CLIENT_ERROR bad queue name\r\n");
}

const RESERVED: &[u8] = b"CLIENT_ERROR reserved queue: bus:* belongs to the event bus and proxy:capture:* to the proxy (stats works; delete and flush only with reserved_queues_writable = true)\r\n";

/// `bus:*` and `proxy:capture:*` belong to the bus and the proxy: `set`, `get` and
/// `monitor` refuse them (a default reader nobody reads would keep every item), and
/// make nothing; so do `delete` and `flush` by default (a `delete` of a topic's queue
/// broke the topic until a restart); `stats` works.
#[test]
fn reserved_queues_are_refused_to_set_and_get() {
    let (_dir, s) = server();
    let mut c = s.client();
    for line in [
        &b"set bus:topic:t 0 0 1\r\na\r\n"[..],
        b"set ok+proxy:capture:api 0 0 1\r\na\r\n",
        b"get proxy:capture:api\r\n",
        b"get proxy:capture:api+shadow/open\r\n",
        b"get ok bus:dead:s1/peek\r\n",
        b"monitor proxy:capture:api 1\r\n",
        b"flush proxy:capture:api\r\n",
        b"flush proxy:capture:api.record\r\n",
        b"delete proxy:capture:api.shadow\r\n",
        b"delete bus:topic:t\r\n",
    ] {
        c.call(line, RESERVED);
    }
    c.call(b"delete bus:topic:t noreply\r\nget ok\r\n", b"END\r\n");
    c.send(b"stats\r\n");
    let stats = String::from_utf8(c.read_until(b"END\r\n")).unwrap();
    assert!(
        !stats.contains("proxy:capture") && !stats.contains("bus:"),
        "{stats}"
    );
    // Look-alikes are ordinary queues.
    c.call(
        b"set bus 0 0 1\r\na\r\nget bus\r\n",
        b"STORED\r\nVALUE bus 0 1\r\na\r\nEND\r\n",
    );
    c.call(b"set proxy:captures 0 0 1\r\nb\r\n", b"STORED\r\n");
    c.call(b"delete proxy:captures\r\n", b"DELETED\r\n");
}

/// `reserved_queues_writable = true` lets `delete` and `flush` through (reloadable);
/// `set` and `get` stay refused.
#[test]
fn reserved_queues_writable_allows_delete_and_flush() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(dir.path(), "[server]\nreserved_queues_writable = true\n");
    let s = Server::start(
        &dir.path().join("data"),
        &["--config", cfg.to_str().unwrap()],
    );
    let mut c = s.client();
    c.call(b"flush proxy:capture:api\r\n", b"END\r\n");
    c.call(b"delete proxy:capture:api.shadow\r\n", b"DELETED\r\n");
    c.call(b"get proxy:capture:api\r\n", RESERVED);
    std::fs::write(&cfg, "[server]\n").unwrap();
    c.call(b"reload\r\n", b"Reloaded config.\r\n");
    c.call(b"delete bus:topic:t\r\n", RESERVED);
}

#[test]
fn delete_queue_and_reader() {
    let (_dir, s) = server();
    let mut c = s.client();
    // DELETED whether or not it existed, as Kestrel's last release answers.
    c.call(b"delete q\r\n", b"DELETED\r\n");
    c.call(
        b"set q 0 0 1\r\na\r\nget q.r/peek\r\n",
        b"STORED\r\nVALUE q.r/peek 0 1\r\na\r\nEND\r\n",
    );
    c.call(b"delete q.nope\r\n", b"DELETED\r\n");
    c.call(b"delete q.r\r\n", b"DELETED\r\n");
    c.call(b"delete q+r\r\n", b"DELETED\r\n");
    let mut other = s.client();
    other.call(b"get q/peek\r\n", b"VALUE q/peek 0 1\r\na\r\nEND\r\n");
    c.call(b"delete q\r\n", b"DELETED\r\n");
    c.call(b"delete q noreply\r\ndelete q 0\r\n", b"DELETED\r\n");
    // memcache's old hold time, once, and only 0.
    c.call(
        b"delete q 0 0\r\n",
        b"CLIENT_ERROR bad command line format\r\n",
    );
    c.call(
        b"delete q 5\r\n",
        b"CLIENT_ERROR bad command line format\r\n",
    );
    c.call(b"delete \xff\r\n", b"CLIENT_ERROR bad queue name\r\n");
    // A connection that cached the queue still works: it is created afresh.
    other.call(b"get q\r\n", b"END\r\n");
    other.call(
        b"set q 0 0 1\r\nb\r\nget q\r\n",
        b"STORED\r\nVALUE q 0 1\r\nb\r\nEND\r\n",
    );
    c.call(b"delete q/open\r\n", b"CLIENT_ERROR bad option\r\n");
    c.call(b"delete\r\n", b"CLIENT_ERROR bad command line format\r\n");
}

#[test]
fn flush_commands() {
    if common::embedded_only("flush_expired counts what it drops; on JetStream the servers drop expired items themselves and it answers 0") {
        return;
    }
    let (_dir, s) = server();
    let mut c = s.client();
    c.call(b"flush nothing\r\n", b"END\r\n");
    // Both readers exist before the items: each keeps them until it is done.
    c.call(b"get q.r\r\nget q\r\n", b"END\r\nEND\r\n");
    c.call(
        b"set q 0 0 1\r\na\r\nset q 0 0 1\r\nb\r\n",
        b"STORED\r\nSTORED\r\n",
    );
    c.call(b"flush q.r\r\n", b"END\r\n");
    c.call(b"get q.r\r\n", b"END\r\n");
    c.call(b"get q/peek\r\n", b"VALUE q/peek 0 1\r\na\r\nEND\r\n");
    c.call(b"flush q\r\n", b"END\r\n");
    c.call(b"get q\r\n", b"END\r\n");
    c.call(
        b"set a 0 0 1\r\na\r\nset b 0 0 1\r\nb\r\n",
        b"STORED\r\nSTORED\r\n",
    );
    c.call(b"flush_all\r\n", b"OK\r\n");
    c.call(b"flush_all 0 noreply\r\nget a b\r\n", b"END\r\n");
    c.call(
        b"flush_all 10\r\n",
        b"CLIENT_ERROR bad command line format\r\n",
    );
    c.call(
        b"set e 0 -1 1\r\nx\r\nset e 0 -1 1\r\ny\r\nset e 0 0 1\r\nz\r\n",
        b"STORED\r\nSTORED\r\nSTORED\r\n",
    );
    c.call(b"set f 0 -1 1\r\nx\r\n", b"STORED\r\n");
    c.call(b"flush_expired e\r\n", b"2\r\n");
    c.call(b"flush_expired none\r\n", b"0\r\n");
    // A queue only: expiry is for all its readers at once.
    c.call(
        b"flush_expired e.r\r\nflush_expired e+r\r\n",
        b"CLIENT_ERROR bad queue name\r\nCLIENT_ERROR bad queue name\r\n",
    );
    c.call(b"flush_all_expired\r\n", b"1\r\n");
    c.call(b"get e\r\n", b"VALUE e 0 1\r\nz\r\nEND\r\n");
}

#[test]
fn stats_and_dump_stats() {
    if common::embedded_only("per-queue bytes, age and logsize are the engine's; JetStream gives them per stream only (0 here)") {
        return;
    }
    let (_dir, s) = server();
    let mut c = s.client();
    c.call(
        b"set st 0 0 3\r\nabc\r\nset st 0 0 2\r\nde\r\nget st.r/open\r\n",
        b"STORED\r\nSTORED\r\nVALUE st.r/open 0 3\r\nabc\r\nEND\r\n",
    );
    c.send(b"stats\r\n");
    let stats = String::from_utf8(c.read_until(b"END\r\n")).unwrap();
    for line in [
        "STAT version weir-",
        "STAT curr_connections 1\r\n",
        "STAT cmd_set 2\r\n",
        "STAT queue_st_items 2\r\n",
        "STAT queue_st_bytes 5\r\n",
        "STAT queue_st_total_items 2\r\n",
        "STAT queue_st_expired_items 0\r\n",
        "STAT queue_st_discarded 0\r\n",
        "STAT queue_st_open_transactions 1\r\n",
        "STAT queue_st_waiters 0\r\n",
        "STAT queue_st_age ",
        "STAT queue_st_logsize ",
        "STAT queue_st+r_items 2\r\n",
        "STAT queue_st+r_open_transactions 1\r\n",
    ] {
        assert!(stats.contains(line), "{line:?} missing from\n{stats}");
    }
    assert!(
        stats.lines().all(|l| l.starts_with("STAT ") || l == "END"),
        "{stats}"
    );
    c.send(b"dump_stats st\r\n");
    let dump = String::from_utf8(c.read_until(b"END\r\n")).unwrap();
    assert!(
        dump.starts_with("queue 'st' {\r\n  items=2\r\n  bytes=5\r\n  total_items=2\r\n"),
        "{dump}"
    );
    assert!(
        dump.contains("}\r\nqueue 'st+r' {\r\n  items=2\r\n"),
        "{dump}"
    );
    assert!(dump.ends_with("}\r\nEND\r\n"), "{dump}");
    c.call(b"dump_stats nothere\r\n", b"END\r\n");
    // No names: every queue, in name order, each followed by its named readers.
    c.call(b"set a 0 0 1\r\nx\r\n", b"STORED\r\n");
    c.send(b"dump_stats\r\n");
    let all = String::from_utf8(c.read_until(b"\r\nEND\r\n")).unwrap();
    let blocks: Vec<&str> = all.lines().filter(|l| l.starts_with("queue ")).collect();
    assert_eq!(
        blocks,
        ["queue 'a' {", "queue 'st' {", "queue 'st+r' {"],
        "{all}"
    );
    assert!(all.starts_with("queue 'a' {\r\n  items=1\r\n"), "{all}");
    c.call(b"dump_stats a/b\r\n", b"CLIENT_ERROR bad queue name\r\n");
}

#[test]
fn monitor_and_confirm() {
    let (_dir, s) = server();
    let mut c = s.client();
    c.call(
        b"set m 0 0 1\r\n1\r\nset m 0 0 1\r\n2\r\nset m 0 0 1\r\n3\r\n",
        b"STORED\r\nSTORED\r\nSTORED\r\n",
    );
    c.call(
        b"monitor m 1 2\r\n",
        b"VALUE m 0 1\r\n1\r\nVALUE m 0 1\r\n2\r\nEND\r\n",
    );
    c.call(
        b"confirm m 3\r\n",
        b"CLIENT_ERROR not that many open items\r\n",
    );
    c.call(b"confirm m 1\r\n", b"END\r\n");
    // An item that arrives during the monitor is streamed at once.
    let addr = s.addr;
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        Client::connect(addr).call(b"set m 0 0 1\r\n4\r\n", b"STORED\r\n");
    });
    let started = Instant::now();
    c.call(
        b"monitor m 3\r\n",
        b"VALUE m 0 1\r\n3\r\nVALUE m 0 1\r\n4\r\n",
    );
    // Streamed when it came, long before the monitor ended.
    assert!(started.elapsed() < Duration::from_millis(2500));
    c.expect(b"END\r\n");
    writer.join().unwrap();
    // Unconfirmed leases ("2", "3", "4") go back when the connection ends.
    drop(c);
    let mut d = s.client();
    let mut seen = Vec::new();
    for _ in 0..50 {
        d.send(b"get m/peek\r\n");
        let reply = d.read_until(b"END\r\n");
        if reply.starts_with(b"VALUE") {
            seen = reply;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(seen, b"VALUE m/peek 0 1\r\n2\r\nEND\r\n");
    // On a reader: its own items and leases, the key echoed as sent.
    d.call(b"get n.r\r\nget n\r\n", b"END\r\nEND\r\n");
    d.call(
        b"set n 0 0 1\r\n5\r\nset n 0 0 1\r\n6\r\n",
        b"STORED\r\nSTORED\r\n",
    );
    d.call(
        b"monitor n.r 0 1\r\nmonitor n+r 0\r\n",
        b"VALUE n.r 0 1\r\n5\r\nEND\r\nVALUE n+r 0 1\r\n6\r\nEND\r\n",
    );
    d.call(b"get n.r/peek\r\n", b"END\r\n");
    d.call(
        b"confirm n.r 3\r\n",
        b"CLIENT_ERROR not that many open items\r\n",
    );
    d.call(b"confirm n+r 1\r\nget n.r/abort\r\n", b"END\r\nEND\r\n");
    d.call(b"get n+r\r\n", b"VALUE n+r 0 1\r\n6\r\nEND\r\n");
    // The default reader kept both.
    d.call(
        b"get n n n\r\n",
        b"VALUE n 0 1\r\n5\r\nVALUE n 0 1\r\n6\r\nEND\r\n",
    );
    d.call(
        b"monitor m x\r\n",
        b"CLIENT_ERROR bad command line format\r\n",
    );
    d.call(
        b"confirm m\r\n",
        b"CLIENT_ERROR bad command line format\r\n",
    );
}

#[test]
fn version_reload_shutdown_quit() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(dir.path(), "[server]\nopen_reads_max = 1\n");
    let mut s = Server::start(
        &dir.path().join("data"),
        &["--config", cfg.to_str().unwrap()],
    );
    let mut c = s.client();
    c.call(
        b"version\r\n",
        format!("VERSION weir-{}\r\n", env!("CARGO_PKG_VERSION")).as_bytes(),
    );
    c.call(b"shutdown\r\n", b"CLIENT_ERROR shutdown is disabled\r\n");
    c.call(
        b"set q 0 0 1\r\na\r\nset q 0 0 1\r\nb\r\nget q/open\r\n",
        b"STORED\r\nSTORED\r\nVALUE q/open 0 1\r\na\r\nEND\r\n",
    );
    c.call(
        b"get q/open\r\n",
        b"CLIENT_ERROR close current item first\r\n",
    );
    // A broken file changes nothing.
    std::fs::write(&cfg, "[server]\nopen_reads_max = \"many\"\n").unwrap();
    c.send(b"reload\r\n");
    let reply = c.read_until(b"\r\n");
    assert!(
        reply.starts_with(b"SERVER_ERROR reload failed: "),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    std::fs::write(
        &cfg,
        "[server]\nopen_reads_max = 2\nshutdown_enabled = true\n",
    )
    .unwrap();
    c.call(b"reload\r\n", b"Reloaded config.\r\n");
    c.call(b"get q/open\r\n", b"VALUE q/open 0 1\r\nb\r\nEND\r\n");
    // quit: the replies before it still go out.
    let mut d = s.client();
    d.send(b"version\r\nquit\r\nversion\r\n");
    d.expect(format!("VERSION weir-{}\r\n", env!("CARGO_PKG_VERSION")).as_bytes());
    d.expect_closed();
    c.send(b"shutdown\r\n");
    c.expect_closed();
    let status = s.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "{status:?}");
}

#[test]
fn unknown_commands_and_bad_lines() {
    let (_dir, s) = server();
    let mut c = s.client();
    c.call(b"bogus\r\n", b"ERROR\r\n");
    c.call(b"bogus with args\r\n", b"ERROR\r\n");
    c.call(b"\r\n", b"ERROR\r\n");
    c.call(b"get\r\n", b"CLIENT_ERROR bad command line format\r\n");
    c.call(b"get    \r\n", b"CLIENT_ERROR bad command line format\r\n");
    c.call(b"get ../etc\r\n", b"CLIENT_ERROR bad queue name\r\n");
    c.call(b"get \xff\xfe\r\n", b"CLIENT_ERROR bad queue name\r\n");
    let version = format!("VERSION weir-{}\r\n", env!("CARGO_PKG_VERSION"));
    // As memcached: what follows `version` is ignored.
    c.call(b"version extra\r\n", version.as_bytes());
    c.call(b"version\r\n", version.as_bytes());
    c.call(b"stats bogus\r\n", b"ERROR\r\n");
    c.call(b"quit now\r\n", b"");
    c.expect_closed();
}

/// Every memcache command that carries a data block is read whole, data included,
/// with one reply; the data never runs as commands (it once deleted queues).
#[test]
fn storage_commands_weir_does_not_do_never_run_their_data() {
    let (_dir, s) = server();
    let mut c = s.client();
    c.call(b"set victim 0 0 1\r\nv\r\n", b"STORED\r\n");
    let block = b"delete victim\r\n";
    for (line, reply) in [
        (
            &b"add k 0 0 15"[..],
            &b"CLIENT_ERROR add is not supported by a queue\r\n"[..],
        ),
        (
            b"replace k 0 0 15",
            b"CLIENT_ERROR replace is not supported by a queue\r\n",
        ),
        (
            b"append k 0 0 15",
            b"CLIENT_ERROR append is not supported by a queue\r\n",
        ),
        (
            b"prepend k 0 0 15",
            b"CLIENT_ERROR prepend is not supported by a queue\r\n",
        ),
        (
            b"cas k 0 0 15 42",
            b"CLIENT_ERROR cas is not supported by a queue\r\n",
        ),
        (
            b"ms k 15 T0",
            b"CLIENT_ERROR ms is not supported by a queue\r\n",
        ),
    ] {
        let mut request = line.to_vec();
        request.extend_from_slice(b"\r\n");
        request.extend_from_slice(block);
        request.extend_from_slice(b"\r\n");
        c.call(&request, reply);
        // With noreply: nothing at all, and the block still skipped.
        if !line.starts_with(b"ms") {
            let mut quiet = line.to_vec();
            quiet.extend_from_slice(b" noreply\r\n");
            quiet.extend_from_slice(block);
            quiet.extend_from_slice(b"\r\nget victim/peek\r\n");
            c.call(&quiet, b"VALUE victim/peek 0 1\r\nv\r\nEND\r\n");
        }
    }
    // Split across reads, the block arriving byte by byte.
    c.send(b"add k 0 0 15\r\n");
    for b in block.iter().chain(b"\r\n") {
        c.send(&[*b]);
    }
    c.expect(b"CLIENT_ERROR add is not supported by a queue\r\n");
    c.call(b"get victim\r\n", b"VALUE victim 0 1\r\nv\r\nEND\r\n");
    // No length to find the block by: one reply, then the connection closes.
    c.call(b"add k 0 0\r\n", b"CLIENT_ERROR bad data chunk\r\n");
    c.expect_closed();
    let mut c = s.client();
    let mut long = b"append ".to_vec();
    long.extend(std::iter::repeat_n(b'k', 70_000));
    long.extend_from_slice(b" 0 0 15\r\ndelete victim\r\n");
    c.call(&long, b"CLIENT_ERROR line too long\r\n");
    c.expect_closed();
    s.client().call(b"get victim\r\n", b"END\r\n");
}

#[test]
fn a_binary_request_gets_a_binary_error_and_a_close() {
    let (_dir, s) = server();
    let mut c = s.client();
    // A binary NOOP with opaque 0xdeadbeef, as memjs sends.
    let mut noop = vec![
        0x80, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef,
    ];
    noop.extend_from_slice(&[0u8; 8]);
    let text = b"weir speaks the memcache text protocol only";
    let mut reply = vec![0x81, 0x0a, 0, 0, 0, 0, 0x00, 0x81];
    reply.extend_from_slice(&(text.len() as u32).to_be_bytes());
    reply.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
    reply.extend_from_slice(&[0u8; 8]);
    reply.extend_from_slice(text);
    c.call(&noop, &reply);
    c.expect_closed();
    s.client().call(b"get q\r\n", b"END\r\n");
}

#[test]
fn flush_all_replies_kestrels_text_when_configured() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(dir.path(), "[server]\nflush_all_reply = \"kestrel\"\n");
    let s = Server::start(
        &dir.path().join("data"),
        &["--config", cfg.to_str().unwrap()],
    );
    let mut c = s.client();
    c.call(b"flush_all\r\n", b"Flushed all queues.\r\n");
    std::fs::write(&cfg, "[server]\nflush_all_reply = \"ok\"\n").unwrap();
    c.call(b"reload\r\nflush_all\r\n", b"Reloaded config.\r\nOK\r\n");
    std::fs::write(&cfg, "[server]\nflush_all_reply = \"yes\"\n").unwrap();
    c.send(b"reload\r\n");
    let reply = c.read_until(b"\r\n");
    assert!(
        reply.starts_with(b"SERVER_ERROR reload failed: "),
        "{}",
        String::from_utf8_lossy(&reply)
    );
}

#[test]
fn stats_settings_and_reset() {
    let (_dir, s) = server();
    let mut c = s.client();
    c.call(
        b"set q 0 0 1\r\na\r\nget q\r\nget q\r\n",
        b"STORED\r\nVALUE q 0 1\r\na\r\nEND\r\nEND\r\n",
    );
    let stats = c.stats();
    let counts = |s: &std::collections::HashMap<String, String>| {
        ["cmd_get", "get_hits", "get_misses", "cmd_set"].map(|k| s[k].clone())
    };
    assert_eq!(counts(&stats), ["2", "1", "1", "1"]);
    c.call(b"stats reset\r\n", b"RESET\r\n");
    let stats = c.stats();
    assert_eq!(counts(&stats), ["0", "0", "0", "0"]);
    // The queue's own counters are its state: kept.
    assert_eq!(stats["queue_q_total_items"], "1");
    let settings = c.stats_of(b"stats settings\r\n");
    assert_eq!(settings["maxconns"], "16384");
    assert_eq!(settings["line_bytes_max"], "65536");
    assert_eq!(settings["get_keys_max"], "1024");
    assert_eq!(settings["flush_all_reply"], "ok");
    if common::on_jetstream() {
        assert_eq!(settings["backend"], "jetstream");
    } else {
        assert_eq!(settings["max_queues"], "10000");
        assert_eq!(settings["backend"], "embedded");
    }
    // /metrics keeps counting across a reset: Prometheus counters only grow.
    let (_, metrics) = s.http_get("/metrics");
    assert!(metrics.contains("weir_get_hits_total 1"), "{metrics}");
}

#[test]
fn bad_numbers_skip_the_data_block() {
    let (_dir, s) = server();
    let mut c = s.client();
    let bad = b"CLIENT_ERROR bad command line format\r\n";
    c.call(b"set q x 0 3\r\nabc\r\n", bad);
    c.call(b"set q 0 x 3\r\nabc\r\n", bad);
    c.call(b"set q 4294967296 0 3\r\nabc\r\n", bad);
    c.call(b"set q -1 0 3\r\nabc\r\n", bad);
    c.call(b"set q 0 0 3 bogus\r\nabc\r\n", bad);
    c.call(b"set q 0 0 3 extra noreply\r\nabc\r\n", bad);
    // noreply silences the error too; the block is skipped either way.
    c.call(b"set q x 0 3 noreply\r\nabc\r\nget q\r\n", b"END\r\n");
    // The data block may contain a request: it is skipped, not run.
    c.call(
        b"set q x 0 7\r\nflush q\r\nget q\r\n",
        b"CLIENT_ERROR bad command line format\r\nEND\r\n",
    );
}

#[test]
fn negative_or_missing_length_closes() {
    let (_dir, s) = server();
    for line in [
        &b"set q 0 0 -1\r\n"[..],
        b"set q 0 0 abc\r\n",
        b"set q 0 0\r\n",
        b"set\r\n",
    ] {
        let mut c = s.client();
        c.call(line, b"CLIENT_ERROR bad data chunk\r\n");
        c.expect_closed();
    }
    s.client().call(b"get q\r\n", b"END\r\n");
}

#[test]
fn data_not_followed_by_crlf_closes() {
    let (_dir, s) = server();
    let mut c = s.client();
    c.call(
        b"set q 0 0 3\r\nabcdef\r\n",
        b"CLIENT_ERROR bad data chunk\r\n",
    );
    c.expect_closed();
    // Short data: the client sent fewer bytes than announced, then another request.
    let mut c = s.client();
    c.call(
        b"set q 0 0 9\r\nabc\r\nget q\r\n",
        b"CLIENT_ERROR bad data chunk\r\n",
    );
    c.expect_closed();
    // Missing \r\n, but a \r alone.
    let mut c = s.client();
    c.call(b"set q 0 0 3\r\nabc\rx", b"CLIENT_ERROR bad data chunk\r\n");
    c.expect_closed();
    s.client().call(b"get q\r\n", b"END\r\n");
}

#[test]
fn over_long_lines() {
    let (_dir, s) = server();
    let mut c = s.client();
    // 65536 bytes of line is fine (an unknown command here); 65537 is not.
    let mut ok = vec![b'x'; 65536];
    ok.extend_from_slice(b"\r\n");
    c.call(&ok, b"ERROR\r\n");
    let mut long = b"get ".to_vec();
    long.extend(std::iter::repeat_n(b'a', 70_000));
    long.extend_from_slice(b"\r\nversion\r\n");
    c.call(&long, b"CLIENT_ERROR line too long\r\n");
    c.expect(format!("VERSION weir-{}\r\n", env!("CARGO_PKG_VERSION")).as_bytes());
    // The end of a long line arriving later is skipped too.
    c.send(&vec![b'z'; 70_000]);
    c.expect(b"CLIENT_ERROR line too long\r\n");
    c.call(b"zzzz\r\nget q\r\n", b"END\r\n");
    // A long set line: its data block cannot be found, so the connection closes.
    let mut long_set = b"set ".to_vec();
    long_set.extend(std::iter::repeat_n(b'q', 70_000));
    long_set.extend_from_slice(b" 0 0 1\r\nx\r\n");
    c.call(&long_set, b"CLIENT_ERROR line too long\r\n");
    c.expect_closed();
}

#[test]
fn oversize_items_are_refused_and_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(
        dir.path(),
        "[server]\nitem_size_bytes_max = 1000\n[queues.\"small\"]\nitem_size_bytes_max = 10\n",
    );
    let s = Server::start(
        &dir.path().join("data"),
        &["--config", cfg.to_str().unwrap()],
    );
    let mut c = s.client();
    let mut req = b"set q 0 0 1001\r\n".to_vec();
    req.extend(std::iter::repeat_n(b'a', 1001));
    req.extend_from_slice(b"\r\nget q\r\n");
    c.call(&req, b"CLIENT_ERROR item too large\r\nEND\r\n");
    c.call(b"set q 0 0 1001 noreply\r\n", b"");
    c.send(&vec![b'b'; 1001]);
    c.call(b"\r\nget q\r\n", b"END\r\n");
    // The engine's per-queue limit.
    c.call(
        b"set small 0 0 11\r\nhello world\r\n",
        b"CLIENT_ERROR item too large\r\n",
    );
    c.call(b"set small 0 0 10\r\nhelloworld\r\n", b"STORED\r\n");
}

#[test]
fn full_queue_refuses_with_not_stored() {
    if common::embedded_only("per-queue max_items is refused with the jetstream backend") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(dir.path(), "[queues.\"tiny*\"]\nitems_max = 2\n");
    let s = Server::start(
        &dir.path().join("data"),
        &["--config", cfg.to_str().unwrap()],
    );
    let mut c = s.client();
    c.call(
        b"set tiny1 0 0 1\r\na\r\nset tiny1 0 0 1\r\nb\r\n",
        b"STORED\r\nSTORED\r\n",
    );
    c.call(b"set tiny1 0 0 1\r\nc\r\n", b"NOT_STORED\r\n");
    c.call(b"set other 0 0 1\r\nc\r\n", b"STORED\r\n");
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let (_dir, s) = server();
    let mut c = s.client();
    let mut req = Vec::new();
    let mut expected = Vec::new();
    for i in 0..200 {
        let v = format!("v{i}");
        req.extend_from_slice(format!("set p{} 0 0 {}\r\n{v}\r\n", i % 3, v.len()).as_bytes());
        expected.extend_from_slice(b"STORED\r\n");
    }
    for i in 0..200 {
        let v = format!("v{i}");
        req.extend_from_slice(format!("get p{}\r\n", i % 3).as_bytes());
        expected.extend_from_slice(
            format!("VALUE p{} 0 {}\r\n{v}\r\nEND\r\n", i % 3, v.len()).as_bytes(),
        );
    }
    req.extend_from_slice(b"bogus\r\nget p0\r\n");
    expected.extend_from_slice(b"ERROR\r\nEND\r\n");
    c.call(&req, &expected);
}

#[test]
fn requests_split_into_tiny_writes() {
    let (_dir, s) = server();
    let mut c = s.client();
    let req = b"set q 3 0 5\r\nhello\r\nget q.r/peek\r\nget q/open\r\nget q/close\r\nget q\r\n";
    for chunk in req.chunks(1) {
        c.send(chunk);
        std::thread::sleep(Duration::from_micros(300));
    }
    c.expect(b"STORED\r\nVALUE q.r/peek 3 5\r\nhello\r\nEND\r\nVALUE q/open 3 5\r\nhello\r\nEND\r\nEND\r\nEND\r\n");
    for chunk in b"set q 0 0 2\r\nab\r\nget q\r\n".chunks(3) {
        c.send(chunk);
        std::thread::sleep(Duration::from_millis(2));
    }
    c.expect(b"STORED\r\nVALUE q 0 2\r\nab\r\nEND\r\n");
}

#[test]
fn half_sent_request_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(dir.path(), "[server]\nrequest_timeout_ms = 300\n");
    let s = Server::start(
        &dir.path().join("data"),
        &["--config", cfg.to_str().unwrap()],
    );
    let mut c = s.client();
    c.send(b"set q 0 0 10\r\nabc");
    c.expect(b"CLIENT_ERROR request timed out\r\n");
    c.expect_closed();
    // An idle connection (nothing half-sent) is not timed out.
    let mut idle = s.client();
    idle.expect_silence(Duration::from_millis(600));
    idle.call(b"get q\r\n", b"END\r\n");
}

#[test]
fn connection_limit() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), &["--connections-max", "2"]);
    let mut a = s.client();
    let mut b = s.client();
    a.call(
        b"version\r\n",
        format!("VERSION weir-{}\r\n", env!("CARGO_PKG_VERSION")).as_bytes(),
    );
    b.call(b"get q\r\n", b"END\r\n");
    let mut c = s.client();
    c.expect(b"SERVER_ERROR too many connections\r\n");
    c.expect_closed();
    drop(a);
    // The slot is free once the server has seen `a` close: it counts `b` alone.
    let freed = common::wait_until(Duration::from_secs(5), || {
        b.stats().get("curr_connections").map(String::as_str) == Some("1")
    });
    assert!(freed, "a closed connection's slot was never freed");
    s.client().call(b"get q\r\n", b"END\r\n");
}

#[test]
fn http_health_and_metrics() {
    let (_dir, s) = server();
    let mut c = s.client();
    c.call(
        b"set mq 0 0 1\r\na\r\nget mq.r/open\r\n",
        b"STORED\r\nVALUE mq.r/open 0 1\r\na\r\nEND\r\n",
    );
    let (status, body) = s.http_get("/health");
    assert!(status.contains("200"), "{status}");
    assert_eq!(body, "ok\n");
    let (status, body) = s.http_get("/metrics");
    assert!(status.contains("200"), "{status}");
    for needle in [
        "weir_connections 1\n",
        "weir_commands_total{command=\"set\"} 1\n",
        "weir_commands_total{command=\"get\"} 1\n",
        "# TYPE weir_request_duration_seconds histogram\n",
        "weir_request_duration_seconds_count 2\n",
        "weir_queue_items{queue=\"mq\"} 1\n",
        "weir_queue_appended_total{queue=\"mq\"} 1\n",
        "weir_queue_open_leases{queue=\"mq\"} 1\n",
        "weir_reader_open_leases{queue=\"mq\",reader=\"r\"} 1\n",
        "weir_reader_taken_total{queue=\"mq\",reader=\"r\"} 1\n",
    ] {
        assert!(body.contains(needle), "{needle:?} missing from\n{body}");
    }
    let (status, _) = s.http_get("/nope");
    assert!(status.contains("404"), "{status}");
}

#[test]
fn help_explains_the_flags() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("serve"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--config",
        "--data-dir",
        "--listen",
        "--http-listen",
        "--log-level",
        "22133",
        "22134",
    ] {
        assert!(text.contains(flag), "{flag} missing from\n{text}");
    }
    // A bad config file is a clear error and a failing exit.
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(dir.path(), "[server]\nbogus = 1\n");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["serve", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bogus"));
}

#[test]
fn large_items_pipelined() {
    let (_dir, s) = server();
    let mut c = s.client();
    let mut req = Vec::new();
    let mut expected = Vec::new();
    let items: Vec<Vec<u8>> = (0..20u8)
        .map(|i| vec![b'a' + i; 100_000 + i as usize])
        .collect();
    for item in &items {
        req.extend_from_slice(format!("set big 0 0 {}\r\n", item.len()).as_bytes());
        req.extend_from_slice(item);
        req.extend_from_slice(b"\r\n");
        expected.extend_from_slice(b"STORED\r\n");
    }
    c.call(&req, &expected);
    let mut expected = Vec::new();
    for item in &items {
        expected.extend_from_slice(format!("VALUE big 0 {}\r\n", item.len()).as_bytes());
        expected.extend_from_slice(item);
        expected.extend_from_slice(b"\r\nEND\r\n");
    }
    c.call(&b"get big\r\n".repeat(items.len()), &expected);
    c.call(b"get big\r\n", b"END\r\n");
}

#[test]
fn one_get_of_many_large_items() {
    // 20 MiB of replies to one request: written between keys (past 256 KiB pending),
    // not built whole first. The bytes must come out exact and in order.
    let (_dir, s) = server();
    let mut c = s.client();
    let items: Vec<Vec<u8>> = (0..20u8)
        .map(|i| {
            (0..(1 << 20) + usize::from(i))
                .map(|j| (j as u8).wrapping_mul(31).wrapping_add(i))
                .collect()
        })
        .collect();
    for item in &items {
        let mut req = format!("set big 0 0 {}\r\n", item.len()).into_bytes();
        req.extend_from_slice(item);
        req.extend_from_slice(b"\r\n");
        c.call(&req, b"STORED\r\n");
    }
    c.call(b"set small 0 0 2\r\nok\r\n", b"STORED\r\n");
    let mut expected = Vec::new();
    for item in &items {
        expected.extend_from_slice(format!("VALUE big 0 {}\r\n", item.len()).as_bytes());
        expected.extend_from_slice(item);
        expected.extend_from_slice(b"\r\n");
    }
    expected.extend_from_slice(b"VALUE small 0 2\r\nok\r\nEND\r\n");
    let request = format!("get {}small\r\n", "big ".repeat(items.len()));
    c.call(request.as_bytes(), &expected);
    c.call(b"get big small\r\n", b"END\r\n");
}

#[test]
fn max_queues_caps_creation_not_use() {
    if common::embedded_only("max_queues is exact only on the engine") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(dir.path(), "[server]\nqueues_max = 3\n");
    let data = dir.path().join("data");
    let mut s = Server::start(&data, &["--config", cfg.to_str().unwrap()]);
    let mut c = s.client();
    c.call(
        b"set a 0 0 1\r\n1\r\nset b 0 0 1\r\n2\r\nget c\r\n",
        b"STORED\r\nSTORED\r\nEND\r\n",
    );
    // A fourth queue, by any command that would create one.
    const REFUSED: &[u8] = b"SERVER_ERROR too many queues\r\n";
    c.call(b"set d 0 0 1\r\nx\r\n", REFUSED);
    c.call(b"get d\r\n", REFUSED);
    c.call(b"get d.r/peek\r\n", REFUSED);
    c.call(b"gets d/open/t=10\r\n", REFUSED);
    c.call(b"monitor d 0\r\n", REFUSED);
    s.client().call(b"set d 0 0 1\r\nx\r\n", REFUSED);
    // In place of END, after the keys before it; a fanout set stores where it can.
    c.call(
        b"get a d\r\n",
        b"VALUE a 0 1\r\n1\r\nSERVER_ERROR too many queues\r\n",
    );
    c.call(b"set a+d 0 0 1\r\ny\r\n", REFUSED);
    // Existing queues, and new readers of them, keep working; looking creates nothing.
    c.call(
        b"get a.r/peek\r\nget a\r\n",
        b"VALUE a.r/peek 0 1\r\ny\r\nEND\r\nVALUE a 0 1\r\ny\r\nEND\r\n",
    );
    c.call(
        b"flush d\r\ndump_stats d\r\nflush_expired d\r\n",
        b"END\r\nEND\r\n0\r\n",
    );
    c.call(b"delete d\r\n", b"DELETED\r\n");
    // A deleted queue makes room.
    c.call(b"delete b\r\n", b"DELETED\r\n");
    c.call(
        b"set d 0 0 1\r\nz\r\nget d\r\n",
        b"STORED\r\nVALUE d 0 1\r\nz\r\nEND\r\n",
    );
    c.call(b"get e\r\n", REFUSED);
    // Reloadable.
    std::fs::write(&cfg, "[server]\nqueues_max = 4\n").unwrap();
    c.call(b"reload\r\n", b"Reloaded config.\r\n");
    c.call(
        b"get e\r\nget f\r\n",
        b"END\r\nSERVER_ERROR too many queues\r\n",
    );
    // Queues over a lowered cap are kept and usable after a restart.
    s.terminate(Duration::from_secs(10));
    std::fs::write(&cfg, "[server]\nqueues_max = 1\n").unwrap();
    let s = Server::start(&data, &["--config", cfg.to_str().unwrap()]);
    let mut c = s.client();
    c.call(
        b"set a 0 0 1\r\nw\r\nget a\r\nget e\r\n",
        b"STORED\r\nVALUE a 0 1\r\nw\r\nEND\r\nEND\r\n",
    );
    c.call(b"get g\r\n", REFUSED);
}

#[test]
fn reload_applies_queue_settings() {
    if common::embedded_only("per-queue max_items is refused with the jetstream backend") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(dir.path(), "[queues.\"capped\"]\nmax_items = 1\n");
    let s = Server::start(
        &dir.path().join("data"),
        &["--config", cfg.to_str().unwrap()],
    );
    let mut c = s.client();
    c.call(
        b"set capped 0 0 1\r\na\r\nset capped 0 0 1\r\nb\r\n",
        b"STORED\r\nNOT_STORED\r\n",
    );
    std::fs::write(&cfg, "[queues.\"capped\"]\nitems_max = 2\n").unwrap();
    c.call(b"reload\r\n", b"Reloaded config.\r\n");
    c.call(
        b"set capped 0 0 1\r\nb\r\nset capped 0 0 1\r\nc\r\n",
        b"STORED\r\nNOT_STORED\r\n",
    );
}
