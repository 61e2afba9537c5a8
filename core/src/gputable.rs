//! The node's GPU table: written by `gpu-node-agent topology --write`, read by
//! the plugin before every step forks its tasks.
//!
//! A small tab-separated text file, one GPU per line, in Slurm's GPU index
//! order (the fields are separated by single tabs):
//!
//! ```text
//! # spank-gpu gpu table v1
//! # slurm_index  minor  pci_bus_id    uuid                                      numa  cpus
//! 0  4  0000:9d:00.0  GPU-5f1c0a04-7d2e-4b1a-9c3e-000000000004  1  56-111,168-223
//! ```
//!
//! `numa` is a list of NUMA node numbers (`-` when unknown), `cpus` the CPUs
//! local to the GPU. The file is read by every step on the node, so parsing
//! is strict and bounded: any malformed line rejects the whole table (the
//! plugin then binds nothing and says why).

use std::fmt;

use crate::cpuset::CpuSet;

/// The first line of every table.
pub const HEADER: &str = "# spank-gpu gpu table v1";
/// Largest table accepted, in bytes.
pub const MAX_BYTES: usize = 1 << 20;
/// Most GPUs in a table.
pub const MAX_GPUS: usize = 1024;

/// One GPU as the node sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuEntry {
    /// Slurm's index of the GPU on this node (`SLURM_STEP_GPUS`, `CUDA_VISIBLE_DEVICES`).
    pub slurm_index: u32,
    /// `/dev/nvidiaN` minor number, when known.
    pub minor: Option<u32>,
    /// PCI bus id, `0000:1b:00.0`.
    pub pci_bus_id: String,
    /// `GPU-...`, when known.
    pub uuid: Option<String>,
    /// NUMA nodes local to the GPU.
    pub numa_nodes: Vec<u32>,
    /// CPUs local to the GPU.
    pub cpus: CpuSet,
}

/// The whole table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuTable {
    /// In Slurm index order.
    pub gpus: Vec<GpuEntry>,
}

/// A table that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableError(pub String);

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad GPU table: {}", self.0)
    }
}

impl std::error::Error for TableError {}

fn list(nums: &[u32]) -> String {
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

    /// The GPU with this UUID (`GPU-...`; a MIG device's `MIG-GPU-<uuid>/...`
    /// names its parent GPU).
    pub fn by_uuid(&self, uuid: &str) -> Option<&GpuEntry> {
        let parent = uuid.strip_prefix("MIG-").and_then(|m| m.split('/').next()).unwrap_or(uuid);
        self.gpus.iter().find(|g| g.uuid.as_deref() == Some(parent))
    }

    /// The table's text.
    pub fn to_text(&self) -> String {
        let mut out = format!("{HEADER}\n# slurm_index\tminor\tpci_bus_id\tuuid\tnuma\tcpus\n");
        for g in &self.gpus {
            let minor = g.minor.map_or("-".to_owned(), |m| m.to_string());
            let uuid = g.uuid.as_deref().unwrap_or("-");
            let cpus = if g.cpus.is_empty() { "-".to_owned() } else { g.cpus.to_string() };
            out.push_str(&format!(
                "{}\t{minor}\t{}\t{uuid}\t{}\t{cpus}\n",
                g.slurm_index,
                g.pci_bus_id,
                list(&g.numa_nodes)
            ));
        }
        out
    }

    /// Parses a table.
    ///
    /// # Errors
    /// A missing header, a malformed line (named by number), a repeated
    /// index, or a table over the size limits.
    pub fn parse(text: &str) -> Result<GpuTable, TableError> {
        if text.len() > MAX_BYTES {
            return Err(TableError(format!("{} bytes, over the {MAX_BYTES}-byte limit", text.len())));
        }
        let mut lines = text.lines();
        if lines.next().map(str::trim_end) != Some(HEADER) {
            return Err(TableError(format!("the first line is not '{HEADER}'")));
        }
        let mut gpus: Vec<GpuEntry> = Vec::new();
        for (n, line) in lines.enumerate() {
            let line = line.trim_end();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let err = |why: String| TableError(format!("line {}: {why}", n + 2));
            let f: Vec<&str> = line.split('\t').collect();
            let [index, minor, bus, uuid, numa, cpus] = f.as_slice() else {
                return Err(err(format!("expected 6 tab-separated fields, got {}", f.len())));
            };
            let num = |s: &str, what: &str| {
                s.parse::<u32>().map_err(|_| err(format!("{what} '{s}' is not a number")))
            };
            let slurm_index = num(index, "index")?;
            let minor = if *minor == "-" { None } else { Some(num(minor, "minor")?) };
            if bus.is_empty()
                || bus.len() > 32
                || !bus.chars().all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
            {
                return Err(err(format!("'{bus}' is not a PCI bus id")));
            }
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
            if gpus.iter().any(|g| g.slurm_index == slurm_index) {
                return Err(err(format!("index {slurm_index} appears twice")));
            }
            if gpus.len() >= MAX_GPUS {
                return Err(err(format!("more than {MAX_GPUS} GPUs")));
            }
            gpus.push(GpuEntry { slurm_index, minor, pci_bus_id: (*bus).to_owned(), uuid, numa_nodes, cpus });
        }
        Ok(GpuTable { gpus })
    }
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
                    pci_bus_id: "0000:9d:00.0".into(),
                    uuid: Some("GPU-aaaa".into()),
                    numa_nodes: vec![1],
                    cpus: CpuSet::parse("56-111,168-223").unwrap(),
                },
                GpuEntry {
                    slurm_index: 1,
                    minor: None,
                    pci_bus_id: "0000:1b:00.0".into(),
                    uuid: None,
                    numa_nodes: vec![],
                    cpus: CpuSet::new(),
                },
            ],
        }
    }

    #[test]
    fn round_trips_through_text() {
        let t = table();
        let text = t.to_text();
        assert!(text.starts_with(HEADER));
        assert_eq!(GpuTable::parse(&text).unwrap(), t);
    }

    #[test]
    fn looks_up_by_index_and_uuid_including_mig() {
        let t = table();
        assert_eq!(t.by_index(0).unwrap().minor, Some(4));
        assert_eq!(t.by_uuid("GPU-aaaa").unwrap().slurm_index, 0);
        assert_eq!(t.by_uuid("MIG-GPU-aaaa/1/0").unwrap().slurm_index, 0);
        assert!(t.by_uuid("GPU-zzzz").is_none());
    }

    #[test]
    fn rejects_bad_tables() {
        let good = table().to_text();
        assert!(GpuTable::parse("").is_err());
        assert!(GpuTable::parse("0\t0\t0000:1b:00.0\t-\t0\t0-3\n").is_err(), "no header");
        for bad in [
            "0\t0\t0000:1b:00.0\t-\t0",
            "x\t0\t0000:1b:00.0\t-\t0\t0-3",
            "0\t0\t../../etc\t-\t0\t0-3",
            "0\t0\t0000:1b:00.0\tGPU-a;rm\t0\t0-3",
            "0\t0\t0000:1b:00.0\t-\t0\t3-1",
            "0\t0\t0000:1b:00.0\t-\tq\t0-3",
        ] {
            let e = GpuTable::parse(&format!("{HEADER}\n{bad}\n")).unwrap_err();
            assert!(e.0.starts_with("line 2:"), "{bad:?}: {e}");
        }
        let dup = format!("{good}0\t1\t0000:1c:00.0\t-\t0\t0-3\n");
        assert!(GpuTable::parse(&dup).unwrap_err().0.contains("twice"));
        assert!(GpuTable::parse(&"#".repeat(MAX_BYTES + 1)).is_err());
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
