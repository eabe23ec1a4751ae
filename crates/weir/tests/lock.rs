//! One process owns a data directory at a time, whatever happens to the `LOCK` file:
//! a second process is refused while the first has the store open, also after `LOCK`
//! was deleted or replaced, and gets in once the first closes. The second process is
//! this test binary run again with [`CHILD_ENV`] set (see `child_process_entry`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // tests: a failure is a panic

use std::path::Path;
use std::process::Command;

use weir::Store;

/// Set in the child: the directory it tries to open.
const CHILD_ENV: &str = "WEIR_TEST_LOCK_CHILD_DIR";

/// In the child: open the directory named by [`CHILD_ENV`] and say what happened. A
/// no-op in a normal test run.
#[test]
fn child_process_entry() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    match Store::open(&dir) {
        Ok(store) => {
            println!("CHILD: opened");
            store.close().expect("closing in the child");
        }
        Err(e) => println!("CHILD: {:?}", e.kind()),
    }
}

/// What a second process gets when it opens `dir`: "opened" or the error kind.
fn open_in_another_process(dir: &Path) -> String {
    let exe = std::env::current_exe().expect("current_exe");
    let out = Command::new(exe)
        .args([
            "--exact",
            "child_process_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir)
        .output()
        .expect("running the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.split_once("CHILD: ").map(|(_, said)| said))
        .unwrap_or_else(|| {
            panic!(
                "the child said nothing: {stdout} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .to_string()
}

#[test]
fn another_process_is_locked_out_even_when_the_lock_file_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store
        .queue("q")
        .unwrap()
        .append(b"first", Default::default())
        .unwrap();
    assert_eq!(open_in_another_process(dir.path()), "Locked");

    let lock = dir.path().join("LOCK");
    std::fs::remove_file(&lock).unwrap();
    assert_eq!(
        open_in_another_process(dir.path()),
        "Locked",
        "LOCK deleted while the store is open"
    );
    std::fs::write(&lock, b"").unwrap();
    assert_eq!(
        open_in_another_process(dir.path()),
        "Locked",
        "LOCK replaced by a new file"
    );

    // The first owner still works, and nobody else wrote the directory.
    let q = store.queue("q").unwrap();
    q.append(b"second", Default::default()).unwrap();
    drop(q);
    store.close().unwrap();
    assert_eq!(open_in_another_process(dir.path()), "opened");
    let store = Store::open(dir.path()).unwrap();
    let r = store.queue("q").unwrap().reader("").unwrap();
    let got: Vec<Vec<u8>> = std::iter::from_fn(|| r.take().unwrap())
        .map(|i| i.data.to_vec())
        .collect();
    assert_eq!(got, [b"first".to_vec(), b"second".to_vec()]);
}
