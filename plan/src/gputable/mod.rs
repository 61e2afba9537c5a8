//! The node's GPU table: written by `gpu-node-agent topology --write`, read by
//! the plugin before every step forks its tasks. It is all the plugin reads
//! about the node: the GPUs in Slurm's order and, since version 3, the
//! machine the binding plans on (from hwloc's object API, in the agent). The
//! plugin links no XML parser.
//!
//! A small tab-separated text file (fields separated by single tabs; `#`
//! lines and empty lines are comments). Version 3:
//!
//! ```text
//! # spank-gpu gpu table v3
//! # slurm_index  minor  pci_bus_id    uuid                                      numa  cpus            mig
//! 0  4  0000:9d:00.0  GPU-5f1c0a04-7d2e-4b1a-9c3e-000000000004  1  56-111,168-223  MIG-0c6e5b3a-...,MIG-...
//! @allowed  0-223
//! @numa     0  0-55,112-167
//! @numa     1  56-111,168-223
//! @numa     255  -
//! @cores    0,112 1,113 2,114 ... 111,223
//! @pci      0000:9d:00.0  10de  2330  0302  1  56-111,168-223  cuda0,nvml0
//! ```
//!
//! **GPU rows** (a line that starts with a digit), one per GPU in Slurm's
//! index order: `numa` is a list of NUMA node numbers (`-` when unknown),
//! `cpus` the CPUs local to the GPU, `mig` the UUIDs (`MIG-<uuid>`, the form
//! drivers since 470.42 give and Slurm puts in `CUDA_VISIBLE_DEVICES`) of the
//! GPU's MIG devices, comma-separated, `-` when it has none. A MIG device
//! binds like its parent GPU.
//!
//! **Machine records** (a line that starts with `@`): the
//! [`Topology`](crate::topology::Topology) the binding plans on, as hwloc
//! reports it ([`crate::topology`] says what each part means):
//!
//! * `@allowed CPUS`, once: the CPUs the machine allows;
//! * `@numa N CPUS`, one per NUMA node in increasing `N` (`-` for a node
//!   without CPUs: GPU or CXL memory);
//! * `@cores CORE CORE ...`, once: each core's CPUs (its SMT siblings) as a
//!   CPU list, cores separated by single spaces in order of their lowest CPU,
//!   no CPU in two cores (`-` for none);
//! * `@pci BUS VENDOR DEVICE CLASS NUMA CPUS NAMES`, one per display-class PCI
//!   device (class `0x03xx`, every vendor) in bus id order: ids as 4 hex
//!   digits, its NUMA nodes and local CPUs (`-` when none), its OS device
//!   names comma-separated (`-` when none).
//!
//! A 2-socket, 224-thread node with 4 GPUs makes a table of about 1.5 KiB.
//!
//! **Versions.** The header names the version; a version this reader does
//! not know is refused. Version 2 is the same without machine records, and
//! version 1 the same without the `mig` column: both are still read, so a
//! node keeps binding after the plugin is upgraded and before its agent
//! rewrites the table (it does at start). Without machine records the plugin
//! binds from the GPU rows alone ([`machine::from_gpu_rows`]): each task gets
//! its GPUs' whole local CPUs rather than a share of them, SMT siblings are
//! never split only because the table has no cores, and `mem` prefers the
//! GPU rows' NUMA nodes. `--gpu-affinity=verbose` and `spank-gpu explain` say
//! so. The plugin never reads the hwloc XML (`topology.xml`) that agents
//! before version 3 wrote beside the table; the agent removes it.
//!
//! **Untrusted input.** The file is read by every step on the node, as root,
//! so parsing is strict and bounded: the size is capped ([`MAX_BYTES`]),
//! every list and count has a limit, records must be in order, and any
//! malformed line rejects the whole table (the plugin then binds nothing and
//! says why).

use std::fmt;

use crate::topology::Topology;
use slurm_formats::cpuset::CpuSet;
use slurm_formats::pci::PciAddr;

pub mod machine;

/// The first line of every table this version writes.
pub const HEADER: &str = "# spank-gpu gpu table v3";
/// The first line of a version 2 table (no machine records), still read.
pub const HEADER_V2: &str = "# spank-gpu gpu table v2";
/// The first line of a version 1 table (no `mig` column, no machine records), still read.
pub const HEADER_V1: &str = "# spank-gpu gpu table v1";
/// Largest table accepted, in bytes.
pub const MAX_BYTES: usize = 1 << 20;
/// Where `gpu-node-agent` writes the table and the plugin reads it, unless
/// configured otherwise (the agent's and the plugstack's `topology_dir`).
pub const DEFAULT_DIR: &str = "/var/lib/gpu-node-agent/topology";
/// The table's file name in that directory.
pub const TABLE_FILE: &str = "gpus.tsv";
/// The hwloc XML that agents before table version 3 wrote beside the table.
/// Nothing reads it any more; `gpu-node-agent topology --write` removes it.
pub const LEGACY_XML_FILE: &str = "topology.xml";
/// Most GPUs in a table.
pub const MAX_GPUS: usize = 1024;
/// Most MIG devices of one GPU (NVIDIA's largest MIG GPUs have 7).
pub const MAX_MIG_PER_GPU: usize = 64;

/// One GPU as the node sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuEntry {
    /// Slurm's index of the GPU on this node (`SLURM_STEP_GPUS`, `CUDA_VISIBLE_DEVICES`).
    pub slurm_index: u32,
    /// `/dev/nvidiaN` minor number, when known.
    pub minor: Option<u32>,
    /// PCI bus id, `0000:1b:00.0`.
    pub pci_bus_id: PciAddr,
    /// `GPU-...`, when known.
    pub uuid: Option<String>,
    /// NUMA nodes local to the GPU.
    pub numa_nodes: Vec<u32>,
    /// CPUs local to the GPU.
    pub cpus: CpuSet,
    /// The UUIDs (`MIG-<uuid>`) of the GPU's MIG devices; empty when MIG is
    /// off, unsupported or unknown.
    pub mig_uuids: Vec<String>,
}

/// The whole table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuTable {
    /// In Slurm index order.
    pub gpus: Vec<GpuEntry>,
    /// The machine (version 3's machine records); `None` in a table of
    /// version 1 or 2, and then [`GpuTable::topology`] makes do with the rows.
    pub machine: Option<Topology>,
}

/// A table that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableError {
    /// What is wrong.
    pub kind: TableErrorKind,
    /// What is wrong, in words (`line 3: ...` for a line's fault).
    pub detail: String,
}

/// What is wrong with a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableErrorKind {
    /// Over [`MAX_BYTES`].
    TooLarge,
    /// The first line is not a header this version reads.
    Header,
    /// A line (numbered from 1) has a bad field or the wrong number of fields.
    Malformed {
        /// The line's number.
        line: usize,
    },
    /// A line repeats a GPU index or a MIG UUID.
    Duplicate {
        /// The line's number.
        line: usize,
    },
    /// A line goes over the GPU, MIG device or machine record limits.
    TooMany {
        /// The line's number.
        line: usize,
    },
    /// A version 3 table without its `@allowed` or `@cores` record.
    Incomplete,
}

impl TableError {
    fn new(kind: TableErrorKind, detail: String) -> TableError {
        TableError { kind, detail }
    }

    fn at_line(line: usize, kind: fn(usize) -> TableErrorKind, why: &str) -> TableError {
        TableError::new(kind(line), format!("line {line}: {why}"))
    }
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad GPU table: {}", self.detail)
    }
}

impl std::error::Error for TableError {}

pub(crate) fn list(nums: &[u32]) -> String {
    if nums.is_empty() {
        return "-".to_owned();
    }
    nums.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

impl GpuTable {
    /// The GPU with Slurm index `index`.
    pub fn by_index(&self, index: u32) -> Option<&GpuEntry> {
        self.gpus.iter().find(|g| g.slurm_index == index)
    }

    /// The GPU with this UUID: `GPU-...` itself, or the parent GPU of a MIG
    /// device, named the new way (`MIG-<uuid>`, found in the `mig` column) or
    /// the legacy way (`MIG-GPU-<parent uuid>/<gi>/<ci>`, drivers before 470.42).
    pub fn by_uuid(&self, uuid: &str) -> Option<&GpuEntry> {
        if let Some(g) = self.gpus.iter().find(|g| g.uuid.as_deref() == Some(uuid)) {
            return Some(g);
        }
        if !is_mig(uuid) {
            return None;
        }
        if let Some(g) = self.gpus.iter().find(|g| g.mig_uuids.iter().any(|m| m == uuid)) {
            return Some(g);
        }
        let legacy = uuid.strip_prefix("MIG-").filter(|m| m.starts_with("GPU-") && m.contains('/'))?;
        let parent = legacy.split('/').next()?;
        self.gpus.iter().find(|g| g.uuid.as_deref() == Some(parent))
    }

    /// The machine the binding plans on, and whether it is only what the
    /// GPU rows tell ([`machine::from_gpu_rows`]: a table of version 1 or 2,
    /// whose plans are degraded as the module documentation says).
    pub fn topology(&self) -> (std::borrow::Cow<'_, Topology>, bool) {
        match &self.machine {
            Some(m) => (std::borrow::Cow::Borrowed(m), false),
            None => (std::borrow::Cow::Owned(machine::from_gpu_rows(self)), true),
        }
    }

    /// The table's text: version 3 with the machine, version 2 without (the
    /// agent always has the machine; the version 2 form is for the tests of
    /// the plugin's fallback).
    pub fn to_text(&self) -> String {
        let header = if self.machine.is_some() { HEADER } else { HEADER_V2 };
        let mut out = format!("{header}\n# slurm_index\tminor\tpci_bus_id\tuuid\tnuma\tcpus\tmig\n");
        for g in &self.gpus {
            let minor = g.minor.map_or("-".to_owned(), |m| m.to_string());
            let uuid = g.uuid.as_deref().unwrap_or("-");
            let cpus = if g.cpus.is_empty() { "-".to_owned() } else { g.cpus.to_string() };
            let mig = if g.mig_uuids.is_empty() { "-".to_owned() } else { g.mig_uuids.join(",") };
            out.push_str(&format!(
                "{}\t{minor}\t{}\t{uuid}\t{}\t{cpus}\t{mig}\n",
                g.slurm_index,
                g.pci_bus_id,
                list(&g.numa_nodes)
            ));
        }
        if let Some(m) = &self.machine {
            machine::write(m, &mut out);
        }
        out
    }

    /// Parses a table.
    ///
    /// Reads version 3 tables, and version 2 (no machine records) and
    /// version 1 ones (no `mig` column either).
    ///
    /// # Errors
    /// A missing header, a malformed line (named by number), a repeated
    /// index or MIG UUID, or a table over the size limits.
    pub fn parse(text: &str) -> Result<GpuTable, TableError> {
        if text.len() > MAX_BYTES {
            return Err(TableError::new(
                TableErrorKind::TooLarge,
                format!("{} bytes, over the {MAX_BYTES}-byte limit", text.len()),
            ));
        }
        let mut lines = text.lines();
        let first = lines.next().map(str::trim_end);
        let Some(version) = first.and_then(version_of) else {
            return Err(TableError::new(
                TableErrorKind::Header,
                format!(
                    "the first line is not '{HEADER}' (or '{HEADER_V2}', '{HEADER_V1}'); rewrite it with `gpu-node-agent topology --write`"
                ),
            ));
        };
        let fields = if version == 1 { 6 } else { 7 };
        let mut records = (version >= 3).then(machine::Records::default);
        let mut gpus: Vec<GpuEntry> = Vec::new();
        for (n, line) in lines.enumerate() {
            let line = line.trim_end();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let line_no = n + 2;
            if line.starts_with('@') {
                let Some(records) = records.as_mut() else {
                    let why = format!("a machine record in a version {version} table");
                    return Err(TableError::at_line(
                        line_no,
                        |line| TableErrorKind::Malformed { line },
                        &why,
                    ));
                };
                records.read(line_no, &line.split('\t').collect::<Vec<_>>())?;
                continue;
            }
            let err =
                |why: String| TableError::at_line(line_no, |line| TableErrorKind::Malformed { line }, &why);
            let dup =
                |why: String| TableError::at_line(line_no, |line| TableErrorKind::Duplicate { line }, &why);
            let too_many =
                |why: String| TableError::at_line(line_no, |line| TableErrorKind::TooMany { line }, &why);
            let f: Vec<&str> = line.split('\t').collect();
            let (index, minor, bus, uuid, numa, cpus, mig) = match f.as_slice() {
                [a, b, c, d, e, g] if fields == 6 => (a, b, c, d, e, g, &"-"),
                [a, b, c, d, e, g, m] if fields == 7 => (a, b, c, d, e, g, m),
                _ => return Err(err(format!("expected {fields} tab-separated fields, got {}", f.len()))),
            };
            let num = |s: &str, what: &str| {
                s.parse::<u32>().map_err(|_| err(format!("{what} '{s}' is not a number")))
            };
            let slurm_index = num(index, "index")?;
            let minor = if *minor == "-" { None } else { Some(num(minor, "minor")?) };
            let Ok(pci_bus_id) = PciAddr::parse_with_function(bus) else {
                return Err(err(format!("'{}' is not a PCI bus id", slurm_formats::text::clip(bus, 40))));
            };
            let uuid = match *uuid {
                "-" => None,
                u if u.len() <= 96 && u.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') => {
                    Some(u.to_owned())
                }
                u => return Err(err(format!("'{u}' is not a GPU UUID"))),
            };
            let numa_nodes = if *numa == "-" {
                Vec::new()
            } else {
                numa.split(',').map(|s| num(s, "NUMA node")).collect::<Result<Vec<_>, _>>()?
            };
            let cpus = if *cpus == "-" {
                CpuSet::new()
            } else {
                CpuSet::parse(cpus).map_err(|e| err(e.to_string()))?
            };
            let mig_uuids = mig_list(mig, line_no)?;
            if gpus.iter().any(|g| g.slurm_index == slurm_index) {
                return Err(dup(format!("index {slurm_index} appears twice")));
            }
            if let Some(m) = mig_uuids.iter().find(|m| gpus.iter().any(|g| g.mig_uuids.contains(m))) {
                return Err(dup(format!("MIG device {m} appears twice")));
            }
            if gpus.len() >= MAX_GPUS {
                return Err(too_many(format!("more than {MAX_GPUS} GPUs")));
            }
            gpus.push(GpuEntry { slurm_index, minor, pci_bus_id, uuid, numa_nodes, cpus, mig_uuids });
        }
        let machine = records.map(machine::Records::finish).transpose()?;
        Ok(GpuTable { gpus, machine })
    }
}

/// The version a table's first line names (1, 2 or 3), `None` for any other
/// line. For `gpu-node-agent status`, which says which version is there.
pub fn version_of(first_line: &str) -> Option<u32> {
    match first_line.trim_end() {
        HEADER => Some(3),
        HEADER_V2 => Some(2),
        HEADER_V1 => Some(1),
        _ => None,
    }
}

/// Whether a `CUDA_VISIBLE_DEVICES` entry names a MIG device (`MIG-<uuid>`,
/// or the legacy `MIG-GPU-<uuid>/<gi>/<ci>`).
pub fn is_mig(entry: &str) -> bool {
    entry.starts_with("MIG-")
}

/// Whether `text` is a new-style MIG UUID as the table stores it.
fn is_mig_uuid(text: &str) -> bool {
    text.len() > 4
        && text.len() <= 96
        && text.starts_with("MIG-")
        && !text.starts_with("MIG-GPU-")
        && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// The `mig` column of line `line`: `-`, or MIG UUIDs separated by commas.
fn mig_list(text: &str, line: usize) -> Result<Vec<String>, TableError> {
    if text == "-" {
        return Ok(Vec::new());
    }
    let mut out: Vec<String> = Vec::new();
    for m in text.split(',') {
        if !is_mig_uuid(m) {
            let why = format!("'{m}' in the mig column is not a MIG UUID (MIG-<uuid>)");
            return Err(TableError::at_line(line, |line| TableErrorKind::Malformed { line }, &why));
        }
        if out.iter().any(|o| o == m) {
            let why = format!("MIG device {m} appears twice");
            return Err(TableError::at_line(line, |line| TableErrorKind::Duplicate { line }, &why));
        }
        if out.len() >= MAX_MIG_PER_GPU {
            let why = format!("more than {MAX_MIG_PER_GPU} MIG devices on one GPU");
            return Err(TableError::at_line(line, |line| TableErrorKind::TooMany { line }, &why));
        }
        out.push(m.to_owned());
    }
    Ok(out)
}

/// Which Slurm GPU indices each local task of a step uses, from what Slurm
/// gave this task.
///
/// - `step_gpus`: the step's GPUs on this node (`SLURM_STEP_GPUS`, Slurm indices).
/// - `visible`: this task's `CUDA_VISIBLE_DEVICES` as indices.
///
/// When the task sees every GPU of the step, the tasks share them by the
/// usual `set_device(LOCAL_RANK)` convention: local task `i` of `n` takes the
/// `i`-th even share, in order. When Slurm bound GPUs per task
/// (`--gpus-per-task`), task `i` has the `i`-th block of the step's GPUs, and
/// this task's own block must be what it sees; otherwise the peers are unknown
/// and `None` is returned for them.
///
/// `visible` indices that are not in `step_gpus` are read as positions in it
/// (Slurm renumbers `CUDA_VISIBLE_DEVICES` from 0 when the devices are
/// constrained by cgroups).
pub fn task_gpus(
    step_gpus: &[u32],
    visible: &[u32],
    local_id: u32,
    local_tasks: u32,
) -> Vec<Option<Vec<u32>>> {
    let tasks = local_tasks.max(1) as usize;
    let me = local_id as usize;
    let absolute: Vec<u32> = if visible.iter().all(|v| step_gpus.contains(v)) {
        visible.to_vec()
    } else {
        visible.iter().filter_map(|v| step_gpus.get(*v as usize).copied()).collect()
    };
    let n = step_gpus.len();
    let mut out = vec![None; tasks];
    if n == 0 {
        return out;
    }
    if absolute.len() == n && absolute.iter().all(|g| step_gpus.contains(g)) {
        // Every task sees every GPU: even shares in order.
        for (i, slot) in out.iter_mut().enumerate() {
            let share: Vec<u32> = if tasks <= n {
                let (lo, hi) = (i * n / tasks, (i + 1) * n / tasks);
                step_gpus.get(lo..hi).map(<[u32]>::to_vec).unwrap_or_default()
            } else {
                step_gpus.get(i % n).map(|g| vec![*g]).unwrap_or_default()
            };
            *slot = Some(share);
        }
        return out;
    }
    let k = absolute.len();
    let block = |i: usize| step_gpus.get(i * k..(i + 1) * k).map(<[u32]>::to_vec);
    if k > 0 && block(me).as_deref() == Some(absolute.as_slice()) {
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = block(i);
        }
    } else if let Some(slot) = out.get_mut(me) {
        *slot = Some(absolute);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> GpuTable {
        GpuTable {
            gpus: vec![
                GpuEntry {
                    slurm_index: 0,
                    minor: Some(4),
                    pci_bus_id: "0000:9d:00.0".parse().unwrap(),
                    uuid: Some("GPU-aaaa".into()),
                    numa_nodes: vec![1],
                    cpus: CpuSet::parse("56-111,168-223").unwrap(),
                    mig_uuids: vec![MIG_A.into(), MIG_B.into()],
                },
                GpuEntry {
                    slurm_index: 1,
                    minor: None,
                    pci_bus_id: "0000:1b:00.0".parse().unwrap(),
                    uuid: None,
                    numa_nodes: vec![],
                    cpus: CpuSet::new(),
                    mig_uuids: vec![],
                },
            ],
            machine: None,
        }
    }

    const MIG_A: &str = "MIG-4b1f3c2e-9d0a-5e6f-8a7b-0c1d2e3f4a5b";
    const MIG_B: &str = "MIG-77e2a9d1-3b4c-5d6e-9f80-a1b2c3d4e5f6";

    #[test]
    fn round_trips_through_text() {
        let t = table();
        let text = t.to_text();
        assert!(text.starts_with(HEADER_V2), "no machine: version 2");
        assert_eq!(GpuTable::parse(&text).unwrap(), t);
    }

    #[test]
    fn looks_up_by_index_and_uuid_including_mig() {
        let t = table();
        assert_eq!(t.by_index(0).unwrap().minor, Some(4));
        assert_eq!(t.by_uuid("GPU-aaaa").unwrap().slurm_index, 0);
        assert_eq!(t.by_uuid("MIG-GPU-aaaa/1/0").unwrap().slurm_index, 0);
        assert!(t.by_uuid("GPU-zzzz").is_none());
        assert!(t.by_uuid("MIG-GPU-zzzz/1/0").is_none());
    }

    #[test]
    fn new_style_mig_uuids_find_their_parent_gpu() {
        let t = table();
        assert_eq!(t.by_uuid(MIG_A).unwrap().slurm_index, 0);
        assert_eq!(t.by_uuid(MIG_B).unwrap().uuid.as_deref(), Some("GPU-aaaa"));
        assert!(t.by_uuid("MIG-00000000-0000-0000-0000-000000000000").is_none());
        // A GPU UUID is never taken for a MIG device's, nor the other way round.
        assert!(t.by_uuid("MIG-aaaa").is_none());
        assert!(t.by_uuid(&MIG_A["MIG-".len()..]).is_none());
        assert!(is_mig(MIG_A) && is_mig("MIG-GPU-aaaa/1/0") && !is_mig("GPU-aaaa") && !is_mig("3"));
    }

    #[test]
    fn writes_v2_with_the_mig_column() {
        let text = table().to_text();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("# spank-gpu gpu table v2"));
        assert!(lines.next().unwrap().ends_with("\tcpus\tmig"));
        assert_eq!(lines.next().unwrap().rsplit('\t').next(), Some(format!("{MIG_A},{MIG_B}").as_str()));
        assert_eq!(lines.next().unwrap().rsplit('\t').next(), Some("-"));
    }

    #[test]
    fn a_v1_table_still_parses() {
        let v1 = "# spank-gpu gpu table v1\n\
                  # slurm_index\tminor\tpci_bus_id\tuuid\tnuma\tcpus\n\
                  0\t4\t0000:9d:00.0\tGPU-aaaa\t1\t56-111,168-223\n\
                  1\t-\t0000:1b:00.0\t-\t-\t-\n";
        let t = GpuTable::parse(v1).unwrap();
        let mut want = table();
        want.gpus[0].mig_uuids.clear();
        assert_eq!(t, want);
        assert_eq!(t.by_uuid("MIG-GPU-aaaa/1/0").unwrap().slurm_index, 0);
        // A v1 table has 6 fields: a 7th is an error, as a missing one is in v2.
        let e = GpuTable::parse(&format!("{HEADER_V1}\n0\t4\t0000:9d:00.0\t-\t1\t0-3\t-\n")).unwrap_err();
        assert_eq!(e.kind, TableErrorKind::Malformed { line: 2 });
        assert!(e.detail.starts_with("line 2: expected 6"), "{e}");
        let e = GpuTable::parse(&format!("{HEADER_V2}\n0\t4\t0000:9d:00.0\t-\t1\t0-3\n")).unwrap_err();
        assert_eq!(e.kind, TableErrorKind::Malformed { line: 2 });
        assert!(e.detail.starts_with("line 2: expected 7"), "{e}");
        let e = GpuTable::parse("# spank-gpu gpu table v4\n").unwrap_err();
        assert_eq!(e.kind, TableErrorKind::Header);
        assert!(e.detail.contains("first line"), "{e}");
    }

    #[test]
    fn malformed_mig_columns_are_rejected_with_the_line() {
        let row =
            |mig: &str| format!("{HEADER_V2}\n# comment\n0\t4\t0000:9d:00.0\tGPU-aaaa\t1\t0-3\t{mig}\n");
        for bad in [
            "",
            "MIG-",
            "GPU-aaaa",
            "MIG-GPU-aaaa/1/0",
            "MIG-GPU-aaaa",
            "MIG-a;rm -rf",
            "MIG-a,,MIG-b",
            "MIG-a,",
            "MIG-a,MIG-a",
            "-,MIG-a",
        ] {
            let e = GpuTable::parse(&row(bad)).unwrap_err();
            let want = if bad == "MIG-a,MIG-a" {
                TableErrorKind::Duplicate { line: 3 }
            } else {
                TableErrorKind::Malformed { line: 3 }
            };
            assert_eq!(e.kind, want, "{bad:?}: {e}");
            assert!(e.detail.starts_with("line 3:"), "{bad:?}: {e}");
        }
        let long = format!("MIG-{}", "a".repeat(93));
        assert_eq!(GpuTable::parse(&row(&long)).unwrap_err().kind, TableErrorKind::Malformed { line: 3 });
        let many = (0..=MAX_MIG_PER_GPU).map(|i| format!("MIG-{i}")).collect::<Vec<_>>().join(",");
        let e = GpuTable::parse(&row(&many)).unwrap_err();
        assert_eq!(e.kind, TableErrorKind::TooMany { line: 3 });
        assert!(e.detail.contains("more than"), "{e}");
        let ok = (0..MAX_MIG_PER_GPU).map(|i| format!("MIG-{i}")).collect::<Vec<_>>().join(",");
        assert_eq!(GpuTable::parse(&row(&ok)).unwrap().gpus[0].mig_uuids.len(), MAX_MIG_PER_GPU);
        // The same MIG device under two GPUs.
        let two = format!("{}1\t5\t0000:1b:00.0\t-\t0\t4-7\tMIG-x,{MIG_A}\n", row(MIG_A));
        let e = GpuTable::parse(&two).unwrap_err();
        assert_eq!(e.kind, TableErrorKind::Duplicate { line: 4 });
        assert!(e.detail.starts_with("line 4:") && e.detail.contains("twice"), "{e}");
    }

    #[test]
    fn rejects_bad_tables() {
        let good = table().to_text();
        assert_eq!(GpuTable::parse("").unwrap_err().kind, TableErrorKind::Header);
        let e = GpuTable::parse("0\t0\t0000:1b:00.0\t-\t0\t0-3\n").unwrap_err();
        assert_eq!(e.kind, TableErrorKind::Header, "no header");
        for bad in [
            "0\t0\t0000:1b:00.0\t-\t0\t-",
            "x\t0\t0000:1b:00.0\t-\t0\t0-3\t-",
            "0\t0\t../../etc\t-\t0\t0-3\t-",
            "0\t0\t0000:1b:00.0\tGPU-a;rm\t0\t0-3\t-",
            "0\t0\t0000:1b:00.0\t-\t0\t3-1\t-",
            "0\t0\t0000:1b:00.0\t-\tq\t0-3\t-",
            "0\t0\t0000:1b:00.0\t-\t0\t0-3\tGPU-b",
            "0\t0\t0000:1b:00.0\t-\t0\t0-3\t-\t-",
        ] {
            let e = GpuTable::parse(&format!("{HEADER_V2}\n{bad}\n")).unwrap_err();
            assert_eq!(e.kind, TableErrorKind::Malformed { line: 2 }, "{bad:?}: {e}");
        }
        let dup = format!("{good}0\t1\t0000:1c:00.0\t-\t0\t0-3\t-\n");
        let e = GpuTable::parse(&dup).unwrap_err();
        assert_eq!(e.kind, TableErrorKind::Duplicate { line: 5 }, "{e}");
        assert!(e.detail.contains("twice"), "{e}");
        assert_eq!(GpuTable::parse(&"#".repeat(MAX_BYTES + 1)).unwrap_err().kind, TableErrorKind::TooLarge);
    }

    #[test]
    fn shares_all_visible_gpus_by_local_rank() {
        let step = [0, 1, 2, 3, 4, 5, 6, 7];
        let got = task_gpus(&step, &step, 1, 4);
        assert_eq!(got, vec![Some(vec![0, 1]), Some(vec![2, 3]), Some(vec![4, 5]), Some(vec![6, 7])]);
        let got = task_gpus(&[0, 1], &[0, 1], 0, 4);
        assert_eq!(got, vec![Some(vec![0]), Some(vec![1]), Some(vec![0]), Some(vec![1])]);
    }

    #[test]
    fn per_task_binding_gives_blocks_in_order() {
        let step = [4, 5, 6, 7];
        assert_eq!(
            task_gpus(&step, &[6], 2, 4),
            vec![Some(vec![4]), Some(vec![5]), Some(vec![6]), Some(vec![7])]
        );
        // Renumbered by cgroups: CUDA_VISIBLE_DEVICES=2 is the third step GPU.
        assert_eq!(task_gpus(&step, &[2], 2, 4)[3], Some(vec![7]));
        // Not the expected block: only this task is known.
        assert_eq!(task_gpus(&step, &[7], 0, 2), vec![Some(vec![7]), None]);
        assert_eq!(task_gpus(&[], &[], 0, 2), vec![None, None]);
    }
}
