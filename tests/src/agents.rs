//! Running `gpu-node-agent` on the lab's nodes: each agent gets its own fake
//! NVML state file, kernel-log file, boot id, state dir and metrics file, in
//! `agent-NODE/` of the lab's work directory. Used by the end-to-end tests and
//! the agent benchmark.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use slurm_formats::cpuset::CpuSet;

use crate::Lab;

/// Where the workspace's binaries are (next to this test's profile dir).
pub fn bin(name: &str) -> PathBuf {
    // With SLURM_LAB_INSTALLED, the packaged programs are tested instead of the build tree's.
    if std::env::var_os("SLURM_LAB_INSTALLED").is_some() {
        match name {
            "gpu-node-agent" => return PathBuf::from("/usr/sbin/gpu-node-agent"),
            "spank-gpu" => return PathBuf::from("/usr/bin/spank-gpu"),
            _ => {}
        }
    }
    crate::profile_dir().join(name)
}

pub fn healthy_state() -> Value {
    let text = include_str!("../fake-nvml/states/h100x8-healthy.json");
    serde_json::from_str(text).unwrap_or(Value::Null)
}

/// One node's agent files.
#[derive(Debug)]
pub struct AgentFiles {
    /// The agent's directory.
    pub dir: PathBuf,
}

impl AgentFiles {
    pub fn new(lab: &Lab, node: &str) -> Result<AgentFiles, String> {
        let dir = lab.dir.join(format!("agent-{node}"));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let files = AgentFiles { dir };
        files.set_state(&healthy_state())?;
        fs::write(files.path("kmsg"), "").map_err(|e| e.to_string())?;
        files.set_boot("boot-1")?;
        Ok(files)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Replaces the fake NVML state (atomically: the fake re-reads on change).
    pub fn set_state(&self, state: &Value) -> Result<(), String> {
        let tmp = self.path("nvml.json.tmp");
        fs::write(&tmp, state.to_string()).map_err(|e| e.to_string())?;
        fs::rename(&tmp, self.path("nvml.json")).map_err(|e| e.to_string())
    }

    pub fn set_boot(&self, id: &str) -> Result<(), String> {
        fs::write(self.path("boot_id"), format!("{id}\n")).map_err(|e| e.to_string())
    }

    pub fn append_kmsg(&self, line: &str) -> Result<(), String> {
        use std::io::Write;
        let mut f = fs::OpenOptions::new().append(true).open(self.path("kmsg")).map_err(|e| e.to_string())?;
        writeln!(f, "{line}").map_err(|e| e.to_string())
    }

    pub fn config(&self, lab: &Lab, node: &str, nvml: &Path) -> Result<PathBuf, String> {
        let d = self.dir.display();
        let text = format!(
            "node_name = \"{node}\"\nnvml_library = \"{}\"\nkmsg_path = \"{d}/kmsg\"\nstate_dir = \"{d}/state\"\n\
             poll_interval = \"500ms\"\nnvml_timeout = \"2s\"\nboot_id_path = \"{d}/boot_id\"\n\
             metrics_textfile = \"{d}/metrics.prom\"\nresume_after = 2\nmax_drained_fraction = 1.0\n\
             drain_jitter = \"1s\"\nplugstack_conf = \"{}\"\nusage_interval = \"1s\"\n",
            nvml.display(),
            lab.dir.join("etc/plugstack.conf").display()
        );
        let path = self.path("config.toml");
        fs::write(&path, text).map_err(|e| e.to_string())?;
        Ok(path)
    }

    /// When the agent last finished a pass (its metrics file's
    /// `gpu_node_agent_last_pass_timestamp_seconds`), if it has written one.
    pub fn last_pass(&self) -> Option<f64> {
        let text = fs::read_to_string(self.path("metrics.prom")).ok()?;
        // `gpu_node_agent_last_pass_timestamp_seconds{node="node2"} 1796000000.123`
        text.lines()
            .filter(|l| {
                l.strip_prefix("gpu_node_agent_last_pass_timestamp_seconds")
                    .is_some_and(|rest| rest.starts_with(['{', ' ']))
            })
            .find_map(|l| l.split_whitespace().last()?.parse().ok())
    }

    /// Waits until the agent has finished `n` passes that started after this
    /// call (so a fault or event written before it has been looked at `n`
    /// times at least): the condition a "never drains" check waits on,
    /// instead of a fixed sleep.
    pub fn wait_passes(&self, n: u32, limit: Duration) -> Result<(), String> {
        let t = Instant::now();
        let now = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64())
        };
        // A pass that ends after `since` may have started before it: the first
        // one seen only marks the start of the next.
        let (mut since, mut seen) = (now(), 0);
        while seen <= n {
            match self.last_pass() {
                Some(p) if p > since => {
                    since = p;
                    seen += 1;
                }
                _ => {
                    if t.elapsed() > limit {
                        return Err(format!(
                            "the agent in {} finished {} of {n} passes within {limit:?}",
                            self.dir.display(),
                            seen.saturating_sub(1)
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        Ok(())
    }

    pub fn log(&self, lab: &Lab, node: &str) -> String {
        fs::read_to_string(lab.dir.join(format!("log/agent-{node}.log"))).unwrap_or_default()
    }
}

/// Starts `gpu-node-agent run` on a node; returns its files.
pub fn start_agent(lab: &mut Lab, node: &str) -> Result<AgentFiles, String> {
    start_agent_edited(lab, node, &[])
}

/// The node's Slurm state and reason.
pub fn node_info(lab: &Lab, node: &str) -> (String, String) {
    let out = lab.command("scontrol").args(["show", "node", node]).output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    let state = crate::field(&text, "State").unwrap_or_default();
    let reason = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Reason="))
        .map(|r| r.rsplit_once(" [").map_or(r, |(a, _)| a).to_owned())
        .unwrap_or_default();
    (state, reason)
}

pub fn wait_for(
    lab: &Lab,
    node: &str,
    timeout: Duration,
    pred: impl Fn(&str, &str) -> bool,
) -> Result<Duration, String> {
    let t = Instant::now();
    loop {
        let (state, reason) = node_info(lab, node);
        if pred(&state, &reason) {
            return Ok(t.elapsed());
        }
        if t.elapsed() > timeout {
            return Err(format!("{node} is {state} ({reason}) after {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn drained(state: &str) -> bool {
    state.contains("DRAIN")
}

/// Stops the agents, puts both nodes back in service, forgets reboots.
pub fn reset(lab: &mut Lab) -> Result<(), String> {
    for node in lab.nodes.clone() {
        lab.stop_daemon(&format!("agent-{node}"));
        let _ = lab.command("scontrol").args(["cancel_reboot", &node]).output();
        let _ =
            lab.command("scontrol").args(["update", &format!("NodeName={node}"), "State=RESUME"]).output();
    }
    let _ = fs::remove_file(lab.dir.join("log/reboots"));
    lab.wait_idle(Duration::from_secs(40)).map_err(|e| e.to_string())
}

pub fn add_event(files: &AgentFiles, gpu: u32, xid: u32) -> Result<(), String> {
    let mut state: Value =
        serde_json::from_str(&fs::read_to_string(files.path("nvml.json")).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    if let Some(events) = state["events"].as_array_mut() {
        events.push(json!({"gpu": gpu, "xid": xid}));
    }
    files.set_state(&state)
}

/// Starts `gpu-node-agent run` on a node with its test configuration, each
/// `(from, to)` line replaced first (`("poll_interval = \"500ms\"", ...)`).
pub fn start_agent_edited(lab: &mut Lab, node: &str, edits: &[(&str, &str)]) -> Result<AgentFiles, String> {
    let files = AgentFiles::new(lab, node)?;
    let cfg = files.config(lab, node, &bin("libfake_nvml.so"))?;
    let mut text = fs::read_to_string(&cfg).map_err(|e| e.to_string())?;
    for (from, to) in edits {
        if !text.contains(from) {
            return Err(format!("the agent's test config has no line '{from}'"));
        }
        text = text.replace(from, to);
    }
    fs::write(&cfg, text).map_err(|e| e.to_string())?;
    restart_agent(lab, node, &files)?;
    Ok(files)
}

/// (Re)starts `gpu-node-agent run` on a node with the files it had: its
/// state dir, kernel log and fake NVML state stay as they are.
pub fn restart_agent(lab: &mut Lab, node: &str, files: &AgentFiles) -> Result<(), String> {
    let name = format!("agent-{node}");
    lab.stop_daemon(&name);
    let agent = bin("gpu-node-agent").display().to_string();
    let cfg = files.path("config.toml").display().to_string();
    let state = files.path("nvml.json").display().to_string();
    let args = ["--config", cfg.as_str(), "run"];
    lab.spawn_on(node, &name, &agent, &args, &[("FAKE_NVML_STATE", &state)]).map_err(|e| e.to_string())
}

/// Runs `gpu-node-agent ARGS` once on a node with the agent's files; its exit
/// code and output (stdout, then stderr).
pub fn run_agent(lab: &Lab, node: &str, files: &AgentFiles, args: &[&str]) -> Result<(i32, String), String> {
    let agent = bin("gpu-node-agent").display().to_string();
    let out = lab
        .command_on(node, &agent)
        .map_err(|e| e.to_string())?
        .arg("--config")
        .arg(files.path("config.toml"))
        .args(args)
        .env("FAKE_NVML_STATE", files.path("nvml.json"))
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Ok((out.status.code().unwrap_or(-1), text))
}

/// This machine's CPUs (the lab's nodes all run on them), split in two
/// halves: the fake nodes' two NUMA domains.
pub fn cpu_halves() -> Result<(CpuSet, CpuSet), String> {
    let status = fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .ok_or("no Cpus_allowed_list in /proc/self/status")?;
    let all: Vec<u32> = CpuSet::parse(list.trim()).map_err(|e| e.to_string())?.iter().collect();
    if all.len() < 2 {
        return Err(format!("the lab's GPU topology needs at least 2 CPUs, this machine has {}", all.len()));
    }
    let (a, b) = all.split_at(all.len() / 2);
    Ok((a.iter().copied().collect(), b.iter().copied().collect()))
}

/// Which of the lab's two NUMA domains (0: the first half of the machine's
/// CPUs, 1: the second) each fake GPU is local to, by device minor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuLayout {
    /// GPUs 0-3 on domain 0, 4-7 on domain 1: in order, as most machines are.
    Blocks,
    /// GPUs 1,3,5,7 on domain 0, 0,2,4,6 on domain 1: out of order, so that
    /// Slurm's own cyclic binding (local task 0 on the first CPU) is wrong
    /// for GPU 0's task and a binding that is not the plugin's shows.
    Interleaved,
}

impl GpuLayout {
    /// The NUMA domain (0 or 1) GPU `minor` is local to.
    pub fn domain(self, minor: u32) -> usize {
        match self {
            GpuLayout::Blocks => usize::from(minor >= 4),
            GpuLayout::Interleaved => usize::from(minor % 2 == 0),
        }
    }

    /// The CPUs local to GPU `minor` (see [`cpu_halves`]).
    ///
    /// # Errors
    /// The machine has fewer than 2 CPUs.
    pub fn cpus(self, minor: u32) -> Result<CpuSet, String> {
        let (lo, hi) = cpu_halves()?;
        Ok(if self.domain(minor) == 0 { lo } else { hi })
    }
}

/// Gives `node` a GPU table, the way production does: `gpu-node-agent
/// topology --write` on the node, with NVML (the fake) and an hwloc XML that
/// describe the machine's real CPUs split over two NUMA domains, GPUs 0-3
/// local to the first and 4-7 to the second ([`GpuLayout::Blocks`]).
///
/// # Errors
/// The agent failed; the error has its output.
pub fn write_topology(lab: &Lab, node: &str) -> Result<String, String> {
    write_topology_with(lab, node, GpuLayout::Blocks)
}

/// Gives every node of the lab the synthetic out-of-order topology
/// ([`GpuLayout::Interleaved`]): on this 2-CPU machine CPU 0 is NUMA 0 with
/// GPUs 1,3,5,7 and CPU 1 is NUMA 1 with GPUs 0,2,4,6 (by device minor).
///
/// # Errors
/// The agent failed on a node.
pub fn write_interleaved_topology(lab: &Lab) -> Result<(), String> {
    for node in &lab.nodes {
        write_topology_with(lab, node, GpuLayout::Interleaved)?;
    }
    Ok(())
}

/// [`write_topology`] with the GPUs placed as `layout` says. The table's
/// Slurm indices follow the node's `gres.conf` order, as the agent reads it.
///
/// # Errors
/// The agent failed; the error has its output.
pub fn write_topology_with(lab: &Lab, node: &str, layout: GpuLayout) -> Result<String, String> {
    write_topology_in(lab, node, layout, &lab.slurm_conf())
}

/// [`write_topology`] with the agent (and so its `slurmd -G`) reading `slurm_conf`.
///
/// # Errors
/// The agent failed; the error has its output.
pub fn write_topology_with_conf(lab: &Lab, node: &str, slurm_conf: &Path) -> Result<String, String> {
    write_topology_in(lab, node, GpuLayout::Blocks, slurm_conf)
}

/// The agent's GPU table on `node` made from a real machine's hwloc XML
/// (`xml`, read by the agent's hwloc): the fake NVML's first GPUs take the
/// bus ids, CPUs and NUMA nodes of the machine's NVIDIA GPUs, as many as it
/// has, up to 8. Returns how many GPUs the table has.
///
/// # Errors
/// The XML holds no NVIDIA GPU, or the agent failed.
pub fn write_topology_from_xml(lab: &Lab, node: &str, xml: &str) -> Result<usize, String> {
    let machine = hwloc_xml_oracle::from_hwloc_xml(xml).map_err(|e| e.to_string())?;
    let gpus: Vec<_> = machine.nvidia_gpus().take(8).collect();
    if gpus.is_empty() {
        return Err("the topology has no NVIDIA GPU".into());
    }
    let mut state = healthy_state();
    if let Some(list) = state["gpus"].as_array_mut() {
        list.truncate(gpus.len());
    }
    for (i, gpu) in gpus.iter().enumerate() {
        state["gpus"][i]["pci_bus_id"] = json!(gpu.bus_id.to_string());
        state["gpus"][i]["cpu_affinity"] = json!(gpu.cpus.to_string());
        state["gpus"][i]["numa_node"] = json!(gpu.numa_nodes.first().copied().unwrap_or(0));
    }
    run_topology_write(lab, node, &state, xml, &lab.slurm_conf())?;
    Ok(gpus.len())
}

fn write_topology_in(lab: &Lab, node: &str, layout: GpuLayout, slurm_conf: &Path) -> Result<String, String> {
    let (lo, hi) = cpu_halves()?;
    let mut state = healthy_state();
    let buses: Vec<String> =
        (0..8).map(|i| state["gpus"][i]["pci_bus_id"].as_str().unwrap_or("").to_owned()).collect();
    let bus = |i: usize| {
        slurm_formats::pci::PciAddr::parse_with_function(&buses[i])
            .map(slurm_formats::pci::PciAddr::hwloc)
            .unwrap_or_default()
    };
    let mut domains: [(CpuSet, Vec<String>); 2] = [(lo.clone(), Vec::new()), (hi.clone(), Vec::new())];
    for (i, minor) in (0..8u32).enumerate() {
        let numa = layout.domain(minor);
        state["gpus"][i]["cpu_affinity"] = json!(domains[numa].0.to_string());
        state["gpus"][i]["numa_node"] = json!(numa);
        domains[numa].1.push(bus(i));
    }
    let xml = task_plan::topology::synthetic_xml(
        &domains.iter().map(|(c, b)| (c.clone(), b.iter().map(String::as_str).collect())).collect::<Vec<_>>(),
    );
    run_topology_write(lab, node, &state, &xml, slurm_conf)
}

/// `gpu-node-agent topology --write` on `node`, with the fake NVML in
/// `state` and hwloc reading `xml`.
fn run_topology_write(
    lab: &Lab,
    node: &str,
    state: &Value,
    xml: &str,
    slurm_conf: &Path,
) -> Result<String, String> {
    let dir = lab.dir.join(format!("topo-{node}"));
    fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    fs::write(dir.join("nvml.json"), state.to_string()).map_err(|e| e.to_string())?;
    fs::write(dir.join("input.xml"), xml).map_err(|e| e.to_string())?;
    let d = dir.display();
    let cfg = format!(
        "node_name = \"{node}\"\nnvml_library = \"{}\"\nkmsg_path = \"\"\nstate_dir = \"{d}/state\"\n\
         topology_dir = \"{}\"\ntopology_xml = \"{d}/input.xml\"\n",
        bin("libfake_nvml.so").display(),
        lab.topology_dir().display()
    );
    fs::write(dir.join("config.toml"), cfg).map_err(|e| e.to_string())?;
    let agent = bin("gpu-node-agent").display().to_string();
    let out = lab
        .command_on(node, &agent)
        .map_err(|e| e.to_string())?
        .args(["--config", &format!("{d}/config.toml"), "topology", "--write"])
        .env("FAKE_NVML_STATE", dir.join("nvml.json"))
        .env("SLURM_CONF", slurm_conf)
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("gpu-node-agent topology --write on {node} failed:\n{text}"));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_pass_is_read_from_the_agents_metrics() {
        let dir = std::env::temp_dir().join(format!("agent-files-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap_or_default();
        let files = AgentFiles { dir: dir.clone() };
        assert_eq!(files.last_pass(), None);
        let text = "# HELP gpu_node_agent_last_pass_timestamp_seconds When\n\
                    gpu_node_agent_last_pass_timestamp_seconds_other{node=\"node2\"} 5\n\
                    gpu_node_agent_last_pass_timestamp_seconds{node=\"node2\"} 1796000000.250\n";
        fs::write(files.path("metrics.prom"), text).unwrap_or_default();
        assert_eq!(files.last_pass(), Some(1_796_000_000.25));
        let _ = fs::remove_dir_all(dir);
    }
}
