//! Leaving nothing behind: the Pods' processes (found by the node's cgroup root), the
//! containerd shims (found by the node's containerd socket), every mount under the node's
//! folder, the cgroups, the network namespace and the folder itself. Each step works on
//! what is there, so it can finish the job of a run that was killed half-way.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The cgroup v1 hierarchies and the unified one, where runc and the kubelet make the
/// node's cgroups.
fn cgroup_mounts() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") else {
        return Vec::new();
    };
    let mut mounts: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    // The unified mount when this is cgroup v2 only.
    if mounts.iter().any(|m| m.join("cgroup.controllers").exists()) || mounts.is_empty() {
        mounts.push(PathBuf::from("/sys/fs/cgroup"));
    }
    mounts.retain(|m| m.is_dir());
    mounts
}

/// The node's cgroup folders under every hierarchy, children before parents.
fn cgroup_dirs(root: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&entry.path(), out);
                }
            }
        }
        out.push(dir.to_path_buf());
    }
    let mut out = Vec::new();
    for mount in cgroup_mounts() {
        let dir = mount.join(root.trim_start_matches('/'));
        if dir.is_dir() {
            walk(&dir, &mut out);
        }
    }
    out
}

fn kill(pid: i32) {
    // SAFETY: sending a signal has no memory effects.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

/// Kills every process in the node's cgroups (the containers), then removes the cgroups.
pub fn cgroups(root: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut alive = 0;
        for dir in cgroup_dirs(root) {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                alive += 1;
                kill(pid);
            }
        }
        if alive == 0 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for dir in cgroup_dirs(root) {
        let _ = std::fs::remove_dir(&dir);
    }
}

/// SIGKILLs the processes of the Pod `uid`'s containers on the node `root` (its cgroup
/// folder is `pod<uid>` under the node's cgroup root), leaving the sandbox's pause alone.
pub fn kill_pod_processes(root: &str, uid: &str) -> usize {
    let mut killed = 0;
    for dir in cgroup_dirs(root) {
        if !dir.to_string_lossy().contains(&format!("pod{uid}")) {
            continue;
        }
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if cmdline.starts_with(b"/pause") {
                continue;
            }
            kill(pid);
            killed += 1;
        }
    }
    killed
}

/// Kills the processes whose command line contains `needle` (the containerd shims name
/// the node's containerd socket; they outlive containerd by design).
pub fn processes_naming(needle: &str) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    let me = std::process::id() as i32;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(needle) {
            kill(pid);
        }
    }
}

/// Mount points at or under `dir`, deepest first (/proc/self/mountinfo's fifth field,
/// with its octal escapes undone).
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = dir.to_string_lossy().into_owned();
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mount_path)
        .filter(|p| p == &prefix || p.starts_with(&format!("{prefix}/")))
        .map(PathBuf::from)
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    points.dedup();
    points
}

fn unescape_mount_path(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 4 <= bytes.len()
            && let Some(n) = std::str::from_utf8(&bytes[i + 1..i + 4])
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        {
            out.push(n);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Detaches every mount under `dir` (overlay roots, shm, secrets' tmpfs, the Pods'
/// network namespaces), then removes the folder.
pub fn folder(dir: &Path) {
    for _ in 0..3 {
        let points = mounts_under(dir);
        if points.is_empty() {
            break;
        }
        for point in points {
            if let Ok(c) = std::ffi::CString::new(point.as_os_str().as_encoded_bytes()) {
                // SAFETY: a valid C string; a failure is only reported by the return code.
                unsafe {
                    libc::umount2(c.as_ptr(), libc::MNT_DETACH);
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Removes shim sockets nobody listens on any more (the shims were killed, so they could
/// not remove their own). A socket that still answers belongs to a live shim: kept.
pub fn dead_shim_sockets() {
    let Ok(entries) = std::fs::read_dir("/run/containerd/s") else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if let Err(e) = std::os::unix::net::UnixStream::connect(&path)
            && e.kind() == std::io::ErrorKind::ConnectionRefused
        {
            let _ = std::fs::remove_file(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::unescape_mount_path;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_mount_path("/tmp/a\\040b"), "/tmp/a b");
        assert_eq!(unescape_mount_path("/plain"), "/plain");
        assert_eq!(unescape_mount_path("/end\\"), "/end\\");
    }
}
