//! Crash tests: a child process works on a store and is SIGKILLed at random moments;
//! after every kill the parent reopens the store and checks that every append that
//! had returned is there, no confirmed item comes back, items under lease come back
//! (in seq order), and the store keeps working.
//!
//! `buffered` durability may hold appends in the process (at most one staging buffer,
//! `STAGE_BYTES`), so there a kill may lose the newest acknowledged appends: the test
//! checks that what is lost is a suffix of them, no more than a buffer's worth, and
//! that everything else holds as above.
//!
//! The child is this test binary itself, run with `--exact crash_child`; the
//! `crash_child` test does nothing unless `WEIR_CRASH_DIR` is set. It writes one line
//! per action to stdout, flushed at once: an intention line before the call
//! (`#a ID LEN`, `#t`, ...) and an acknowledgement after it returned (`#A SEQ ID LEN`,
//! `#T SEQ`, ...). So the parent knows every acknowledged action and the one action
//! (at most) that was in flight at the kill.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

// `is_multiple_of` is newer than the crate's rust-version (1.85).
#![allow(unknown_lints, clippy::manual_is_multiple_of)]

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use weir::{AppendOptions, Durability, LeaseId, QueueConfig, Store, StoreOptions};

use common::{is_payload, payload};

const ENV_DIR: &str = "WEIR_CRASH_DIR";
const ENV_MODE: &str = "WEIR_CRASH_MODE";
const ENV_SEED: &str = "WEIR_CRASH_SEED";
const ENV_ROUND: &str = "WEIR_CRASH_ROUND";
const ENV_BATCHY: &str = "WEIR_CRASH_BATCHY";
const QUEUE: &str = "crash";
const ROUNDS_PER_MODE: u32 = 60;
/// The child gives up on its own after this long, in case the parent is gone.
const CHILD_LIFETIME_MAX: Duration = Duration::from_secs(20);
const SEGMENT_SIZE_BYTES: u64 = 16 * 1024;
const BUFFERED_SEGMENT_SIZE_BYTES: u64 = 4 * 1024 * 1024;
/// `buffered` children now and then append an item larger than the staging buffer,
/// which must be written before its append returns.
const BIG_ITEM_BYTES: std::ops::Range<usize> = 70 * 1024..100 * 1024;
const LEASES_HELD_MAX: usize = 4;
/// What `buffered` may hold in the process (the engine's staging buffer, mapfile.rs).
const STAGE_BYTES: usize = 64 * 1024;
/// Bytes of a record's header in a segment (frame.rs).
const RECORD_HEADER_BYTES: usize = 40;

fn options(mode: &str) -> StoreOptions {
    let durability = match mode {
        "synced" => Durability::Synced,
        "periodic" => Durability::default(),
        "buffered" => Durability::Buffered,
        other => panic!("unknown mode {other}"),
    };
    StoreOptions {
        defaults: QueueConfig {
            durability,
            // Sealing a segment writes what `buffered` staged: with small segments it
            // would never hold a full buffer at a kill.
            segment_size_bytes: if mode == "buffered" {
                BUFFERED_SEGMENT_SIZE_BYTES
            } else {
                SEGMENT_SIZE_BYTES
            },
            ..QueueConfig::default()
        },
        config_for: None,
        ..StoreOptions::default()
    }
}

// ---------------------------------------------------------------------------------
// The child.

/// Runs only as a child (when `WEIR_CRASH_DIR` is set); a no-op in a normal run.
#[test]
fn crash_child() {
    let Some(dir) = std::env::var_os(ENV_DIR) else {
        return;
    };
    let mode = std::env::var(ENV_MODE).expect("mode");
    let seed: u64 = std::env::var(ENV_SEED).expect("seed").parse().unwrap();
    let round: u64 = std::env::var(ENV_ROUND).expect("round").parse().unwrap();
    let batchy = std::env::var_os(ENV_BATCHY).is_some();
    child_main(Path::new(&dir), &mode, seed, round, batchy);
}

fn child_main(dir: &Path, mode: &str, seed: u64, round: u64, batchy: bool) {
    let mut out = std::io::stdout().lock();
    let mut say = |line: String| {
        // One write per line, flushed, so the parent sees every acknowledged action.
        out.write_all(format!("#{line}\n").as_bytes()).unwrap();
        out.flush().unwrap();
    };
    // The test harness may have printed "test crash_child ... " without a newline.
    say(String::new());
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let store = Store::open_with(dir, options(mode)).expect("child: open");
    let q = store.queue(QUEUE).expect("child: queue");
    let r = q.reader("").expect("child: reader");
    say("O".into());
    let mut next_id = round << 32;
    let mut held: Vec<(u64, LeaseId)> = Vec::new();
    let started = Instant::now();
    while started.elapsed() < CHILD_LIFETIME_MAX {
        let mut dice = rng.gen_range(0..100);
        if batchy && dice < 40 {
            dice = 45; // batches instead of single appends
        }
        if dice < 40 {
            let id = next_id;
            next_id += 1;
            let len = if rng.gen_bool(0.1) {
                0
            } else if mode == "buffered" && rng.gen_bool(0.01) {
                rng.gen_range(BIG_ITEM_BYTES)
            } else {
                rng.gen_range(1..700)
            };
            say(format!("a {id} {len}"));
            let seq = q
                .append(&payload(id, len), AppendOptions::default())
                .expect("child: append");
            say(format!("A {seq} {id} {len}"));
        } else if dice < 47 {
            let n = rng.gen_range(2..if batchy { 40 } else { 5 });
            let ids: Vec<(u64, usize)> = (0..n)
                .map(|_| {
                    next_id += 1;
                    (next_id - 1, rng.gen_range(0..300))
                })
                .collect();
            let list: Vec<String> = ids.iter().map(|(i, l)| format!("{i} {l}")).collect();
            say(format!("b {}", list.join(" ")));
            let data: Vec<Vec<u8>> = ids.iter().map(|&(i, l)| payload(i, l)).collect();
            let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
            let first = q
                .append_batch(&refs, AppendOptions::default())
                .expect("child: append_batch");
            say(format!("B {first} {}", list.join(" ")));
        } else if dice < 75 {
            say("t".into());
            match r.take().expect("child: take") {
                Some(item) => say(format!("T {}", item.seq)),
                None => say("T -".into()),
            }
        } else if dice < 88 {
            if held.len() >= LEASES_HELD_MAX {
                continue;
            }
            say("l".into());
            match r.take_leased().expect("child: take_leased") {
                Some(lease) => {
                    say(format!("L {}", lease.item.seq));
                    held.push((lease.item.seq, lease.id));
                }
                None => say("L -".into()),
            }
        } else {
            if held.is_empty() {
                continue;
            }
            let (seq, id) = held.swap_remove(rng.gen_range(0..held.len()));
            if rng.gen_bool(0.7) {
                say(format!("c {seq}"));
                assert!(r.confirm(id).expect("child: confirm"));
                say(format!("C {seq}"));
            } else {
                say(format!("r {seq}"));
                assert!(r.release(id).expect("child: release"));
                say(format!("R {seq}"));
            }
        }
    }
    std::process::exit(0);
}

// ---------------------------------------------------------------------------------
// The parent.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Pending,
    Leased,
    Confirmed,
}

#[derive(Clone, Debug)]
struct Known {
    id: u64,
    len: usize,
    state: State,
}

/// The one action that was in flight (intention written, no acknowledgement) at a kill.
#[derive(Debug)]
enum InFlight {
    None,
    Append(Vec<(u64, usize)>),
    Take,
    Confirm(u64),
    Other,
}

/// What the parent knows about the queue.
struct Ledger {
    mode: &'static str,
    items: BTreeMap<u64, Known>,
    last_acked_seq: u64,
    /// Whether a batch in flight at a kill must come back whole or not at all.
    strict_batches: bool,
    partial_batches: u64,
    acked_appends: u64,
    acked_confirms: u64,
    lost_in_flight: u64,
    /// Acknowledged appends lost by `buffered` at a kill (staged, not yet written).
    lost_staged: u64,
}

impl Ledger {
    fn lowest_pending(&self) -> Option<u64> {
        self.items
            .iter()
            .find(|(_, k)| k.state == State::Pending)
            .map(|(s, _)| *s)
    }

    fn pending(&self) -> usize {
        self.items
            .values()
            .filter(|k| k.state == State::Pending)
            .count()
    }

    fn set(&mut self, round: u32, seq: u64, from: State, to: State, line: &str) {
        let mode = self.mode;
        let known = self.items.get_mut(&seq).unwrap_or_else(|| {
            panic!("{mode} round {round}: the child got seq {seq}, an item never acknowledged ({line})")
        });
        assert_eq!(
            known.state, from,
            "{mode} round {round}: seq {seq} was {:?}, the child's `{line}` needs {from:?}",
            known.state
        );
        known.state = to;
    }

    /// Applies the child's output; returns the action in flight at the kill.
    fn apply(&mut self, round: u32, lines: &[String]) -> InFlight {
        let mode = self.mode;
        let mut in_flight = InFlight::None;
        for line in lines {
            let mut words = line.split_whitespace();
            let Some(tag) = words.next() else { continue };
            let nums: Vec<u64> = words.filter_map(|w| w.parse().ok()).collect();
            let none = line.ends_with(" -");
            match tag {
                "O" => {}
                "a" => in_flight = InFlight::Append(vec![(nums[0], nums[1] as usize)]),
                "b" => {
                    in_flight =
                        InFlight::Append(nums.chunks(2).map(|c| (c[0], c[1] as usize)).collect())
                }
                "t" => in_flight = InFlight::Take,
                "l" | "r" => in_flight = InFlight::Other,
                "c" => in_flight = InFlight::Confirm(nums[0]),
                "A" | "B" => {
                    let first = nums[0];
                    for (i, pair) in nums[1..].chunks(2).enumerate() {
                        let seq = first + i as u64;
                        assert!(
                            seq > self.last_acked_seq,
                            "{mode} round {round}: append got seq {seq}, not above the last \
                             acknowledged seq {} (`{line}`)",
                            self.last_acked_seq
                        );
                        self.last_acked_seq = seq;
                        self.items.insert(
                            seq,
                            Known {
                                id: pair[0],
                                len: pair[1] as usize,
                                state: State::Pending,
                            },
                        );
                        self.acked_appends += 1;
                    }
                    in_flight = InFlight::None;
                }
                "T" | "L" => {
                    let expected = self.lowest_pending();
                    let got = if none { None } else { Some(nums[0]) };
                    assert_eq!(
                        got, expected,
                        "{mode} round {round}: `{line}`: a take must hand out the lowest \
                         pending item"
                    );
                    if let Some(seq) = got {
                        if tag == "T" {
                            self.set(round, seq, State::Pending, State::Confirmed, line);
                            self.acked_confirms += 1;
                        } else {
                            self.set(round, seq, State::Pending, State::Leased, line);
                        }
                    }
                    in_flight = InFlight::None;
                }
                "C" => {
                    self.set(round, nums[0], State::Leased, State::Confirmed, line);
                    self.acked_confirms += 1;
                    in_flight = InFlight::None;
                }
                "R" => {
                    self.set(round, nums[0], State::Leased, State::Pending, line);
                    in_flight = InFlight::None;
                }
                _ => {}
            }
        }
        in_flight
    }

    /// Forgets the confirmed items below the lowest unconfirmed one.
    fn prune(&mut self) {
        let keep_from = self
            .items
            .iter()
            .find(|(_, k)| k.state != State::Confirmed)
            .map(|(s, _)| *s);
        match keep_from {
            Some(s) => self.items = self.items.split_off(&s),
            None => {
                // Keep the last one so that a reused seq is still noticed.
                if let Some((&last, _)) = self.items.iter().next_back() {
                    self.items = self.items.split_off(&last);
                }
            }
        }
    }
}

/// Kills and reaps the child if the parent panics while it runs.
struct ChildGuard(Option<Child>);

impl ChildGuard {
    fn kill_and_reap(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.0.take()?;
        // SAFETY: kill(2) on our own child's pid, which is not reaped yet.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGKILL);
        }
        child.wait().ok()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill_and_reap();
    }
}

fn spawn_child(dir: &Path, mode: &str, seed: u64, round: u32, batchy: bool) -> Child {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    if batchy {
        cmd.env(ENV_BATCHY, "1");
    }
    cmd.args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env(ENV_DIR, dir)
        .env(ENV_MODE, mode)
        .env(ENV_SEED, seed.to_string())
        .env(ENV_ROUND, round.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning the child")
}

/// Reads complete protocol lines (starting with '#') until EOF, sending each.
fn read_lines(stdout: impl std::io::Read, tx: mpsc::Sender<String>) {
    let mut reader = BufReader::new(stdout);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                if buf.last() != Some(&b'\n') {
                    return; // torn by the kill
                }
                let line = String::from_utf8_lossy(&buf[..buf.len() - 1]).to_string();
                if let Some(rest) = line.find('#').map(|i| line[i + 1..].to_string()) {
                    if tx.send(rest).is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Runs one child until a random moment, kills it, and returns its lines.
fn run_child_round(dir: &Path, mode: &str, seed: u64, round: u32, batchy: bool) -> Vec<String> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed);
    let mut child = spawn_child(dir, mode, seed, round, batchy);
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let mut guard = ChildGuard(Some(child));
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || read_lines(stdout, tx));
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    let mut lines = Vec::new();
    if rng.gen_bool(0.1) {
        // Sometimes kill early: during start-up or recovery.
        std::thread::sleep(Duration::from_micros(rng.gen_range(0..8_000)));
    } else {
        // Wait until the store is open, then let it work for a while.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    let open = line == "O";
                    lines.push(line);
                    if open {
                        break;
                    }
                }
                Err(_) => {
                    let status = guard.kill_and_reap();
                    let err = err_reader.join().unwrap_or_default();
                    panic!(
                        "{mode} round {round}: the child did not open the store within 10 s \
                         (status {status:?}); stderr:\n{err}"
                    );
                }
            }
        }
        // A synced append waits for an fsync: give those children longer.
        let run_max_us = if mode == "synced" { 150_000 } else { 40_000 };
        std::thread::sleep(Duration::from_micros(rng.gen_range(0..run_max_us)));
    }
    let status = guard.kill_and_reap().expect("reaped");
    reader.join().unwrap();
    lines.extend(rx.try_iter());
    let err = err_reader.join().unwrap_or_default();
    use std::os::unix::process::ExitStatusExt;
    assert!(
        status.signal() == Some(libc::SIGKILL),
        "{mode} round {round}: the child ended by itself ({status:?}) before the kill; \
         stderr:\n{err}"
    );
    lines
}

/// Reopens the store after a kill and checks it against the ledger.
fn verify(
    dir: &Path,
    mode: &str,
    ledger: &mut Ledger,
    in_flight: InFlight,
    round: u32,
    drain: bool,
) {
    // The item an in-flight take would have got (the lowest pending one while the
    // child's leases were still held), and a confirm in flight, may be gone.
    let may_be_gone: Option<u64> = match &in_flight {
        InFlight::Take => ledger.lowest_pending(),
        InFlight::Confirm(seq) => Some(*seq),
        _ => None,
    };
    for k in ledger.items.values_mut() {
        if k.state == State::Leased {
            k.state = State::Pending; // a restart releases every lease
        }
    }
    let store = Store::open_with(dir, options(mode))
        .unwrap_or_else(|e| panic!("{mode} round {round}: reopen after the kill: {e}"));
    let q = store.queue(QUEUE).unwrap();
    let r = q.reader("").unwrap();
    let mut delivered: Vec<(u64, LeaseId)> = Vec::new();
    let mut found_in_flight = Vec::new();
    while let Some(lease) = r
        .take_leased()
        .unwrap_or_else(|e| panic!("{mode} round {round}: take_leased after reopen: {e}"))
    {
        let seq = lease.item.seq;
        if let Some(&(last, _)) = delivered.last() {
            assert!(
                seq > last,
                "{mode} round {round}: after reopen seq {seq} came after {last}"
            );
        }
        match ledger.items.get(&seq) {
            Some(k) => {
                assert!(
                    k.state != State::Confirmed || may_be_gone == Some(seq),
                    "{mode} round {round}: confirmed item seq {seq} came back after the kill"
                );
                assert!(
                    is_payload(&lease.item.data, k.id, k.len),
                    "{mode} round {round}: seq {seq}: content differs from item id {} ({} bytes); \
                     got {} bytes",
                    k.id,
                    k.len,
                    lease.item.data.len()
                );
            }
            None => {
                // Only the append in flight at the kill may show up unannounced.
                let InFlight::Append(pairs) = &in_flight else {
                    panic!(
                        "{mode} round {round}: seq {seq} ({} bytes) is an item never acknowledged \
                         and not in flight",
                        lease.item.data.len()
                    );
                };
                // Two items of a batch may have the same content (two empty ones):
                // the next one in order is the first candidate.
                let next = found_in_flight.len();
                let matches = |&(id, len): &(u64, usize)| is_payload(&lease.item.data, id, len);
                let hit = match pairs.get(next) {
                    Some(pair) if matches(pair) => Some(next),
                    _ => pairs.iter().position(matches),
                };
                let Some(i) = hit else {
                    panic!(
                        "{mode} round {round}: seq {seq} ({} bytes) matches no acknowledged or \
                         in-flight append",
                        lease.item.data.len()
                    );
                };
                found_in_flight.push(i);
                ledger.last_acked_seq = ledger.last_acked_seq.max(seq);
                let (id, len) = pairs[i];
                ledger.items.insert(
                    seq,
                    Known {
                        id,
                        len,
                        state: State::Pending,
                    },
                );
            }
        }
        delivered.push((seq, lease.id));
    }
    if let InFlight::Append(pairs) = &in_flight {
        // What came back of a batch in flight is a prefix of it, in order; with
        // `strict_batches`, all of it or nothing.
        let n = found_in_flight.len();
        assert_eq!(
            found_in_flight,
            (0..n).collect::<Vec<_>>(),
            "{mode} round {round}: a batch in flight at the kill came back out of order"
        );
        assert!(
            !ledger.strict_batches || n == 0 || n == pairs.len(),
            "{mode} round {round}: a batch in flight at the kill came back in part: {n} of {} \
             items (append_batch promises all or none)",
            pairs.len()
        );
        if n == 0 {
            ledger.lost_in_flight += 1;
        } else if n < pairs.len() {
            ledger.partial_batches += 1;
        }
    }
    let delivered_seqs: std::collections::BTreeSet<u64> =
        delivered.iter().map(|(s, _)| *s).collect();
    let lost: Vec<u64> = ledger
        .items
        .iter()
        .filter(|(s, k)| k.state == State::Pending && !delivered_seqs.contains(s))
        .map(|(s, _)| *s)
        .collect();
    let lost: Vec<u64> = if mode == "buffered" {
        // Staged appends a kill may lose: only the newest (a suffix: everything older
        // was written to the file, which a killed process does not lose), at most one
        // staging buffer of them. Their seqs are free again: forget them.
        let newest_kept = delivered_seqs.iter().next_back().copied().unwrap_or(0);
        let staged: Vec<u64> = lost.iter().copied().filter(|&s| s > newest_kept).collect();
        let staged_bytes: usize = staged
            .iter()
            .map(|s| ledger.items[s].len + RECORD_HEADER_BYTES)
            .sum();
        assert!(
            staged_bytes <= STAGE_BYTES,
            "{mode} round {round}: the kill lost {} acknowledged appends of {staged_bytes} \
             bytes, more than one staging buffer ({STAGE_BYTES})",
            staged.len()
        );
        ledger.lost_staged += staged.len() as u64;
        for seq in &staged {
            ledger.items.remove(seq);
        }
        ledger.last_acked_seq = ledger
            .items
            .keys()
            .next_back()
            .copied()
            .unwrap_or(0)
            .max(newest_kept);
        lost.into_iter().filter(|&s| s <= newest_kept).collect()
    } else {
        lost
    };
    for seq in lost {
        assert!(
            may_be_gone == Some(seq),
            "{mode} round {round}: acknowledged, unconfirmed item seq {seq} is lost after the \
             kill (in flight: {in_flight:?})"
        );
        ledger.items.get_mut(&seq).unwrap().state = State::Confirmed;
    }
    if let Some(seq) = may_be_gone {
        if delivered_seqs.contains(&seq) {
            ledger.items.get_mut(&seq).unwrap().state = State::Pending;
        }
    }
    assert_eq!(
        q.stats().items as usize,
        ledger.pending(),
        "{mode} round {round}: stats.items after reopen"
    );
    // Release everything for the next child, or now and then drain the queue. Without
    // waiting for each return count's fsync under `synced` (thousands per round): the
    // counts are not what this test checks, and the close below syncs them.
    for (seq, id) in delivered {
        if drain {
            assert!(r.confirm(id).unwrap());
            ledger.items.get_mut(&seq).unwrap().state = State::Confirmed;
        } else {
            assert!(r.release_nowait(id).unwrap());
        }
    }
    ledger.prune();
    drop((q, r));
    store.close().unwrap();
}

/// `batchy`: the child mostly appends in batches (to test their atomicity).
fn crash_test(mode: &'static str, batchy: bool) {
    // One crash test at a time: a child spawned by one test inherits, between fork and
    // exec, the lock file descriptor of a store another test has open, and so holds
    // that store's flock for a moment.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let base_seed: u64 = std::env::var("WEIR_CRASH_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    println!("{mode}: seed {base_seed} (set WEIR_CRASH_TEST_SEED to repeat)");
    let mut ledger = Ledger {
        mode,
        items: BTreeMap::new(),
        last_acked_seq: 0,
        // `append_batch` promises all or none after a kill in every mode.
        strict_batches: true,
        partial_batches: 0,
        acked_appends: 0,
        acked_confirms: 0,
        lost_in_flight: 0,
        lost_staged: 0,
    };
    let started = Instant::now();
    let mut worked = 0;
    // `scripts/soak` runs more.
    let rounds: u32 = std::env::var("WEIR_CRASH_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(ROUNDS_PER_MODE);
    for round in 1..=rounds {
        let seed = base_seed.wrapping_add(round as u64 * 0x9e37_79b9);
        let lines = run_child_round(dir.path(), mode, seed, round, batchy);
        if lines.iter().any(|l| l == "O") {
            worked += 1;
        }
        let in_flight = ledger.apply(round, &lines);
        let ((), logs) = common::capture_logs(|| {
            verify(
                dir.path(),
                mode,
                &mut ledger,
                in_flight,
                round,
                round % 10 == 0,
            )
        });
        // What a kill leaves (a torn tail, a half-written header, a cut batch) is
        // normal and logged at WARN; ERROR is for damage, and a kill does none. Nor
        // does a kill leave what only an OS crash can (a page missing mid-segment).
        for line in logs.lines() {
            println!("{mode} round {round} log: {line}");
            assert!(
                !line.trim_start().starts_with("ERROR") && !line.contains("OS crash"),
                "{mode} round {round}: after a kill the engine logged {line:?}"
            );
        }
    }
    // The store still works after all that.
    let store = Store::open_with(dir.path(), options(mode)).unwrap();
    let q = store.queue(QUEUE).unwrap();
    let seq = q
        .append(b"after the crashes", AppendOptions::default())
        .unwrap();
    let r = q.reader("").unwrap();
    let mut last = None;
    while let Some(item) = r.take().unwrap() {
        last = Some(item);
    }
    let last = last.expect("the final item");
    assert_eq!((last.seq, &last.data[..]), (seq, &b"after the crashes"[..]));
    println!(
        "{mode}: {rounds} kills ({worked} after open) in {:?}: {} appends and {} \
         confirms acknowledged, {} in-flight appends lost, {} in-flight batches came back in \
         part, {} staged appends lost (buffered)",
        started.elapsed(),
        ledger.acked_appends,
        ledger.acked_confirms,
        ledger.lost_in_flight,
        ledger.partial_batches,
        ledger.lost_staged
    );
    assert!(
        ledger.acked_appends > 100 && ledger.acked_confirms > 20,
        "{mode}: the children did too little work to test anything"
    );
    if mode == "buffered" {
        // Kills land while appends are staged: the test saw the loss it allows.
        assert!(
            ledger.lost_staged > 0,
            "buffered: no kill lost a staged append; is staging on?"
        );
    }
}

#[test]
fn crash_synced() {
    if std::env::var_os(ENV_DIR).is_some() {
        return;
    }
    crash_test("synced", false);
}

#[test]
fn crash_periodic() {
    if std::env::var_os(ENV_DIR).is_some() {
        return;
    }
    crash_test("periodic", false);
}

#[test]
fn crash_buffered() {
    if std::env::var_os(ENV_DIR).is_some() {
        return;
    }
    crash_test("buffered", false);
}

#[test]
fn crash_batches_are_all_or_none_periodic() {
    if std::env::var_os(ENV_DIR).is_some() {
        return;
    }
    crash_test("periodic", true);
}

#[test]
fn crash_batches_are_all_or_none_synced() {
    if std::env::var_os(ENV_DIR).is_some() {
        return;
    }
    crash_test("synced", true);
}

#[test]
fn crash_batches_are_all_or_none_buffered() {
    if std::env::var_os(ENV_DIR).is_some() {
        return;
    }
    crash_test("buffered", true);
}
