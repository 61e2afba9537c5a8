//! The state file of what a lab created, and teardown: a lab killed half-way
//! is cleaned up by the next start or by `slurm-lab down`.

use crate::*;

/// Appends one record to the state file: `pid PID START NAME`, `netns NAME`,
/// `link NAME`, `cgroup PATH`, `mount PATH` or `dir PATH`.
pub(crate) fn record(line: &str) -> Result<()> {
    let mut f = fs::OpenOptions::new().append(true).create(true).open(STATE_FILE)?;
    writeln!(f, "{line}")?;
    Ok(())
}

/// Ends everything a lab recorded in the state file, by PID and by the names
/// it created, then removes the file. Safe to call when there is none.
pub fn cleanup_recorded() -> Result<()> {
    let Ok(text) = fs::read_to_string(STATE_FILE) else { return Ok(()) };
    let mut pids = Vec::new();
    let mut netns = Vec::new();
    let mut links = Vec::new();
    let mut dirs = Vec::new();
    let mut cgroups = Vec::new();
    let mut mounts = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["owner", pid, start] | ["pid", pid, start, ..] => {
                if let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) {
                    if words[0] == "owner" {
                        if pid != std::process::id() && alive(pid, start) {
                            return err(format!(
                                "another slurm-lab (pid {pid}) is running; stop it first (state in {STATE_FILE})"
                            ));
                        }
                    } else {
                        pids.push((pid, start));
                    }
                }
            }
            ["netns", name] if name.starts_with(PREFIX) => netns.push((*name).to_owned()),
            ["link", name] if name.starts_with(PREFIX) => links.push((*name).to_owned()),
            ["dir", path] => dirs.push(PathBuf::from(path)),
            ["mount", path] => mounts.push(PathBuf::from(path)),
            ["cgroup", path] if is_lab_cgroup(Path::new(path)) => cgroups.push(PathBuf::from(path)),
            _ => {}
        }
    }
    // Daemons first, politely, newest first (slurmds before slurmctld before munged).
    for &(pid, start) in pids.iter().rev() {
        if alive(pid, start) {
            kill(pid, libc::SIGTERM);
        }
    }
    let _ = wait_until(Duration::from_secs(10), || pids.iter().all(|&(p, s)| !alive(p, s)));
    for &(pid, start) in &pids {
        if alive(pid, start) {
            kill(pid, libc::SIGKILL);
        }
    }
    // Then whatever is left inside the nodes: slurmstepds and job processes.
    for name in &netns {
        kill_netns_processes(name);
        let _ = Command::new("ip").args(["netns", "delete", name]).stderr(Stdio::null()).status();
    }
    for name in &links {
        let _ = Command::new("ip").args(["link", "delete", name]).stderr(Stdio::null()).status();
    }
    // The slurmds' cgroups, once the processes in them are gone.
    let _ = wait_until(Duration::from_secs(10), || {
        cgroups.iter().filter(|c| c.exists()).all(|c| remove_cgroup(c).is_ok())
    });
    // The root's mounts, newest first, once nothing runs in the root.
    for mount in mounts.iter().rev() {
        if let Err(e) = release::unmount(mount) {
            eprintln!("slurm-lab: teardown: {e}");
        }
    }
    for dir in dirs {
        let _ = fs::remove_dir_all(dir);
    }
    fs::remove_file(STATE_FILE)?;
    Ok(())
}

/// Whether `path` is a cgroup the lab may have made: `/sys/fs/cgroup/CONTROLLER/slurm_NODE`.
pub(crate) fn is_lab_cgroup(path: &Path) -> bool {
    path.parent().and_then(Path::parent) == Some(Path::new(CGROUP_ROOT))
        && path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("slurm_node"))
}

/// Removes a cgroup v1 directory and the cgroups below it, deepest first
/// (a cgroup is removed with rmdir once no process is in it).
pub(crate) fn remove_cgroup(path: &Path) -> io::Result<()> {
    for entry in fs::read_dir(path)?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup(&entry.path())?;
        }
    }
    match fs::remove_dir(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The cgroup v1 hierarchies mounted under [`CGROUP_ROOT`] (`cpuset`, `devices`, ...).
pub(crate) fn cgroup_v1_controllers() -> Vec<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"cgroup")).then(|| PathBuf::from(f.get(1).copied().unwrap_or_default()))
        })
        .filter(|p| p.parent() == Some(Path::new(CGROUP_ROOT)))
        .collect()
}

/// SIGKILLs every process whose network namespace is the named one. Found by
/// comparing namespace inodes under `/proc`, never by process name.
pub(crate) fn kill_netns_processes(name: &str) {
    let Ok(ns) = fs::metadata(format!("/run/netns/{name}")) else { return };
    let target = (ns.dev(), ns.ino());
    for _ in 0..20 {
        let mut found = 0;
        if let Ok(entries) = fs::read_dir("/proc") {
            for entry in entries.flatten() {
                let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                    continue;
                };
                if let Ok(m) = fs::metadata(entry.path().join("ns/net")) {
                    if (m.dev(), m.ino()) == target {
                        kill(pid, libc::SIGKILL);
                        found += 1;
                    }
                }
            }
        }
        if found == 0 {
            return;
        }
        sleep(Duration::from_millis(100));
    }
}

impl Lab {
    /// Tears the lab down: see the crate docs. Idempotent.
    ///
    /// # Errors
    /// Something could not be removed; everything else was still tried.
    pub fn stop(&mut self) -> Result<()> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        // Cancel jobs while the controller still runs, so steps end cleanly.
        if self.dead_daemon().is_none() {
            let _ = self.command("scancel").args(["--quiet", "--partition=debug"]).status();
        }
        for daemon in self.daemons.iter_mut().rev() {
            kill(daemon.child.id(), libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(daemon.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                sleep(Duration::from_millis(50));
            }
            if matches!(daemon.child.try_wait(), Ok(None)) {
                let _ = daemon.child.kill();
                let _ = daemon.child.wait();
            }
        }
        self.daemons.clear();
        if self.keep_dir {
            // Forget the directory so cleanup leaves it.
            let text = fs::read_to_string(STATE_FILE).unwrap_or_default();
            let kept: String =
                text.lines().filter(|l| !l.starts_with("dir ")).map(|l| format!("{l}\n")).collect();
            fs::write(STATE_FILE, kept)?;
        }
        cleanup_recorded()
    }

    /// What is left behind by this lab after [`stop`](Self::stop): namespaces,
    /// links, device files or daemons. Empty when teardown was complete.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        if let Ok(entries) = fs::read_dir("/run/netns") {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(PREFIX) {
                    left.push(format!("netns {name}"));
                }
            }
        }
        for bridge in [BRIDGE, FABRIC_BRIDGE] {
            if Path::new("/sys/class/net").join(bridge).exists() {
                left.push(format!("link {bridge}"));
            }
        }
        if !self.keep_dir && self.dir.join("cdev").exists() {
            left.push(format!("devices in {}", self.dir.join("cdev").display()));
        }
        for cgroup in &self.cgroups {
            if cgroup.exists() {
                left.push(format!("cgroup {}", cgroup.display()));
            }
        }
        if Path::new(STATE_FILE).exists() {
            left.push(STATE_FILE.to_owned());
        }
        if let Some(root) = &self.root {
            if release::mounted_below(&root.path) {
                left.push(format!("mounts in {}", root.path.display()));
            }
        }
        left
    }
}
