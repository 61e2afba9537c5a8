//! `gpu-node-agent topology`: the node's GPU table for the plugin.
//!
//! The hwloc topology with I/O devices is loaded once (live, through
//! hwlocality over the system libhwloc, or from an XML file that hwloc
//! reads) and walked through hwloc's object API into the machine the plugin
//! binds on ([`crate::sources::machine`]), NVML names each
//! GPU's bus id, UUID, minor number and CPU affinity, and `slurmd -G` gives
//! Slurm's own order of its GPU device files, so the table's index is Slurm's
//! index even when Slurm's order differs from the minor order. NVML also
//! lists each GPU's MIG devices (their `MIG-<uuid>`), so that a task given a
//! MIG device binds like its parent GPU. `--write`
//! stores the table (version 3: the GPU rows and the machine), root-owned and
//! atomically, where the plugin reads it (`topology_dir`), and removes the
//! hwloc XML that agents before version 3 wrote beside it. The daemon makes the table in a short-lived
//! child process ([`write_in_child`]), so hwloc's plugins and their libraries
//! never stay in its memory.

use std::ffi::OsString;
use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use slurm_formats::cpuset::CpuSet;
use slurm_formats::pci::PciAddr;
use task_plan::gputable::{GpuEntry, GpuTable, LEGACY_XML_FILE, TABLE_FILE};
use task_plan::topology::Topology;

use crate::config::Config;
use crate::store::atomic_file::{self, Options};

/// What NVML says about one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmlGpu {
    /// `/dev/nvidiaN` minor.
    pub minor: u32,
    /// Bus id (NVML writes `00000000:1B:00.0`).
    pub bus_id: PciAddr,
    /// `GPU-...`.
    pub uuid: String,
    /// CPUs local to the GPU.
    pub cpus: CpuSet,
    /// The GPU's NUMA node, when NVML knows it.
    pub numa: Option<u32>,
    /// The UUIDs (`MIG-<uuid>`) of its MIG devices; empty when MIG is off
    /// or not supported.
    pub mig_uuids: Vec<String>,
    /// Why its MIG devices could not be listed (the table then has none for it).
    pub mig_error: Option<String>,
}

/// The plugin files of [`crate::sources::machine::VENDOR_COMPONENTS`], for
/// `HWLOC_PLUGINS_BLACKLIST`: the topology child does not even load them.
pub const VENDOR_PLUGINS: &str = "hwloc_opencl,hwloc_cuda,hwloc_nvml,hwloc_rsmi,hwloc_levelzero,hwloc_gl";

/// Every GPU NVML sees.
///
/// # Errors
/// NVML cannot be loaded or answer.
pub fn nvml_gpus(lib: &Path) -> Result<Vec<NvmlGpu>, String> {
    let nvml = Nvml::builder().lib_path(lib.as_os_str()).init().map_err(|e| format!("NVML: {e}"))?;
    let count = nvml.device_count().map_err(|e| format!("NVML: {e}"))?;
    let mut out = Vec::new();
    for i in 0..count {
        let d = nvml.device_by_index(i).map_err(|e| format!("NVML GPU {i}: {e}"))?;
        let words = d.cpu_affinity(16).unwrap_or_default();
        let (mig_uuids, mig_error) = match mig_uuids(&d) {
            Ok(m) => (m, None),
            Err(e) => (Vec::new(), Some(format!("NVML GPU {i}: MIG devices: {e}"))),
        };
        out.push(NvmlGpu {
            minor: d.minor_number().map_err(|e| format!("NVML GPU {i}: {e}"))?,
            bus_id: {
                let text = d.pci_info().map_err(|e| format!("NVML GPU {i}: {e}"))?.bus_id;
                PciAddr::parse_with_function(&text).map_err(|e| format!("NVML GPU {i}: bus id: {e}"))?
            },
            uuid: d.uuid().map_err(|e| format!("NVML GPU {i}: {e}"))?,
            cpus: CpuSet::from_words(&words),
            numa: d.numa_node_id().ok(),
            mig_uuids,
            mig_error,
        });
    }
    Ok(out)
}

/// `nvmlDeviceGetMigMode`'s "MIG on" (nvml.h).
const NVML_DEVICE_MIG_ENABLE: u32 = 1;

/// The UUIDs of a GPU's MIG devices, in MIG device index order. None when
/// the GPU does not support MIG (`NOT_SUPPORTED`, or a driver without the
/// MIG functions) or has it off. A free MIG device index answers `NOT_FOUND`
/// and is skipped.
///
/// # Errors
/// NVML fails otherwise.
pub fn mig_uuids(d: &nvml_wrapper::Device<'_>) -> Result<Vec<String>, NvmlError> {
    match d.mig_mode() {
        Ok(mode) if mode.current == NVML_DEVICE_MIG_ENABLE => {}
        Ok(_) | Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    }
    let mut out = Vec::new();
    for index in 0..d.mig_device_count()? {
        match d.mig_device_by_index(index) {
            Ok(m) => out.push(m.uuid()?),
            Err(NvmlError::NotFound) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// How long `slurmd -G -v` may take.
const SLURMD_DEADLINE: Duration = Duration::from_secs(10);

/// The minor numbers of Slurm's GPU device files, in Slurm's index order,
/// from `slurmd -G -v` (which prints the GRES slurmd would register).
///
/// `-v`: slurmd prints them with `info()`, and the log level `-G` runs at
/// has changed between releases (slurmd.c `_print_gres`: `LOG_LEVEL_INFO`
/// through 24.05; 24.11.0-24.11.2 that or a `-v`'s level; from 24.11.3 the
/// command line's level, `-G` setting `debug_level_set` so `SlurmdDebug` is
/// ignored). With `-v` it is at least `verbose` on every release, whatever
/// slurm.conf says. An empty list is not an error here: see [`make`].
///
/// # Errors
/// slurmd cannot run, does not finish within 10 s, or lists a device file
/// that cannot be read.
pub fn slurm_gpu_minors(slurmd: &Path) -> Result<Vec<u32>, String> {
    let out = bounded_command::run(Command::new(slurmd).args(["-G", "-v"]), SLURMD_DEADLINE).map_err(
        |e| match e {
            bounded_command::RunError::Spawn(e) => format!("{} -G -v: {e}", slurmd.display()),
            bounded_command::RunError::Timeout => {
                format!("{} -G -v: no answer within {SLURMD_DEADLINE:?}", slurmd.display())
            }
        },
    )?;
    let text = out.stdout + &out.stderr;
    let files = gres_gpu_files(&text)?;
    if files.is_empty() && !out.status.success() {
        let said = text.lines().map(str::trim).rfind(|l| !l.is_empty()).unwrap_or("");
        return Err(format!("{} -G -v failed ({}): {said}", slurmd.display(), out.status));
    }
    files
        .iter()
        .map(|f| {
            let m = fs::metadata(f).map_err(|e| format!("{f}: {e}"))?;
            Ok(device_minor(m.rdev()))
        })
        .collect()
}

/// The device files of `Name=gpu` lines in `slurmd -G` output, expanded
/// (`File=/dev/nvidia[0-3]`), in order. A MIG device's record names its
/// parent GPU's file and MIG capability files (`/dev/nvidia-caps/...`): the
/// capability files are left out and a GPU's file is kept once, so the
/// order is the GPUs' own.
///
/// # Errors
/// A `File=` expression that does not expand.
pub fn gres_gpu_files(text: &str) -> Result<Vec<String>, String> {
    let mut files: Vec<String> = Vec::new();
    for line in text.lines().filter(|l| l.contains("Name=gpu")) {
        let Some(file) = line.split_whitespace().find_map(|w| w.strip_prefix("File=")) else { continue };
        for f in slurm_formats::hostlist::expand(file).map_err(|e| format!("File={file}: {e}"))? {
            if !f.contains("/nvidia-caps/") && !files.contains(&f) {
                files.push(f);
            }
        }
    }
    Ok(files)
}

/// The minor number in a `st_rdev` (glibc's `minor()`).
pub fn device_minor(rdev: u64) -> u32 {
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    u32::try_from(minor & 0xffff_ffff).unwrap_or(u32::MAX)
}

/// Builds the table (version 3, carrying `topo` for the plugin): Slurm's
/// order (by device minor) when known, else NVML's minor order, else the
/// topology's NVIDIA GPUs in bus order (offline).
pub fn build_table(topo: &Topology, nvml: Option<&[NvmlGpu]>, slurm_minors: Option<&[u32]>) -> GpuTable {
    let locality =
        |bus: &str, fallback_cpus: &CpuSet, fallback_numa: Option<u32>| match topo.gpu_by_bus_id(bus) {
            Some(g) if !g.cpus.is_empty() => (g.numa_nodes.clone(), g.cpus.clone()),
            _ => (fallback_numa.into_iter().collect(), fallback_cpus.clone()),
        };
    let Some(nvml) = nvml else {
        let gpus = topo
            .nvidia_gpus()
            .zip(0u32..)
            .map(|(g, i)| GpuEntry {
                slurm_index: i,
                minor: None,
                pci_bus_id: g.bus_id,
                uuid: None,
                numa_nodes: g.numa_nodes.clone(),
                cpus: g.cpus.clone(),
                mig_uuids: Vec::new(),
            })
            .collect();
        return GpuTable { gpus, machine: Some(topo.clone()) };
    };
    let mut by_minor: Vec<&NvmlGpu> = nvml.iter().collect();
    by_minor.sort_by_key(|g| g.minor);
    let order: Vec<u32> = match slurm_minors {
        Some(m) if !m.is_empty() => m.to_vec(),
        _ => by_minor.iter().map(|g| g.minor).collect(),
    };
    let gpus = order
        .iter()
        .zip(0u32..)
        .filter_map(|(minor, index)| {
            let g = nvml.iter().find(|g| g.minor == *minor)?;
            let bus = g.bus_id;
            let (numa_nodes, cpus) = locality(&bus.hwloc(), &g.cpus, g.numa);
            Some(GpuEntry {
                slurm_index: index,
                minor: Some(*minor),
                pci_bus_id: bus,
                uuid: Some(g.uuid.clone()),
                numa_nodes,
                cpus,
                mig_uuids: g.mig_uuids.clone(),
            })
        })
        .collect();
    GpuTable { gpus, machine: Some(topo.clone()) }
}

/// Writes `text` to `dir/name` root-owned, mode 0644, through a temporary file
/// and a rename.
fn write_atomic(dir: &Path, name: &str, text: &str) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("{}: {e}", dir.join(name).display());
    fs::create_dir_all(dir).map_err(fail)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).map_err(fail)?;
    let options = Options { mode: Some(0o644), durable: true };
    atomic_file::write(&dir.join(name), text.as_bytes(), options).map_err(fail)
}

/// Makes the table for this node and, with `write`, stores it in
/// `cfg.topology_dir`. `xml` overrides the configured XML source.
///
/// # Errors
/// No topology, or a table that could not be written. NVML or slurmd being
/// unavailable is not an error when an XML file is given: the table is then
/// made from the XML alone.
pub fn make(cfg: &Config, xml: Option<&Path>, write: bool) -> Result<(GpuTable, Vec<String>), String> {
    let mut notes = Vec::new();
    let xml_path: Option<PathBuf> = xml.map(Path::to_path_buf).or_else(|| cfg.topology_xml.clone());
    let topo = {
        let hwloc = crate::sources::machine::load(xml_path.as_deref())?;
        crate::sources::machine::from_hwloc(&hwloc)?
    };
    let nvml = match nvml_gpus(&cfg.nvml_library) {
        Ok(g) => Some(g),
        Err(e) if xml_path.is_some() => {
            notes.push(format!("{e}; the table comes from the XML alone"));
            None
        }
        Err(e) => return Err(e),
    };
    notes.extend(nvml.iter().flatten().filter_map(|g| g.mig_error.clone()));
    let minors = match slurm_order(cfg, slurm_gpu_minors(&cfg.slurmd)) {
        Ok(Order::Slurm(m)) => Some(m),
        Ok(Order::Minor(why)) => {
            notes.push(why);
            None
        }
        Err(e) if nvml.is_some() => return Err(e),
        Err(e) => {
            notes.push(e);
            None
        }
    };
    let table = build_table(&topo, nvml.as_deref(), minors.as_deref());
    if write {
        write_atomic(&cfg.topology_dir, TABLE_FILE, &table.to_text())?;
        // An older agent's hwloc XML: nothing reads it any more.
        let legacy = cfg.topology_dir.join(LEGACY_XML_FILE);
        match fs::remove_file(&legacy) {
            Ok(()) => notes.push(format!("removed {}, which nothing reads since table v3", legacy.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => notes.push(format!("cannot remove {}: {e}", legacy.display())),
        }
    }
    Ok((table, notes))
}

/// The GPUs Slurm configures on this node (`expected_gpus`, else the node's
/// `Gres=`, physical GPUs and MIG slices); `None` when Slurm cannot be asked.
fn configured_gpus(cfg: &Config) -> Option<u32> {
    if let Some(n) = cfg.expected_gpus {
        return Some(n);
    }
    let names = match &cfg.node_name {
        Some(n) => vec![n.clone()],
        None => crate::agent::node_name_candidates(&crate::agent::host_name()),
    };
    let slurm = crate::slurm::Slurm { scontrol: cfg.scontrol.clone(), timeout: cfg.scontrol_timeout };
    let node = slurm.find_node(&names).ok()?;
    Some(node.gres_gpus.unwrap_or(0).saturating_add(node.gres_mig))
}

/// The order of the GPU table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Order {
    /// Slurm's: the minors of its device files in its index order.
    Slurm(Vec<u32>),
    /// NVML's minor order, and why (a note for the log).
    Minor(String),
}

/// Slurm's GPU order from what `slurmd -G -v` said. The minor order where
/// Slurm configures no GPU here, or cannot be asked (with a note); an error
/// when Slurm configures GPUs here and slurmd listed none or could not run:
/// a table in NVML's order would bind tasks to other GPUs' CPUs wherever
/// the orders differ, silently.
///
/// # Errors
/// As said.
pub fn slurm_order(cfg: &Config, listed: Result<Vec<u32>, String>) -> Result<Order, String> {
    let why = match listed {
        Ok(m) if !m.is_empty() => return Ok(Order::Slurm(m)),
        Ok(_) => format!("`{} -G -v` printed no GPU line", cfg.slurmd.display()),
        Err(e) => e,
    };
    match configured_gpus(cfg) {
        Some(0) => Ok(Order::Minor(format!(
            "Slurm configures no GPU on this node ({why}); the table is in the minor order"
        ))),
        Some(n) => Err(format!(
            "Slurm's GPU order is unknown: {why}, but Slurm configures {n} GPU(s) on this node; the GPU table is not \
             written (in NVML's minor order it could bind tasks to other GPUs' CPUs). Run `slurmd -G -v` by hand and check gres.conf"
        )),
        None => Ok(Order::Minor(format!(
            "Slurm's GPU order unknown ({why}; Slurm could not be asked what this node has); using the minor order"
        ))),
    }
}

static TABLE_STATE: AtomicU8 = AtomicU8::new(0);

/// The daemon's GPU table: `Some(true)` written in Slurm's order,
/// `Some(false)` not written; `None` before (or without) a try.
pub fn table_state() -> Option<bool> {
    match TABLE_STATE.load(Ordering::SeqCst) {
        1 => Some(true),
        2 => Some(false),
        _ => None,
    }
}

/// How long making the table may take before it is given up (NVML or hwloc
/// hanging): four NVML deadlines and 10 s for hwloc and `slurmd -G`.
pub fn deadline(cfg: &Config) -> Duration {
    cfg.nvml_timeout * 4 + Duration::from_secs(10)
}

/// The `--config FILE` of this process's command line, for a child that must
/// read the same configuration.
pub fn config_arg(args: impl IntoIterator<Item = OsString>) -> Option<PathBuf> {
    let mut args = args.into_iter().skip(1);
    while let Some(a) = args.next() {
        if a == "--config" {
            return args.next().map(PathBuf::from);
        }
    }
    None
}

/// This program's file, also after a package upgrade replaced it (Linux then
/// names the running, unlinked one `... (deleted)`; the new one is at the old path).
fn own_program() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program's file: {e}"))?;
    let text = exe.to_string_lossy();
    Ok(text.strip_suffix(" (deleted)").map_or(exe.clone(), PathBuf::from))
}

/// The daemon's way to write the table: `gpu-node-agent [--config FILE]
/// topology --write` in a child process, killed past [`deadline`]. The child
/// loads hwloc (without its vendor plugins, which it does not even open) and
/// NVML for its few milliseconds; the daemon never maps hwloc's plugins and
/// keeps none of their memory or threads. Returns the GPUs in the table and
/// the child's notes.
///
/// # Errors
/// The child cannot start, fails (its error line), or passes the deadline.
pub fn write_in_child(cfg: &Config) -> Result<(usize, Vec<String>), String> {
    let mut cmd = Command::new(own_program()?);
    if let Some(config) = config_arg(std::env::args_os()) {
        cmd.arg("--config").arg(config);
    }
    let blacklist = match std::env::var("HWLOC_PLUGINS_BLACKLIST") {
        Ok(v) if !v.is_empty() => format!("{v},{VENDOR_PLUGINS}"),
        _ => VENDOR_PLUGINS.to_owned(),
    };
    cmd.args(["topology", "--write"])
        .env("HWLOC_PLUGINS_BLACKLIST", blacklist)
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    // The child's stderr is read on a thread so a chatty child never blocks.
    let (tx, rx) = mpsc::channel();
    if let Some(mut stderr) = child.stderr.take() {
        let spawned = std::thread::Builder::new().name("topology-err".to_owned()).spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            let _ = tx.send(text);
        });
        if let Err(e) = spawned {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("cannot start a thread: {e}"));
        }
    }
    let limit = deadline(cfg);
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < limit => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "no answer within {limit:?} (NVML or hwloc hanging?); the child was killed"
                ));
            }
            Err(e) => return Err(format!("waiting for the topology child: {e}")),
        }
    };
    let stderr = rx.recv_timeout(Duration::from_secs(1)).unwrap_or_default();
    let (notes, error) = child_messages(&stderr);
    if !status.success() {
        return Err(error.unwrap_or_else(|| format!("the topology child failed ({status})")));
    }
    let table = fs::read_to_string(cfg.topology_dir.join(TABLE_FILE))
        .map_err(|e| format!("{}: {e}", cfg.topology_dir.join(TABLE_FILE).display()))?;
    let table = GpuTable::parse(&table).map_err(|e| format!("the written table: {e}"))?;
    Ok((table.gpus.len(), notes))
}

/// The notes and the error line in the stderr of `topology --write`.
fn child_messages(stderr: &str) -> (Vec<String>, Option<String>) {
    let mut notes = Vec::new();
    let mut error = None;
    for line in stderr.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(n) = line.strip_prefix("gpu-node-agent: note: ") {
            notes.push(n.to_owned());
        } else if let Some(e) = line.strip_prefix("gpu-node-agent: topology: ") {
            error = Some(e.to_owned());
        } else if !line.starts_with("gpu-node-agent: wrote ") {
            notes.push(line.to_owned());
        }
    }
    (notes, error)
}

/// Writes the GPU table from a thread of its own (NVML or hwloc hanging must
/// not keep the health checks from starting), logging the outcome. The flag
/// turns true when it is done, written or not.
pub fn spawn_writer(cfg: &Config) -> Arc<AtomicBool> {
    let done = Arc::new(AtomicBool::new(false));
    let (cfg, flag) = (cfg.clone(), Arc::clone(&done));
    let spawned = std::thread::Builder::new().name("topology".to_owned()).spawn(move || {
        match write_in_child(&cfg) {
            Ok((gpus, notes)) => {
                let unordered = notes.iter().any(|n| n.starts_with("Slurm's GPU order unknown"));
                for n in notes {
                    tracing::warn!(note = %n, "topology");
                }
                TABLE_STATE.store(if unordered { 2 } else { 1 }, Ordering::SeqCst);
                tracing::info!(gpus, dir = %cfg.topology_dir.display(), "GPU table written");
            }
            Err(e) => {
                TABLE_STATE.store(2, Ordering::SeqCst);
                tracing::error!(error = %e, "cannot write the GPU table; --gpu-affinity will not bind on this node");
            }
        }
        flag.store(true, Ordering::SeqCst);
    });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the topology thread");
        done.store(true, Ordering::SeqCst);
    }
    done
}

/// What `status` says about the table in `dir`: its version and what the
/// plugin makes of it, or why there is none it can use.
pub fn table_status(dir: &Path) -> String {
    let path = dir.join(TABLE_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return format!("none at {} (--gpu-affinity binds nothing here)", path.display());
        }
        Err(e) => return format!("UNREADABLE: {}: {e}", path.display()),
    };
    let version = text.lines().next().and_then(task_plan::gputable::version_of);
    match (version, GpuTable::parse(&text)) {
        (_, Err(e)) => format!("UNUSABLE: {}: {e} (--gpu-affinity binds nothing here)", path.display()),
        (Some(v), Ok(t)) => match &t.machine {
            Some(m) => format!(
                "v{v} at {}: {} GPU(s); the machine: {} NUMA node(s), {} core(s), {} allowed CPU(s)",
                path.display(),
                t.gpus.len(),
                m.numa_nodes.len(),
                m.cores.len(),
                m.allowed_cpus.len()
            ),
            None => format!(
                "v{v} at {}: {} GPU(s), no machine records (an older agent's): --gpu-affinity gives each task its \
                 GPUs' whole local CPUs, not a share, until `gpu-node-agent topology --write` rewrites it",
                path.display(),
                t.gpus.len()
            ),
        },
        (None, Ok(_)) => format!("{}: no version", path.display()),
    }
}

/// The table as JSON, for scripts.
pub fn to_json(table: &GpuTable) -> String {
    let rows: Vec<serde_json::Value> = table
        .gpus
        .iter()
        .map(|g| {
            serde_json::json!({
                "slurm_index": g.slurm_index,
                "minor": g.minor,
                "pci_bus_id": g.pci_bus_id.hwloc(),
                "uuid": g.uuid,
                "numa_nodes": g.numa_nodes,
                "cpus": g.cpus.to_string(),
                "mig": g.mig_uuids,
            })
        })
        .collect();
    serde_json::Value::Array(rows).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const XML: &str =
        include_str!("../../../plan/tests/fixtures/topologies/fluxcore_ipa20_dell-xe8640-4xH100.xml");

    #[test]
    fn gres_files_are_expanded_in_slurms_order() {
        let text = "slurmd: Gres Name=gpu Type=h100 Count=4 Index=0 ID=7696487 File=/lab/cdev/nvidia[4-7] (null)\n\
                    slurmd: Gres Name=gpu Type=h100 Count=4 Index=0 ID=7696487 File=/lab/cdev/nvidia[0-3] (null)\n\
                    slurmd: Gres Name=mps Count=100 File=/dev/nvidia0\n";
        let files = gres_gpu_files(text).unwrap();
        assert_eq!(files.first().map(String::as_str), Some("/lab/cdev/nvidia4"));
        assert_eq!(files.len(), 8);
        assert_eq!(files[4], "/lab/cdev/nvidia0");
    }

    #[test]
    fn mig_records_keep_the_gpus_own_order() {
        // Each MIG device is a record naming its parent's file and its MIG
        // capability files.
        let text = "slurmd: Gres Name=gpu Type=1g.10gb Count=1 Index=0 File=/dev/nvidia1,/dev/nvidia-caps/nvidia-cap21,/dev/nvidia-caps/nvidia-cap22 UniqueId=MIG-a\n\
                    slurmd: Gres Name=gpu Type=1g.10gb Count=1 Index=1 File=/dev/nvidia1,/dev/nvidia-caps/nvidia-cap30,/dev/nvidia-caps/nvidia-cap31 UniqueId=MIG-b\n\
                    slurmd: Gres Name=gpu Type=h100 Count=1 Index=2 File=/dev/nvidia0\n";
        assert_eq!(gres_gpu_files(text).unwrap(), vec!["/dev/nvidia1", "/dev/nvidia0"]);
    }

    #[test]
    fn the_table_carries_nvmls_mig_devices() {
        let topo = crate::sources::machine::from_xml_text(XML).unwrap();
        let offline = build_table(&topo, None, None);
        let mut nvml = nvml_of(&offline);
        nvml[2].mig_uuids = vec!["MIG-2a".into(), "MIG-2b".into()];
        let t = build_table(&topo, Some(&nvml), Some(&[2, 0, 1, 3]));
        assert_eq!(t.gpus[0].mig_uuids, vec!["MIG-2a", "MIG-2b"]);
        assert!(t.gpus[1..].iter().all(|g| g.mig_uuids.is_empty()));
        let back = GpuTable::parse(&t.to_text()).unwrap();
        assert_eq!(back.by_uuid("MIG-2b").map(|g| g.slurm_index), Some(0));
        assert_eq!(back.by_uuid("MIG-2b").map(|g| &g.cpus), Some(&offline.gpus[2].cpus));
    }

    #[test]
    fn the_child_gets_the_same_config_file() {
        let args = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            config_arg(args(&["agent", "--config", "/etc/x.toml", "run"])),
            Some("/etc/x.toml".into())
        );
        assert_eq!(config_arg(args(&["agent", "run", "--config", "c"])), Some("c".into()));
        assert_eq!(config_arg(args(&["agent", "run"])), None);
        // The program's own name is never taken for the option.
        assert_eq!(config_arg(args(&["--config", "run"])), None);
    }

    #[test]
    fn the_childs_notes_and_error_are_told_apart() {
        let (notes, error) = child_messages(
            "gpu-node-agent: note: Slurm's GPU order unknown (x); using the minor order\n\
             gpu-node-agent: wrote /var/lib/gpu-node-agent/topology\n",
        );
        assert_eq!(notes, vec!["Slurm's GPU order unknown (x); using the minor order"]);
        assert_eq!(error, None);
        let (_, error) = child_messages("gpu-node-agent: topology: NVML: Uninitialized\n");
        assert_eq!(error.as_deref(), Some("NVML: Uninitialized"));
    }

    /// Issue 22: `slurmd -G` prints at whatever level its release gives `-G`
    /// (`SlurmdDebug` on some): the agent runs it with `-v`, and a node whose
    /// Slurm config has GPUs but whose slurmd lists none gets no table in
    /// NVML's order, but an error.
    #[test]
    fn slurmd_is_run_so_it_always_prints_and_no_gpu_line_is_an_error() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("agent-topo-slurmd-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let slurmd = dir.join("slurmd");
        // Like a slurmd whose log level hides the GRES lines unless raised on the command line.
        fs::write(
            &slurmd,
            "#!/bin/sh\n[ \"$*\" = \"-G -v\" ] && echo 'slurmd: Gres Name=gpu Type=h100 Count=1 Index=0 ID=7696487 File=/dev/null (null)'\nexit 0\n",
        )
        .unwrap();
        fs::set_permissions(&slurmd, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(slurm_gpu_minors(&slurmd), Ok(vec![3]), "/dev/null is minor 3");
        let cfg = |gpus: Option<u32>| Config {
            expected_gpus: gpus,
            scontrol: "/bin/false".into(),
            slurmd: "/bin/true".into(),
            ..Config::default()
        };
        assert_eq!(slurm_order(&cfg(Some(8)), Ok(vec![2, 0])), Ok(Order::Slurm(vec![2, 0])));
        let e = slurm_order(&cfg(Some(8)), Ok(Vec::new())).unwrap_err();
        assert!(
            e.contains("printed no GPU line")
                && e.contains("configures 8 GPU(s)")
                && e.contains("not written"),
            "{e}"
        );
        assert!(slurm_order(&cfg(Some(8)), Err("slurmd: no such file".into())).is_err());
        assert!(matches!(slurm_order(&cfg(Some(0)), Ok(Vec::new())), Ok(Order::Minor(_))));
        // Slurm cannot be asked: the minor order, with a note that says so.
        let Ok(Order::Minor(note)) = slurm_order(&cfg(None), Ok(Vec::new())) else { panic!() };
        assert!(note.starts_with("Slurm's GPU order unknown"), "{note}");
        let failed = dir.join("failing-slurmd");
        fs::write(&failed, "#!/bin/sh\necho 'slurmd: error: slurmd initialization failed' >&2\nexit 1\n")
            .unwrap();
        fs::set_permissions(&failed, fs::Permissions::from_mode(0o755)).unwrap();
        let e = slurm_gpu_minors(&failed).unwrap_err();
        assert!(e.contains("failed (exit status: 1): slurmd: error: slurmd initialization failed"), "{e}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn device_minor_decodes_rdev() {
        assert_eq!(device_minor((195 << 8) | 3), 3);
        // makedev(195, 300) as glibc encodes it.
        let rdev = (195u64 << 8) | (0x100 << 12) | 0x2c;
        assert_eq!(device_minor(rdev), 300);
    }

    #[test]
    fn offline_table_from_the_xe8640_xml() {
        let topo = crate::sources::machine::from_xml_text(XML).unwrap();
        let t = build_table(&topo, None, None);
        assert_eq!(t.gpus.len(), 4);
        // GPUs are not in NUMA order on this machine.
        let numa: Vec<Vec<u32>> = t.gpus.iter().map(|g| g.numa_nodes.clone()).collect();
        assert_eq!(numa.iter().flatten().count(), 4);
        assert!(t.gpus.iter().all(|g| g.minor.is_none() && !g.cpus.is_empty()));
    }

    /// What NVML would say about the GPUs of an offline table: minor = its
    /// place, `GPU-<minor>`, and a fallback locality (CPU 0) that the XML's wins over.
    fn nvml_of(offline: &GpuTable) -> Vec<NvmlGpu> {
        offline
            .gpus
            .iter()
            .zip(0u32..)
            .map(|(g, minor)| NvmlGpu {
                minor,
                bus_id: g.pci_bus_id,
                uuid: format!("GPU-{minor}"),
                cpus: CpuSet::parse("0").unwrap(),
                numa: Some(0),
                mig_uuids: Vec::new(),
                mig_error: None,
            })
            .collect()
    }

    #[test]
    fn slurm_order_wins_over_minor_order() {
        let topo = crate::sources::machine::from_xml_text(XML).unwrap();
        let offline = build_table(&topo, None, None);
        let nvml = nvml_of(&offline);
        let t = build_table(&topo, Some(&nvml), Some(&[3, 2, 1, 0]));
        assert_eq!(t.gpus[0].minor, Some(3));
        assert_eq!(t.gpus[0].uuid.as_deref(), Some("GPU-3"));
        // Locality comes from the XML for a bus id it knows, not NVML's fallback.
        assert_eq!(t.gpus[0].cpus, offline.gpus[3].cpus);
        let by_minor = build_table(&topo, Some(&nvml), None);
        assert_eq!(by_minor.gpus[0].minor, Some(0));
    }

    #[test]
    fn status_says_which_table_version_is_there() {
        let dir = std::env::temp_dir().join(format!("agent-topo-status-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        assert!(table_status(&dir).starts_with("none at "), "{}", table_status(&dir));
        let v3 = build_table(&crate::sources::machine::from_xml_text(XML).unwrap(), None, None);
        fs::write(dir.join(TABLE_FILE), v3.to_text()).unwrap();
        let said = table_status(&dir);
        assert!(said.starts_with("v3 at ") && said.contains("4 GPU(s); the machine: "), "{said}");
        let v2 = GpuTable { machine: None, ..v3 };
        fs::write(dir.join(TABLE_FILE), v2.to_text()).unwrap();
        let said = table_status(&dir);
        assert!(said.starts_with("v2 at ") && said.contains("no machine records"), "{said}");
        fs::write(dir.join(TABLE_FILE), "# spank-gpu gpu table v3\n").unwrap();
        assert!(table_status(&dir).starts_with("UNUSABLE: "), "{}", table_status(&dir));
        let _ = fs::remove_dir_all(&dir);
    }
}
