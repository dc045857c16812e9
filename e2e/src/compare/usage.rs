//! What a system's control plane costs the node: the CPU time and memory of its
//! processes, read from /proc on the node. Its processes are those in the cgroups of its
//! control-plane Pods ([`System::control_plane`]), less the sandboxes' `pause`: this
//! process runs on the node's host, so it sees them with their host pids.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;

use super::systems::System;
use crate::node::Node;

/// One process of a control plane at one moment, from /proc.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessSample {
    pub pid: u32,
    /// When it started, in clock ticks since boot: a pid reused by a restarted process
    /// is another process.
    pub started: u64,
    /// User and system CPU time so far (its threads', the exited ones' included), in
    /// clock ticks.
    pub cpu_ticks: u64,
    /// VmRSS, KiB.
    pub rss_kib: u64,
    /// VmHWM, KiB: its peak resident memory since it started.
    pub peak_rss_kib: u64,
}

/// The pids of the system's control-plane processes now.
pub async fn control_plane_pids(node: &Node, system: System) -> anyhow::Result<Vec<u32>> {
    let (namespace, selector) = system.control_plane();
    let pods: Api<Pod> = Api::namespaced(node.api().client().await, &namespace);
    let listed = pods
        .list(&ListParams::default().labels(selector))
        .await
        .with_context(|| format!("list the Pods {selector} in {namespace}"))?;
    let uids: Vec<String> = (listed.items.iter())
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter_map(|pod| pod.metadata.uid.clone())
        .collect();
    anyhow::ensure!(
        !uids.is_empty(),
        "{}: no control-plane Pod {selector} in {namespace}",
        system.name()
    );
    let root = cgroup_root(&node.id).with_context(|| {
        format!(
            "node {}: no cgroup folder under /sys/fs/cgroup/pids or /sys/fs/cgroup",
            node.id
        )
    })?;
    let mut pids = Vec::new();
    for uid in &uids {
        let found = pod_pids(&root, uid);
        anyhow::ensure!(
            !found.is_empty(),
            "{}: no process in the cgroups of Pod {uid} under {}",
            system.name(),
            root.display()
        );
        pids.extend(found);
    }
    pids.sort_unstable();
    Ok(pids)
}

/// The node's cgroup folder of one hierarchy: `pids` under cgroup v1, else the unified
/// one. Any hierarchy would do: each holds every container's processes.
fn cgroup_root(node_id: &str) -> Option<PathBuf> {
    [
        Path::new("/sys/fs/cgroup/pids").join(node_id),
        Path::new("/sys/fs/cgroup").join(node_id),
    ]
    .into_iter()
    .find(|dir| dir.is_dir())
}

/// The processes of Pod `uid`'s containers: those in its cgroup folder (`pod<uid>`, the
/// kubelet's cgroupfs naming) and below it, less the sandbox's `pause`.
fn pod_pids(root: &Path, uid: &str) -> Vec<u32> {
    let pod_dir = format!("pod{uid}");
    let mut pids = Vec::new();
    let mut stack = vec![(root.to_path_buf(), false)];
    while let Some((dir, in_pod)) = stack.pop() {
        let in_pod = in_pod || dir.file_name().is_some_and(|name| *name == *pod_dir);
        if in_pod {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                if !cmdline.starts_with(b"/pause") {
                    pids.push(pid);
                }
            }
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push((entry.path(), in_pod));
            }
        }
    }
    pids
}

/// The processes of `pids` as /proc shows them now; those gone are left out.
pub fn sample(pids: &[u32]) -> Vec<ProcessSample> {
    pids.iter().filter_map(|&pid| sample_one(pid)).collect()
}

fn sample_one(pid: u32) -> Option<ProcessSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    // The fields after the command name (which may hold spaces and parentheses): utime,
    // stime and starttime are the 14th, 15th and 22nd fields of the line.
    let after_name = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    let kib = |key: &str| {
        (status.lines())
            .find_map(|line| line.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
    };
    Some(ProcessSample {
        pid,
        started: field(19)?,
        cpu_ticks: field(11)? + field(12)?,
        rss_kib: kib("VmRSS:")?,
        peak_rss_kib: kib("VmHWM:")?,
    })
}

/// Whether every process of `before` is still there in `after` (the same pid, started
/// at the same moment): else one exited or restarted in between, and its CPU time is
/// lost.
pub fn all_still_running(before: &[ProcessSample], after: &[ProcessSample]) -> bool {
    before
        .iter()
        .all(|b| (after.iter()).any(|a| a.pid == b.pid && a.started == b.started))
}

/// The CPU seconds the processes of `before` used until `after`; None when one of them
/// is not [`all_still_running`].
pub fn cpu_seconds(before: &[ProcessSample], after: &[ProcessSample]) -> Option<f64> {
    if !all_still_running(before, after) {
        return None;
    }
    let ticks: u64 = (before.iter())
        .filter_map(|b| {
            let a = after.iter().find(|a| a.pid == b.pid)?;
            Some(a.cpu_ticks.saturating_sub(b.cpu_ticks))
        })
        .sum();
    Some(ticks as f64 / clock_ticks_per_second())
}

/// The sum of VmRSS, MiB.
pub fn rss_mib(samples: &[ProcessSample]) -> f64 {
    samples.iter().map(|s| s.rss_kib).sum::<u64>() as f64 / 1024.0
}

/// The sum of VmRSS at `after` of the processes of `before`, MiB; None when one of them
/// is not [`all_still_running`] (its memory would be missing from the sum).
pub fn rss_mib_after(before: &[ProcessSample], after: &[ProcessSample]) -> Option<f64> {
    all_still_running(before, after).then(|| rss_mib(after))
}

/// The sum of VmHWM at `after`, MiB: each process's peak since it started (not a peak of
/// the sum); None as for [`rss_mib_after`].
pub fn peak_rss_mib(before: &[ProcessSample], after: &[ProcessSample]) -> Option<f64> {
    all_still_running(before, after)
        .then(|| after.iter().map(|s| s.peak_rss_kib).sum::<u64>() as f64 / 1024.0)
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the system; no memory is touched.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_read_from_proc() {
        let me = sample_one(std::process::id()).expect("this process in /proc");
        assert!(me.rss_kib > 0 && me.peak_rss_kib >= me.rss_kib, "{me:?}");
        assert!(me.started > 0, "{me:?}");
    }

    #[test]
    fn cpu_time_and_memory_are_lost_when_a_process_restarted() {
        let process = |pid, started, cpu_ticks| ProcessSample {
            pid,
            started,
            cpu_ticks,
            rss_kib: 1024,
            peak_rss_kib: 2048,
        };
        let before = [process(10, 5, 100), process(11, 5, 50)];
        let after = [process(10, 5, 300), process(11, 5, 70)];
        let seconds = cpu_seconds(&before, &after).expect("both still running");
        assert!((seconds * clock_ticks_per_second() - 220.0).abs() < 1e-9);
        let restarted = [process(10, 5, 300), process(11, 900, 1)];
        assert_eq!(cpu_seconds(&before, &restarted), None);
        assert_eq!(
            (
                rss_mib_after(&before, &after),
                peak_rss_mib(&before, &after)
            ),
            (Some(2.0), Some(4.0))
        );
        assert_eq!(
            (
                rss_mib_after(&before, &restarted),
                peak_rss_mib(&before, &restarted)
            ),
            (None, None)
        );
    }
}
