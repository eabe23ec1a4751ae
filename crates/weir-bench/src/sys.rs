//! Small views of the operating system the benchmarks need: the client's own CPU time
//! (so a reader can tell whether the load generator limited a run), a server's resident
//! memory, the disk use of a data directory, and the open-files limit that 8000
//! connections need.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// User + system CPU time this process has used so far (all threads).
pub fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the struct we own; a zeroed rusage is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer cannot fail.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    if rc != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Measures the client's CPU use over a span of wall time.
pub struct CpuMeter {
    start: Duration,
}

impl CpuMeter {
    pub fn start() -> CpuMeter {
        CpuMeter { start: cpu_time() }
    }

    /// CPU seconds used since `start`.
    pub fn seconds(&self) -> f64 {
        cpu_time().saturating_sub(self.start).as_secs_f64()
    }
}

/// Raises the soft RLIMIT_NOFILE to the hard limit: 8000 connections need 8000 fds.
/// Returns the soft limit now in force.
pub fn raise_nofile_limit() -> u64 {
    // SAFETY: plain syscalls on a struct we own.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        if lim.rlim_cur < lim.rlim_max {
            let wanted = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) == 0 {
                return wanted.rlim_cur;
            }
        }
        lim.rlim_cur
    }
}

/// A field of `/proc/PID/status` given in kB (VmRSS, RssAnon, ...), in bytes.
pub fn proc_status_bytes(pid: u32, field: &str) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_status_field(&text, field).with_context(|| format!("no {field} in {path}"))
}

fn parse_status_field(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kb * 1024)
    })
}

/// User + system CPU time a process has used so far (all threads), from
/// `/proc/PID/stat` (fields 14 and 15, in clock ticks); `None` when unreadable.
pub fn process_cpu_time(pid: u32) -> Option<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // SAFETY: sysconf takes a constant and touches no memory of ours.
    let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    parse_stat_cpu(&text, ticks_per_s)
}

fn parse_stat_cpu(text: &str, ticks_per_s: libc::c_long) -> Option<Duration> {
    if ticks_per_s <= 0 {
        return None;
    }
    // The command name (field 2) is in parentheses and may hold spaces: count the
    // fields after its closing parenthesis, where field 3 (the state) comes first.
    let after = &text[text.rfind(')')? + 1..];
    let mut fields = after.split_ascii_whitespace();
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let ticks = utime + stime;
    let per_s = ticks_per_s as u64;
    Some(
        Duration::from_secs(ticks / per_s)
            + Duration::from_nanos((ticks % per_s) * 1_000_000_000 / per_s),
    )
}

/// Resident memory (VmRSS) of a process, bytes.
pub fn vm_rss_bytes(pid: u32) -> Result<u64> {
    proc_status_bytes(pid, "VmRSS")
}

/// Resident memory of this process, bytes.
pub fn self_rss_bytes() -> Result<u64> {
    vm_rss_bytes(std::process::id())
}

/// Disk space used by everything under `dir`, in bytes, like `du -s`: allocated
/// blocks, so sparse or preallocated files count as the disk sees them.
pub fn disk_usage_bytes(dir: &Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            // Files come and go under a live server (segments deleted); skip them.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("stat {}", path.display())),
        };
        total += meta.blocks() * 512;
        if meta.is_dir() {
            let entries = match std::fs::read_dir(&path) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e).with_context(|| format!("listing {}", path.display())),
            };
            for entry in entries.flatten() {
                stack.push(entry.path());
            }
        }
    }
    Ok(total)
}

/// Whether a process with this pid exists (signal 0).
pub fn process_exists(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence and permission.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

/// Sends a signal to a process; errors when it is gone.
pub fn signal(pid: u32, sig: libc::c_int) -> Result<()> {
    // SAFETY: plain syscall.
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    if rc != 0 {
        bail!("kill({pid}, {sig}): {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether we run as root (memcached then needs `-u root`).
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A loopback address nobody listens on right now.
pub fn free_addr() -> anyhow::Result<std::net::SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// Waits (up to 20 s) until something accepts connections on `addr`.
pub fn wait_listening(addr: std::net::SocketAddr, what: &str) -> anyhow::Result<()> {
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        if std::time::Instant::now() > until {
            anyhow::bail!("{what} is not listening on {addr}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A child process, killed on drop.
pub struct Proc(pub std::process::Child);

/// How long a process has to end on SIGTERM before it gets SIGKILL.
const TERM_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

impl Drop for Proc {
    /// SIGTERM first, so that a server with processes of its own (nginx's master
    /// and its workers) takes them down with it; SIGKILL after [`TERM_GRACE`].
    fn drop(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.0.id()) {
            // SAFETY: kill(2) takes plain integers and touches no memory of ours; the
            // child has not been waited for, so its pid still names it.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let until = std::time::Instant::now() + TERM_GRACE;
            while std::time::Instant::now() < until {
                if let Ok(Some(_)) = self.0.try_wait() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `weir-bench SUBCOMMAND ADDR` (a suite's helper server: the bare HTTP
/// reference, the proxy's primary and shadows) on a free port, and waits until it
/// accepts.
pub fn helper(sub: &str) -> anyhow::Result<(Proc, std::net::SocketAddr)> {
    use anyhow::Context;
    let addr = free_addr()?;
    let exe = std::env::current_exe().context("finding weir-bench's own path")?;
    let child = std::process::Command::new(exe)
        .args([sub, &addr.to_string()])
        .stdin(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("starting weir-bench {sub}"))?;
    let p = Proc(child);
    wait_listening(addr, sub)?;
    Ok((p, addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_fields() {
        let text = "Name:\tx\nVmRSS:\t  1234 kB\nRssAnon:\t 10 kB\n";
        assert_eq!(parse_status_field(text, "VmRSS"), Some(1234 * 1024));
        assert_eq!(parse_status_field(text, "RssAnon"), Some(10 * 1024));
        assert_eq!(parse_status_field(text, "VmSwap"), None);
    }

    #[test]
    fn parses_stat_cpu_times() {
        // Fields 14 and 15 (utime, stime) are 250 and 50 ticks; the name has a space
        // and a parenthesis.
        let text = "42 (weir (x) y) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0";
        assert_eq!(parse_stat_cpu(text, 100), Some(Duration::from_millis(3000)));
        assert_eq!(parse_stat_cpu(text, 0), None);
        assert_eq!(parse_stat_cpu("42 (weir) S 1", 100), None);
    }

    #[test]
    fn own_cpu_time_is_readable() {
        assert!(process_cpu_time(std::process::id()).is_some());
    }

    #[test]
    fn own_rss_is_readable() {
        assert!(self_rss_bytes().unwrap() > 0);
    }
}
