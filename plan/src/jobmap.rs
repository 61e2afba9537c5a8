//! Which job holds which GPU on a node: the record the plugin's
//! `slurm_spank_job_prolog` writes for the agent (one file per job in
//! [`JOBS_DIR`]), and the same mapping in DCGM exporter's HPC job-mapping
//! format (one file per GPU in [`DCGM_DIR`], one job id per line), which
//! both follow from the records ([`dcgm_files`]).
//!
//! The job's GPUs come from the prolog's environment as Slurm sets it:
//! `SLURM_JOB_GPUS` (Slurm's indices of the GPUs, in gres.conf order), and
//! `CUDA_VISIBLE_DEVICES` where it names UUIDs (MIG devices under
//! `AutoDetect=nvml`). The GPU table maps them to NVML's numbering: NVML
//! numbers GPUs in PCI bus order, so a GPU's NVML index is its place among
//! the table's GPUs sorted by bus id; a MIG device's number is its place in
//! its GPU's `mig` column. A shard (`--gres=shard`) is its GPU: several jobs
//! then hold one GPU, and its mapping file names each.
//!
//! A record:
//!
//! ```text
//! # spank-gpu job v1
//! job 4242
//! uid 1000
//! gpu 3 - GPU-5f1c0a04-7d2e-4b1a-9c3e-000000000004
//! gpu 5 1 MIG-5b000000-7d2e-4b1a-9c3e-000000000005
//! ```
//!
//! A record whose epilog never ran is collected by the agent once Slurm
//! says the job ended ([`stale`]'s rules).

pub mod stale;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::gputable::{GpuEntry, GpuTable, is_mig};

/// Where the plugin keeps what it writes for the agent and for DCGM exporter.
pub const RUN_DIR: &str = "/run/spank-gpu";
/// The job records, under [`RUN_DIR`].
pub const JOBS_DIR: &str = "jobs";
/// DCGM exporter's `--hpc-job-mapping-dir`, under [`RUN_DIR`].
pub const DCGM_DIR: &str = "hpc-jobs";
/// The agent's live summaries (`usage/JOBID`), under [`RUN_DIR`].
pub const USAGE_DIR: &str = "usage";
/// The first line of a record.
pub const HEADER: &str = "# spank-gpu job v1";
/// Most GPUs (and MIG devices) in one record.
pub const MAX_GPUS: usize = 512;
/// Largest record read.
pub const MAX_BYTES: usize = 64 * 1024;

/// One GPU (or MIG device) a job holds.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HeldGpu {
    /// NVML's index of the GPU.
    pub nvml: u32,
    /// The MIG device's place in its GPU, for a MIG device.
    pub mig: Option<u32>,
    /// `GPU-…` or `MIG-…` (empty when the table does not know it).
    pub uuid: String,
}

impl HeldGpu {
    /// The name of its DCGM mapping file: `3`, or `5.1` for a MIG device.
    pub fn dcgm_name(&self) -> String {
        match self.mig {
            Some(m) => format!("{}.{m}", self.nvml),
            None => self.nvml.to_string(),
        }
    }
}

/// What the plugin writes for a job on a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRecord {
    /// The job id.
    pub job: u32,
    /// The job's user.
    pub uid: u32,
    /// Its GPUs here, in NVML order.
    pub gpus: Vec<HeldGpu>,
}

/// The file name of job `job`'s record (and of its live summary).
pub fn file_name(job: u32) -> String {
    job.to_string()
}

/// A job id from a record's file name (what [`file_name`] writes), else `None`.
pub fn job_of_file(name: &str) -> Option<u32> {
    if name.is_empty()
        || name.len() > 10
        || !name.bytes().all(|b| b.is_ascii_digit())
        || name.starts_with('0')
    {
        return None;
    }
    name.parse().ok()
}

fn nvml_index(table: &GpuTable, entry: &GpuEntry) -> u32 {
    let below = table.gpus.iter().filter(|g| g.pci_bus_id < entry.pci_bus_id).count();
    u32::try_from(below).unwrap_or(u32::MAX)
}

fn held(table: &GpuTable, entry: &GpuEntry, mig: Option<usize>) -> HeldGpu {
    let nvml = nvml_index(table, entry);
    match mig.and_then(|m| entry.mig_uuids.get(m).map(|u| (m, u))) {
        Some((m, uuid)) => HeldGpu { nvml, mig: u32::try_from(m).ok(), uuid: uuid.clone() },
        None => HeldGpu { nvml, mig: None, uuid: entry.uuid.clone().unwrap_or_default() },
    }
}

/// The GPUs a job holds on this node, from its prolog's `SLURM_JOB_GPUS`
/// and `CUDA_VISIBLE_DEVICES` and the node's GPU table; what the table does
/// not know is named in the error (the record then lists what it does).
pub fn held_gpus(
    table: &GpuTable,
    job_gpus: Option<&str>,
    visible: Option<&str>,
) -> (Vec<HeldGpu>, Vec<String>) {
    let words = |s: Option<&str>| -> Vec<String> {
        s.unwrap_or("").split(',').map(str::trim).filter(|w| !w.is_empty()).map(str::to_owned).collect()
    };
    let visible = words(visible);
    let uuids = !visible.is_empty() && visible.iter().all(|w| w.starts_with("GPU-") || is_mig(w));
    let mut out = Vec::new();
    let mut unknown = Vec::new();
    if uuids {
        for u in &visible {
            match table.by_uuid(u) {
                Some(e) => {
                    let mig = e.mig_uuids.iter().position(|m| m == u);
                    out.push(held(table, e, mig));
                }
                None => unknown.push(u.clone()),
            }
        }
    } else if table.gpus.iter().any(|g| !g.mig_uuids.is_empty()) {
        // Slurm's indices count MIG devices on a MIG node, the table's rows
        // whole GPUs: without the UUIDs (which only AutoDetect=nvml gives:
        // gres.conf has no keyword for a device's unique id) an index cannot
        // be told apart, so nothing is mapped rather than a wrong GPU.
        unknown = words(job_gpus)
            .into_iter()
            .chain(visible)
            .map(|w| format!("{w} (a MIG node: no MIG UUID)"))
            .collect();
        unknown.dedup();
    } else {
        let given = words(job_gpus);
        let indices = if given.is_empty() { visible } else { given };
        for w in &indices {
            match w.parse::<u32>().ok().and_then(|i| table.by_index(i)) {
                Some(e) => out.push(held(table, e, None)),
                None => unknown.push(w.clone()),
            }
        }
    }
    out.sort();
    out.dedup();
    out.truncate(MAX_GPUS);
    (out, unknown)
}

impl JobRecord {
    /// The record's text.
    pub fn to_text(&self) -> String {
        let mut s = format!("{HEADER}\njob {}\nuid {}\n", self.job, self.uid);
        for g in &self.gpus {
            let mig = g.mig.map_or_else(|| "-".to_owned(), |m| m.to_string());
            let uuid = if g.uuid.is_empty() || g.uuid.contains(char::is_whitespace) { "-" } else { &g.uuid };
            let _ = writeln!(s, "gpu {} {mig} {uuid}", g.nvml);
        }
        s
    }

    /// Reads a record.
    ///
    /// # Errors
    /// Not a record of this version, too large, or a malformed line.
    pub fn parse(text: &str) -> Result<JobRecord, String> {
        if text.len() > MAX_BYTES {
            return Err(format!("over {MAX_BYTES} bytes"));
        }
        let mut lines = text.lines();
        if lines.next() != Some(HEADER) {
            return Err("not a spank-gpu job record".to_owned());
        }
        let (mut job, mut uid, mut gpus) = (None, None, Vec::new());
        for (n, line) in lines.enumerate() {
            let bad = || format!("line {}: '{}'", n + 2, slurm_formats::text::clip(line, 60));
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.as_slice() {
                [] => {}
                ["job", j] => job = Some(j.parse::<u32>().map_err(|_| bad())?),
                ["uid", u] => uid = Some(u.parse::<u32>().map_err(|_| bad())?),
                ["gpu", i, m, u] => {
                    if gpus.len() >= MAX_GPUS {
                        return Err(format!("over {MAX_GPUS} GPUs"));
                    }
                    let nvml = i.parse().map_err(|_| bad())?;
                    let mig = if *m == "-" { None } else { Some(m.parse().map_err(|_| bad())?) };
                    let uuid = if *u == "-" { String::new() } else { (*u).to_owned() };
                    gpus.push(HeldGpu { nvml, mig, uuid });
                }
                _ => return Err(bad()),
            }
        }
        match (job, uid) {
            (Some(job), Some(uid)) => Ok(JobRecord { job, uid, gpus }),
            _ => Err("no job or uid line".to_owned()),
        }
    }
}

/// DCGM exporter's mapping files: each GPU held by a job, its file name and
/// the ids of the jobs holding it, in increasing order.
pub fn dcgm_files(records: &[JobRecord]) -> BTreeMap<String, Vec<u32>> {
    let mut files: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for r in records {
        for g in &r.gpus {
            files.entry(g.dcgm_name()).or_default().push(r.job);
        }
    }
    for jobs in files.values_mut() {
        jobs.sort_unstable();
        jobs.dedup();
    }
    files
}

/// A mapping file's text: one job id per line.
pub fn dcgm_text(jobs: &[u32]) -> String {
    jobs.iter().map(|j| format!("{j}\n")).collect()
}

/// Whether `name` is a file name [`dcgm_files`] may write (so only those are
/// ever removed from the directory).
pub fn is_dcgm_name(name: &str) -> bool {
    let num = |s: &str| !s.is_empty() && s.len() <= 4 && s.bytes().all(|b| b.is_ascii_digit());
    match name.split_once('.') {
        Some((g, m)) => num(g) && num(m),
        None => num(name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "# spank-gpu gpu table v2\n\
        0\t4\t0000:9d:00.0\tGPU-aaaaaaaa-0000-0000-0000-000000000004\t1\t8-15\t-\n\
        1\t1\t0000:1b:00.0\tGPU-aaaaaaaa-0000-0000-0000-000000000001\t0\t0-7\t-\n\
        2\t5\t0000:bb:00.0\tGPU-aaaaaaaa-0000-0000-0000-000000000005\t1\t8-15\tMIG-5a000000-0000-0000-0000-000000000005,MIG-5b000000-0000-0000-0000-000000000005\n";

    /// The node with its GPU on bus bb in MIG mode.
    fn mig_table() -> GpuTable {
        GpuTable::parse(TABLE).unwrap_or_default()
    }

    /// The same node without MIG.
    fn table() -> GpuTable {
        let mut t = mig_table();
        for g in &mut t.gpus {
            g.mig_uuids.clear();
        }
        t
    }

    #[test]
    fn slurm_indices_become_nvml_indices_by_bus_order() {
        let (gpus, unknown) = held_gpus(&table(), Some("0,1"), Some("0,1"));
        assert!(unknown.is_empty());
        // Slurm's 1 is on bus 1b (NVML 0), Slurm's 0 on bus 9d (NVML 1).
        assert_eq!(gpus.iter().map(|g| g.nvml).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(gpus[0].uuid, "GPU-aaaaaaaa-0000-0000-0000-000000000001");
    }

    #[test]
    fn mig_uuids_in_cuda_visible_devices_name_the_mig_devices() {
        let (gpus, unknown) =
            held_gpus(&mig_table(), Some("3"), Some("MIG-5b000000-0000-0000-0000-000000000005,MIG-zzz"));
        assert_eq!(unknown, vec!["MIG-zzz".to_owned()]);
        assert_eq!(gpus.len(), 1);
        assert_eq!((gpus[0].nvml, gpus[0].mig), (2, Some(1)));
        assert_eq!(gpus[0].dcgm_name(), "2.1");
    }

    #[test]
    fn indices_on_a_mig_node_map_nothing() {
        let (gpus, unknown) = held_gpus(&mig_table(), Some("2"), Some("2"));
        assert!(gpus.is_empty());
        assert_eq!(unknown, vec!["2 (a MIG node: no MIG UUID)".to_owned()]);
    }

    #[test]
    fn without_job_gpus_the_visible_indices_are_used_and_unknown_ones_named() {
        let (gpus, unknown) = held_gpus(&table(), None, Some("2,7"));
        assert_eq!(gpus.len(), 1);
        assert_eq!(unknown, vec!["7".to_owned()]);
        assert!(held_gpus(&table(), None, None).0.is_empty());
    }

    #[test]
    fn a_record_reads_back_and_bad_ones_are_refused() {
        let mut gpus = held_gpus(&table(), Some("0,1,2"), None).0;
        gpus.extend(held_gpus(&mig_table(), None, Some("MIG-5a000000-0000-0000-0000-000000000005")).0);
        let r = JobRecord { job: 4242, uid: 1000, gpus };
        assert_eq!(JobRecord::parse(&r.to_text()), Ok(r));
        for bad in [
            "",
            "job 1\nuid 2\n",
            "# spank-gpu job v1\njob x\nuid 1\n",
            "# spank-gpu job v1\nuid 1\n",
            "# spank-gpu job v1\njob 1\nuid 1\ngpu 1 2\n",
        ] {
            assert!(JobRecord::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn shared_gpus_name_every_job_and_names_are_checked() {
        let g = |nvml| HeldGpu { nvml, mig: None, uuid: String::new() };
        let a = JobRecord { job: 12, uid: 1, gpus: vec![g(0), g(1)] };
        let b = JobRecord { job: 7, uid: 2, gpus: vec![g(1)] };
        let files = dcgm_files(&[a, b]);
        assert_eq!(files.get("0"), Some(&vec![12]));
        assert_eq!(files.get("1"), Some(&vec![7, 12]));
        assert_eq!(dcgm_text(&[7, 12]), "7\n12\n");
        assert!(is_dcgm_name("3") && is_dcgm_name("5.1"));
        assert!(!is_dcgm_name("..") && !is_dcgm_name("x") && !is_dcgm_name("1.") && !is_dcgm_name(".lock"));
        assert_eq!(job_of_file("4242"), Some(4242));
        assert_eq!(job_of_file("042"), None);
        assert_eq!(job_of_file("4242.tmp"), None);
    }
}
