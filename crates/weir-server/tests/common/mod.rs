//! Test harness: the real `weir` binary on a free loopback port with its own data
//! directory, and a raw memcache client that checks replies byte for byte.
//!
//! The server is started with `--listen 127.0.0.1:0` and its "listening" log line
//! tells the real ports, so tests never race for a port. Dropping a `Server` kills
//! the process; the data directory is a `TempDir` the test owns (so a test can
//! restart a server on the same directory).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Server {
    child: Option<Child>,
    pub addr: SocketAddr,
    pub http: SocketAddr,
    pub data_dir: PathBuf,
    log: Arc<Mutex<String>>,
}

/// With `WEIR_TEST_BACKEND=jetstream` (scripts/test's JetStream pass): the cluster's
/// URLs and a stream for this data directory (kept across restarts on it, as the
/// directory is; the whole cluster is discarded at the end of the run).
pub fn jetstream_for(data_dir: &Path) -> Option<(String, String)> {
    if std::env::var("WEIR_TEST_BACKEND").ok()? != "jetstream" {
        return None;
    }
    let urls = std::env::var("WEIR_TEST_NATS_URLS").expect("WEIR_TEST_NATS_URLS");
    // FNV-1a of the directory's path: stable, and distinct per test directory.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data_dir.as_os_str().as_encoded_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    Some((urls, format!("RT{h:016x}")))
}

/// Whether the servers of this run keep their queues on JetStream.
pub fn on_jetstream() -> bool {
    std::env::var("WEIR_TEST_BACKEND").is_ok_and(|b| b == "jetstream")
}

/// Whether this run is on JetStream; a test that needs the embedded engine returns
/// early then, saying why (scripts/test runs it in the embedded pass).
pub fn embedded_only(reason: &str) -> bool {
    let on = on_jetstream();
    if on {
        eprintln!("embedded only, left out on JetStream: {reason}");
    }
    on
}

impl Server {
    /// Starts `weir serve` on `data_dir` with extra flags.
    pub fn start(data_dir: &Path, extra: &[&str]) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_weir"));
        if let Some((urls, stream)) = jetstream_for(data_dir) {
            command
                .env("WEIR_BACKEND", "jetstream")
                .env("WEIR_NATS_SERVERS", urls)
                .env("WEIR_NATS_STREAM", stream);
        }
        let mut child = command
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--http-listen",
                "127.0.0.1:0",
            ])
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--log-level", "info"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning weir");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains("listening") {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(line.clone());
                    }
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let line = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("weir did not start; log:\n{}", log.lock().unwrap());
            }
        };
        let field = |name: &str| -> SocketAddr {
            let start = line.find(&format!("{name}=")).expect("address in log") + name.len() + 1;
            let rest = &line[start..];
            let end = rest.find(' ').unwrap_or(rest.len());
            rest[..end].parse().expect("socket address")
        };
        Server {
            addr: field("memcache"),
            http: field("http"),
            child: Some(child),
            data_dir: data_dir.to_path_buf(),
            log,
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr)
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    /// kill -9, and wait for the process to be gone.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then wait up to `limit` for the exit.
    pub fn terminate(&mut self, limit: Duration) -> ExitStatus {
        // SAFETY: sends a signal to our own child.
        unsafe {
            libc::kill(self.pid(), libc::SIGTERM);
        }
        self.wait_exit(limit)
    }

    /// Waits up to `limit` for the process to exit on its own.
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("weir did not exit within {limit:?}; log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// GET `path` on the HTTP port; returns (status line, body).
    pub fn http_get(&self, path: &str) -> (String, String) {
        let mut s = TcpStream::connect(self.http).expect("http connect");
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        (
            head.lines().next().unwrap_or("").to_string(),
            body.to_string(),
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A raw memcache connection. Bytes read past what a check needed are kept for the
/// next check.
pub struct Client {
    pub stream: TcpStream,
    pending: Vec<u8>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        Client {
            stream,
            pending: Vec::new(),
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write");
    }

    /// Reads more into `pending`; false when the peer closed.
    fn fill(&mut self) -> std::io::Result<bool> {
        let mut buf = [0u8; 8192];
        let n = self.stream.read(&mut buf)?;
        self.pending.extend_from_slice(&buf[..n]);
        Ok(n > 0)
    }

    /// The next bytes are exactly `expected`.
    pub fn expect(&mut self, expected: &[u8]) {
        while self.pending.len() < expected.len() {
            match self.fill() {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => panic!(
                    "reading: {e}; expected \"{}\", got so far \"{}\"",
                    preview(expected),
                    preview(&self.pending)
                ),
            }
        }
        let n = expected.len().min(self.pending.len());
        let got: Vec<u8> = self.pending.drain(..n).collect();
        // Bytes, not text: a lossy conversion would hide a difference in invalid UTF-8.
        if got != expected {
            let at = got
                .iter()
                .zip(expected)
                .position(|(g, e)| g != e)
                .unwrap_or(got.len().min(expected.len()));
            let window = |b: &[u8]| {
                let end = (at + 80).min(b.len());
                b[at.saturating_sub(40).min(end)..end]
                    .escape_ascii()
                    .to_string()
            };
            panic!(
                "reply mismatch at byte {at} (got {} bytes, expected {}):\n  got:      \"{}\"\n  expected: \"{}\"",
                got.len(),
                expected.len(),
                window(&got),
                window(expected),
            );
        }
    }

    /// Sends `request` and checks the reply byte for byte.
    pub fn call(&mut self, request: &[u8], expected: &[u8]) {
        self.send(request);
        self.expect(expected);
    }

    /// Reads through the first occurrence of `terminator`.
    pub fn read_until(&mut self, terminator: &[u8]) -> Vec<u8> {
        loop {
            if let Some(i) = self
                .pending
                .windows(terminator.len())
                .position(|w| w == terminator)
            {
                return self.pending.drain(..i + terminator.len()).collect();
            }
            match self.fill() {
                Ok(true) => {}
                Ok(false) => panic!("closed; got {:?}", String::from_utf8_lossy(&self.pending)),
                Err(e) => panic!(
                    "reading: {e}; got {:?}",
                    String::from_utf8_lossy(&self.pending)
                ),
            }
        }
    }

    /// The `STAT name value` lines of a `stats` request's reply, by name.
    pub fn stats_of(&mut self, request: &[u8]) -> std::collections::HashMap<String, String> {
        self.send(request);
        let reply = self.read_until(b"END\r\n");
        String::from_utf8_lossy(&reply)
            .lines()
            .filter_map(|l| l.strip_prefix("STAT "))
            .filter_map(|l| l.split_once(' '))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// `stats`, by name.
    pub fn stats(&mut self) -> std::collections::HashMap<String, String> {
        self.stats_of(b"stats\r\n")
    }

    /// The server closes the connection (after any bytes already sent).
    pub fn expect_closed(&mut self) {
        assert!(
            self.pending.is_empty(),
            "unread: {:?}",
            String::from_utf8_lossy(&self.pending)
        );
        match self.fill() {
            Ok(false) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Ok(true) => panic!(
                "expected close, got {:?}",
                String::from_utf8_lossy(&self.pending)
            ),
            Err(e) => panic!("expected close, got error {e}"),
        }
    }

    /// Nothing arrives within `wait`.
    pub fn expect_silence(&mut self, wait: Duration) {
        assert!(
            self.pending.is_empty(),
            "unread: {:?}",
            String::from_utf8_lossy(&self.pending)
        );
        self.stream.set_read_timeout(Some(wait)).unwrap();
        let r = self.fill();
        self.stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        match r {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Ok(_) => panic!(
                "expected silence, got {:?}",
                String::from_utf8_lossy(&self.pending)
            ),
            Err(e) => panic!("expected silence, got error {e}"),
        }
    }
}

/// The start of `bytes`, escaped, for a failure message: replies can be megabytes.
pub fn preview(bytes: &[u8]) -> String {
    const SHOWN: usize = 200;
    let shown = bytes[..bytes.len().min(SHOWN)].escape_ascii().to_string();
    if bytes.len() > SHOWN {
        format!("{shown}... ({} bytes)", bytes.len())
    } else {
        shown
    }
}

/// A temp dir plus a config file in it with `toml`.
pub fn config_file(dir: &Path, toml: &str) -> PathBuf {
    let path = dir.join("weir.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// Polls `f` every 10 ms until it is true or `timeout` passes; returns its last answer.
/// For waiting on what the server reports instead of on the clock.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return f();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
