//! Smoke test of the whole tool: `weir-bench all --quick` against a spawned memcached
//! (and a spawned weir when its binary is built), checking that every suite completed,
//! every operation got a valid reply and every file was written. It never judges
//! timings: a shared CI machine makes them meaningless here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false)
}

/// `WEIR_BIN`, else the `weir` that cargo built into the same target directory.
fn weir_binary(bench: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("WEIR_BIN") {
        return Some(PathBuf::from(p));
    }
    let beside = bench.parent()?.join("weir");
    beside.is_file().then_some(beside)
}

fn load(out: &Path, bench: &str) -> Value {
    for ext in ["json", "csv", "png"] {
        let path = out.join(format!("{bench}.{ext}"));
        let meta = std::fs::metadata(&path)
            .unwrap_or_else(|e| panic!("{} was not written: {e}", path.display()));
        assert!(meta.len() > 0, "{} is empty", path.display());
    }
    let text = std::fs::read_to_string(out.join(format!("{bench}.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn rows_of<'a>(v: &'a Value, target: &str) -> Vec<&'a Value> {
    v["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter(|r| r["target"] == target)
        .collect()
}

fn num(row: &Value, key: &str) -> u64 {
    row[key]
        .as_u64()
        .unwrap_or_else(|| panic!("row {row} has no integer {key}"))
}

#[test]
fn all_quick_against_spawned_servers() {
    assert!(
        on_path("memcached"),
        "memcached is not on PATH: the smoke test needs it as the reference server \
         (scripts/test installs it; by hand: apt-get install memcached)"
    );
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_weir-bench"));
    let out = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(&bench);
    cmd.args(["all", "--quick", "--out"]).arg(out.path());
    let weir = weir_binary(&bench);
    if let Some(w) = &weir {
        cmd.args(["--spawn", "weir", "--weir-bin"]).arg(w);
    } else {
        assert!(
            std::env::var("WEIR_SUITE_STRICT").as_deref() != Ok("1"),
            "no weir binary beside weir-bench and no WEIR_BIN: WEIR_SUITE_STRICT=1 \
             (scripts/test) does not allow testing memcached only"
        );
        eprintln!("note: no weir binary beside weir-bench and no WEIR_BIN: testing memcached only");
    }
    cmd.args(["--spawn", "memcached"]);
    let output = cmd.output().expect("running weir-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "weir-bench all --quick failed ({}).\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let mut targets = vec!["memcached"];
    if weir.is_some() {
        targets.push("weir");
    }

    // flood: every step ran its full count of operations on every target.
    let flood = load(out.path(), "flood");
    for t in &targets {
        let rows = rows_of(&flood, t);
        assert_eq!(rows.len(), 4, "flood rows for {t}: {rows:?}");
        for r in rows {
            assert_eq!(num(r, "ops"), 40_000, "flood row {r}");
            assert!(r["ops/s"].as_f64().unwrap_or(0.0) > 0.0, "flood row {r}");
        }
    }

    // packing suites: every step measured; on a queue server the backlog matches
    // the step and no get missed.
    for (name, steps) in [("packing", 3), ("packing-unpacking", 7)] {
        let v = load(out.path(), name);
        for t in &targets {
            let rows = rows_of(&v, t);
            assert_eq!(rows.len(), steps, "{name} rows for {t}");
            for r in rows {
                assert_eq!(num(r, "ops"), 10_000, "{name} row {r}");
                if *t == "weir" {
                    assert_eq!(num(r, "misses"), 0, "{name} row {r}");
                    assert_eq!(num(r, "items_before"), num(r, "backlog"), "{name} row {r}");
                }
            }
        }
    }

    // mem-rss: idle + 5 steps with an RSS each; a queue server returns every item.
    let rss = load(out.path(), "mem-rss");
    for t in &targets {
        let rows = rows_of(&rss, t);
        assert_eq!(rows.len(), 6, "mem-rss rows for {t}");
        for r in &rows {
            assert!(num(r, "rss_bytes") > 0, "mem-rss row {r}");
        }
        if *t == "weir" {
            for r in &rows[1..] {
                assert_eq!(num(r, "hits"), num(r, "items"), "mem-rss row {r}");
            }
        }
    }

    // library: every case produced a positive rate.
    let lib = load(out.path(), "library");
    let rows = lib["rows"].as_array().expect("library rows");
    assert!(rows.len() >= 13, "library rows: {rows:?}");
    for r in rows {
        assert!(r["rate"].as_f64().unwrap_or(0.0) > 0.0, "library row {r}");
    }

    // queues (weir only): every measure, with a value; memcached is skipped.
    if weir.is_some() {
        let text = std::fs::read_to_string(out.path().join("queues.json")).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        let rows = rows_of(&v, "weir");
        let measures: Vec<&str> = rows.iter().filter_map(|r| r["measure"].as_str()).collect();
        assert_eq!(
            measures,
            [
                "setup",
                "settle",
                "idle CPU",
                "stats",
                "flush_all_expired",
                "flush_all"
            ]
        );
        for r in &rows {
            assert!(r["value"].as_f64().is_some(), "queues row {r}");
        }
        let stats = rows.iter().find(|r| r["measure"] == "stats").unwrap();
        assert!(
            num(stats, "reply_bytes") > 300 * 9 * 20,
            "stats reply: {stats}"
        );
        assert!(rows_of(&v, "memcached").is_empty());
    }

    // beanstalk: on the spawned beanstalkd servers (and weir's door, with weir) when
    // beanstalkd is installed, every step done in full; otherwise the step says it was
    // skipped.
    if on_path("beanstalkd") || Path::new("/usr/bin/beanstalkd").is_file() {
        check_beanstalk(out.path(), weir.is_some());
    } else {
        assert!(
            stdout.contains("beanstalk: skipped"),
            "no beanstalkd, yet no skip note:\n{stdout}"
        );
        eprintln!("note: beanstalkd is not installed: the beanstalk step was skipped");
    }

    for title in [
        "flood",
        "packing",
        "packing-unpacking",
        "resident memory",
        "library",
    ] {
        assert!(
            stdout.contains(title),
            "no {title} table on stdout:\n{stdout}"
        );
    }
}

/// The files of `all --quick`'s beanstalk step on the three spawned beanstalkd modes
/// and, with `weir`, weir's door in two.
fn check_beanstalk(out: &Path, weir: bool) {
    let mut kinds = vec!["beanstalkd-f1000", "beanstalkd-f0", "beanstalkd-nobinlog"];
    let mut with_files = vec!["beanstalkd-f1000"];
    if weir {
        kinds.extend(["weir-periodic", "weir-synced"]);
        with_files.push("weir-periodic");
    }
    let rounds = load(out, "beanstalk");
    for &t in &kinds {
        let rows = rows_of(&rounds, t);
        assert_eq!(rows.len(), 2, "beanstalk rows for {t}: {rows:?}");
        for r in rows {
            assert!(
                r["ops/s"].as_f64().unwrap_or(0.0) > 0.0,
                "beanstalk row {r}"
            );
        }
    }
    let rss = load(out, "beanstalk-rss");
    let mut in_memory = with_files.clone();
    in_memory.push("beanstalkd-nobinlog");
    for &t in &in_memory {
        let rows = rows_of(&rss, t);
        let states: Vec<&str> = rows.iter().filter_map(|r| r["state"].as_str()).collect();
        assert_eq!(
            states,
            ["10000 ready", "10000 delayed"],
            "beanstalk-rss for {t}"
        );
        for r in rows {
            assert!(num(r, "rss_bytes") > 0, "beanstalk-rss row {r}");
        }
    }
    let text = std::fs::read_to_string(out.join("beanstalk-restart.json")).unwrap();
    let restart: Value = serde_json::from_str(&text).unwrap();
    for &t in &with_files {
        let rows = rows_of(&restart, t);
        assert_eq!(rows.len(), 2, "beanstalk-restart rows of {t}: {restart}");
        for r in rows {
            assert!(
                r["jobs_back_s"].as_f64().is_some(),
                "beanstalk-restart row {r}"
            );
        }
    }
}

#[test]
fn bus_quick_delivers_every_event() {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_weir-bench"));
    let Some(weir) = weir_binary(&bench) else {
        panic!("the weir binary is not built beside weir-bench (cargo build -p weir-server) and WEIR_BIN is not set");
    };
    let out = tempfile::tempdir().unwrap();
    let status = Command::new(&bench)
        .args([
            "bus",
            "--quick",
            "--bus-ingest-events",
            "2000",
            "--bus-scale-events",
            "2000",
        ])
        .args(["--bus-rss-steps", "1000,5000", "--bus-batch-seconds", "1"])
        .arg("--weir-bin")
        .arg(&weir)
        .arg("--out")
        .arg(out.path())
        .status()
        .unwrap();
    assert!(status.success(), "weir-bench bus --quick failed: {status}");
    let ingest = &load_data(out.path(), "bus-ingest");
    assert_eq!(rows_of(ingest, "weir").len(), 1);
    assert_eq!(rows_of(ingest, "bare-http").len(), 1);
    let scale = &load_data(out.path(), "bus-scale");
    let row = &scale["rows"][0];
    assert_eq!(
        num(row, "received"),
        num(row, "events"),
        "every event delivered"
    );
    let latency = load(out.path(), "bus-latency");
    for r in latency["rows"].as_array().unwrap() {
        assert_eq!(num(r, "received"), num(r, "events"), "{r}");
    }
    let rss = load(out.path(), "bus-rss");
    let queued: Vec<u64> = rows_of(&rss, "weir")
        .iter()
        .map(|r| num(r, "queued"))
        .collect();
    assert_eq!(queued, [0, 1000, 5000]);
}

/// A report that has no chart: its JSON and CSV.
fn load_data(out: &Path, bench: &str) -> Value {
    for ext in ["json", "csv"] {
        let path = out.join(format!("{bench}.{ext}"));
        assert!(
            std::fs::metadata(&path).is_ok_and(|m| m.len() > 0),
            "{} missing or empty",
            path.display()
        );
    }
    serde_json::from_str(&std::fs::read_to_string(out.join(format!("{bench}.json"))).unwrap())
        .unwrap()
}

#[test]
fn proxy_quick_forwards_and_replays() {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_weir-bench"));
    let Some(weir) = weir_binary(&bench) else {
        panic!("the weir binary is not built beside weir-bench (cargo build -p weir-server) and WEIR_BIN is not set");
    };
    let out = tempfile::tempdir().unwrap();
    let status = Command::new(&bench)
        .args([
            "proxy",
            "--quick",
            "--no-nginx",
            "--proxy-seconds",
            "1",
            "--proxy-throughput-seconds",
            "1",
            "--proxy-soak-seconds",
            "2",
        ])
        .arg("--weir-bin")
        .arg(&weir)
        .arg("--out")
        .arg(out.path())
        .status()
        .unwrap();
    assert!(
        status.success(),
        "weir-bench proxy --quick failed: {status}"
    );
    let latency = load(out.path(), "proxy-latency");
    let weir_rows = rows_of(&latency, "weir");
    assert_eq!(weir_rows.len(), 4, "four suites");
    for r in weir_rows {
        assert_eq!(num(r, "ok"), num(r, "sent"), "every request answered: {r}");
    }
    assert_eq!(rows_of(&latency, "direct").len(), 1);
    let cost = load_data(out.path(), "proxy-replay-cost");
    for target in ["weir", "weir+replay", "direct"] {
        let rows = rows_of(&cost, target);
        assert_eq!(rows.len(), 1, "one round of {target}");
        assert!(num(rows[0], "ok") > 0, "{target} answered");
    }
    let throughput = load_data(out.path(), "proxy-throughput");
    assert!(num(rows_of(&throughput, "weir")[0], "ok") > 0);
    let rss = load(out.path(), "proxy-rss");
    assert_eq!(rows_of(&rss, "weir").len(), 11);
}

/// `cluster --quick` on its own 3-node NATS cluster, doors on the embedded engine
/// (`WEIR_CLUSTER_BACKEND=jetstream` for the JetStream backend): every step measured,
/// every file written. Skipped when the NATS tools are not installed
/// (scripts/nats-install); client ports 26322..26324 (`WEIR_CLUSTER_BASE`).
#[test]
fn cluster_quick_measures_every_step() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tools = std::env::var_os("WEIR_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join(".tools/bin"));
    if !tools.join("nats-server").is_file() || !tools.join("nats").is_file() {
        eprintln!(
            "note: no nats-server/nats in {}: skipping (scripts/nats-install)",
            tools.display()
        );
        return;
    }
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_weir-bench"));
    let Some(weir) = weir_binary(&bench) else {
        panic!("the weir binary is not built beside weir-bench (cargo build -p weir-server) and WEIR_BIN is not set");
    };
    let backend = std::env::var("WEIR_CLUSTER_BACKEND").unwrap_or_else(|_| "embedded".into());
    let base = std::env::var("WEIR_CLUSTER_BASE").unwrap_or_else(|_| "26322".into());
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(&bench)
        .args([
            "cluster",
            "--quick",
            "--cluster-connections",
            "10",
            "--cluster-msgs",
            "300",
        ])
        .args(["--failover-load-seconds", "0.5", "--nats-base", &base])
        .args(["--cluster-weir-backend", &backend, "--repo"])
        .arg(&repo)
        .arg("--weir-bin")
        .arg(&weir)
        .arg("--out")
        .arg(out.path())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "weir-bench cluster --quick failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let flood = load_data(out.path(), "cluster-flood");
    for target in ["weir", "weir-2doors", "nats"] {
        let rows = rows_of(&flood, target);
        assert_eq!(rows.len(), 1, "one {target} step");
        assert!(
            rows[0]["items/s"].as_f64().unwrap_or(0.0) > 0.0,
            "{}",
            rows[0]
        );
    }
    let summary = load_data(out.path(), "cluster");
    assert!(
        summary["rows"][0]["weir/nats"].as_f64().is_some(),
        "{summary}"
    );
    let failover = load_data(out.path(), "cluster-failover");
    for writer in ["weir", "nats"] {
        let rows: Vec<&Value> = failover["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["writer"] == writer)
            .collect();
        assert_eq!(rows.len(), 1, "one {writer} failover round");
        assert!(
            rows[0]["gap_s"].as_f64().unwrap_or(0.0) > 0.0,
            "{}",
            rows[0]
        );
    }
    for file in ["cluster.md", "cluster-flood.png", "cluster-failover.png"] {
        assert!(out.path().join(file).is_file(), "{file} written");
    }
}
