//! Jobs across a killed process: a child puts jobs of many priorities, some delayed,
//! reserves, buries, releases with another priority or a delay, kicks and deletes,
//! reporting each operation once it returned, and is killed (SIGKILL) at a random
//! point. Reopened, every job it reported put and not deleted is still there (in
//! some state), no reported delete comes back, and every job the store holds is one
//! the child put. Moves may leave a job twice (same id), never lose one.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure is a panic

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use weir::Store;

const ENV_DIR: &str = "WEIR_JOBS_CHILD_DIR";
const ENV_SEED: &str = "WEIR_JOBS_CHILD_SEED";
const TTR: Duration = Duration::from_secs(300);

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Runs only as a child (when `WEIR_JOBS_CHILD_DIR` is set); a no-op in a normal run.
#[test]
fn jobs_child() {
    let Some(dir) = std::env::var_os(ENV_DIR) else {
        return;
    };
    let seed = std::env::var(ENV_SEED)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let store = Store::open(Path::new(&dir)).unwrap();
    let jobs = store.jobs();
    let tube = jobs.tube("crash").unwrap();
    let mut rng = Rng(seed);
    let mut out = std::io::stdout().lock();
    use std::io::Write;
    loop {
        let priority = [0u32, 5, 1024, 9000][rng.below(4) as usize];
        let delay = if rng.below(4) == 0 {
            Duration::from_millis(rng.below(3000))
        } else {
            Duration::ZERO
        };
        let id = tube.put_delayed(b"job", priority, TTR, delay).unwrap();
        writeln!(out, "put {id}").unwrap();
        out.flush().unwrap();
        let Some(r) = tube.reserve_now().unwrap() else {
            continue;
        };
        match rng.below(5) {
            0 => {
                // Said first: a kill during the delete may or may not have deleted it.
                writeln!(out, "deleting {}", r.job.id).unwrap();
                out.flush().unwrap();
                assert!(tube.delete(&r).unwrap());
                writeln!(out, "deleted {}", r.job.id).unwrap();
            }
            1 => {
                tube.bury(&r).unwrap();
            }
            2 => {
                tube.release(&r, [1u32, 1024, 7][rng.below(3) as usize])
                    .unwrap();
            }
            3 => {
                tube.release_delayed(&r, 2, Duration::from_millis(rng.below(500)))
                    .unwrap();
            }
            _ => {
                tube.kick(rng.below(3)).unwrap();
            }
        }
        out.flush().unwrap();
    }
}

/// What the child said: jobs put, jobs whose delete began, jobs whose delete returned.
struct Said {
    put: HashSet<u64>,
    deleting: HashSet<u64>,
    deleted: HashSet<u64>,
}

fn run_and_kill(dir: &Path, seed: u64, lines: usize) -> Said {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args(["--exact", "jobs_child", "--nocapture", "--test-threads=1"])
        .env(ENV_DIR, dir)
        .env(ENV_SEED, seed.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut said = Said {
        put: HashSet::new(),
        deleting: HashSet::new(),
        deleted: HashSet::new(),
    };
    let reading = BufReader::new(stdout).lines();
    let mut seen = 0;
    // After `lines` lines the child is killed; what it wrote before that is still in
    // the pipe, and read to the end: each line is an operation that returned.
    for line in reading {
        seen += 1;
        if seen == lines {
            child.kill().unwrap();
        }
        let Ok(line) = line else {
            break;
        };
        // The test harness's own words may share the first line: the last two count.
        let mut words = line.split_whitespace().rev();
        let (Some(id), Some(what)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(id) = id.parse::<u64>() else { continue };
        match what {
            "put" => said.put.insert(id),
            "deleting" => said.deleting.insert(id),
            "deleted" => said.deleted.insert(id),
            _ => false,
        };
    }
    if seen < lines {
        let _ = child.kill();
    }
    child.wait().unwrap();
    said
}

#[test]
fn a_killed_process_loses_no_job_and_brings_back_no_deleted_one() {
    for (seed, lines) in [(7u64, 400usize), (99, 1500), (2024, 3000)] {
        let dir = tempfile::tempdir().unwrap();
        let Said {
            put,
            deleting,
            deleted,
        } = run_and_kill(dir.path(), seed, lines);
        assert!(put.len() > 100, "the child ran: {}", put.len());
        // Kept for sure: put, and no delete begun.
        let kept: HashSet<u64> = put.difference(&deleting).copied().collect();
        let store = Store::open(dir.path()).unwrap();
        let jobs = store.jobs();
        for id in &kept {
            assert!(
                jobs.find(*id).unwrap().is_some(),
                "seed {seed}: job {id} lost"
            );
        }
        for id in &deleted {
            assert!(
                jobs.find(*id).unwrap().is_none(),
                "seed {seed}: deleted job {id} is back"
            );
        }
        // Everything still held comes out: kicked from buried and delayed, then reserved.
        let tube = jobs.tube("crash").unwrap();
        while tube.kick(u64::MAX).unwrap() > 0 {}
        let mut seen = HashSet::new();
        while let Some(r) = tube.reserve_now().unwrap() {
            assert!(
                put.contains(&r.job.id),
                "seed {seed}: a job nobody put: {}",
                r.job.id
            );
            assert!(
                !deleted.contains(&r.job.id),
                "seed {seed}: deleted job {} reserved",
                r.job.id
            );
            seen.insert(r.job.id);
            assert!(tube.delete(&r).unwrap());
        }
        // What the child held reserved at the kill came back too (its lease ended).
        let lost: Vec<&u64> = kept.iter().filter(|id| !seen.contains(id)).collect();
        assert!(
            lost.is_empty(),
            "seed {seed}: never reserved again: {lost:?}"
        );
    }
}
