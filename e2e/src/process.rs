//! A child process killed on drop, and free ports for the processes a test starts.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free TCP port (free on 127.0.0.1; the same number is used on other 127.0.0.x), for a
/// process that binds it a moment later. Taken below Linux's ephemeral range (32768 and
/// up), where no outgoing connection can take it meanwhile, and never the same twice in
/// one test binary (its tests run side by side).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 16_384;
    const SPAN: u32 = 32_768 - FIRST;
    // Start where this process's id says, so that two test binaries differ too.
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let _ = NEXT.compare_exchange(
        0,
        std::process::id() % SPAN + 1,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let port = u16::try_from(FIRST + n % SPAN).unwrap_or(u16::MAX);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on loopback below 32768");
}

/// A child process killed on drop.
pub struct Process {
    pub name: String,
    child: Child,
    pub log: PathBuf,
}

impl Process {
    /// The process id, for reading /proc.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory now and at its peak, in MiB (Linux /proc).
    pub fn memory_mib(&self) -> Option<(f64, f64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        let kib = |key: &str| -> Option<f64> {
            let line = status.lines().find(|l| l.starts_with(key))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        };
        Some((kib("VmRSS:")? / 1024.0, kib("VmHWM:")? / 1024.0))
    }

    /// Resident memory backed by files (the binary's and libraries' pages) and shared
    /// memory now, in MiB (Linux /proc).
    pub fn file_backed_mib(&self) -> Option<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        let kib = |key: &str| -> Option<f64> {
            let line = status.lines().find(|l| l.starts_with(key))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        };
        Some((kib("RssFile:")? + kib("RssShmem:")?) / 1024.0)
    }

    pub fn spawn(name: &str, command: &mut Command, log: PathBuf) -> Process {
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Process {
            name: name.to_string(),
            child,
            log,
        }
    }

    /// Freezes the process (SIGSTOP), as a hung one: the kernel still accepts its
    /// connections, nothing answers them. Returns once every thread has stopped (panics if
    /// they have not within 5 s): kill(2)
    /// returns before a thread running on another core is stopped, and such a thread can
    /// still answer a request sent right after.
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.every_thread_stopped() {
            assert!(
                Instant::now() < deadline,
                "{} ({}) did not stop within 5 s of SIGSTOP",
                self.name,
                self.pid()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Whether /proc shows every thread of the process stopped (state `T`).
    fn every_thread_stopped(&self) -> bool {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.pid())) else {
            return false;
        };
        tasks.flatten().all(|task| {
            std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
                // `pid (comm) state ...`; comm may hold spaces and parentheses.
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                    == Some("T")
            })
        })
    }

    /// Lets a frozen process go on (SIGCONT).
    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.pid()).expect("a pid");
        // SAFETY: kill(2) with a pid this rig spawned and still holds.
        let sent = unsafe { libc::kill(pid, signal) };
        assert_eq!(sent, 0, "signal {signal} to {} ({pid})", self.name);
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM, as Kubernetes does to a Pod being stopped, and waits for the exit
    /// (SIGKILL after `within`). Whether it exited by itself.
    pub fn terminate(&mut self, within: Duration) -> bool {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: a signal to our own child; no memory is touched.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}
