//! The machine records of a version 3 GPU table (`@allowed`, `@numa`,
//! `@cores`, `@pci`): the [`Topology`] the agent asked hwloc for, written and
//! read back without any XML. The format is in the [parent module](super).
//!
//! Tables from older agents (v1, v2) have no machine records: the plugin then
//! binds from the GPU rows alone ([`from_gpu_rows`]), in the degraded way the
//! module documentation describes, until the agent rewrites the table.

use crate::topology::{NumaNode, PciGpu, Topology};
use slurm_formats::cpuset::CpuSet;
use slurm_formats::pci::PciAddr;

use super::{GpuTable, TableError, TableErrorKind};

/// Most `@numa` records (real machines have up to a few hundred NUMA nodes,
/// counting GPU and CXL memory).
pub const MAX_NUMA_NODES: usize = 4096;
/// Most cores in the `@cores` record.
pub const MAX_CORES: usize = 16384;
/// Most PUs of one core (real cores have 1 to 8 hardware threads).
pub const MAX_PUS_PER_CORE: usize = 64;
/// Most `@pci` records.
pub const MAX_PCI: usize = super::MAX_GPUS;
/// Most OS device names of one PCI device, and the longest name.
pub const MAX_OS_NAMES: usize = 32;
const MAX_OS_NAME_BYTES: usize = 64;

/// `-` for an empty set, else the set as a CPU list.
fn cpus_text(set: &CpuSet) -> String {
    if set.is_empty() { "-".to_owned() } else { set.to_string() }
}

/// Appends the machine records of `machine` to a table's text.
pub(super) fn write(machine: &Topology, out: &mut String) {
    out.push_str(
        "# the machine, from hwloc: allowed CPUs; NUMA nodes; each core's CPUs; display-class PCI devices\n",
    );
    out.push_str(&format!("@allowed\t{}\n", cpus_text(&machine.allowed_cpus)));
    for n in &machine.numa_nodes {
        out.push_str(&format!("@numa\t{}\t{}\n", n.os_index, cpus_text(&n.cpus)));
    }
    let cores: Vec<String> = machine.cores.iter().map(CpuSet::to_string).collect();
    out.push_str(&format!("@cores\t{}\n", if cores.is_empty() { "-".to_owned() } else { cores.join(" ") }));
    out.push_str("# @pci\tpci_bus_id\tvendor\tdevice\tclass\tnuma\tcpus\tos_names\n");
    for g in &machine.gpus {
        let names = if g.os_names.is_empty() { "-".to_owned() } else { g.os_names.join(",") };
        out.push_str(&format!(
            "@pci\t{}\t{:04x}\t{:04x}\t{:04x}\t{}\t{}\t{names}\n",
            g.bus_id.hwloc(),
            g.vendor,
            g.device,
            g.class,
            super::list(&g.numa_nodes),
            cpus_text(&g.cpus),
        ));
    }
}

/// The machine records of a table being parsed.
#[derive(Debug, Default)]
pub(super) struct Records {
    allowed: Option<CpuSet>,
    numa: Vec<NumaNode>,
    cores: Option<Vec<CpuSet>>,
    pci: Vec<PciGpu>,
}

fn malformed(line: usize, why: &str) -> TableError {
    TableError::at_line(line, |line| TableErrorKind::Malformed { line }, why)
}

fn duplicate(line: usize, why: &str) -> TableError {
    TableError::at_line(line, |line| TableErrorKind::Duplicate { line }, why)
}

fn too_many(line: usize, why: &str) -> TableError {
    TableError::at_line(line, |line| TableErrorKind::TooMany { line }, why)
}

/// `-` or a CPU list.
fn cpus_field(text: &str, line: usize, what: &str) -> Result<CpuSet, TableError> {
    if text == "-" {
        return Ok(CpuSet::new());
    }
    if text.is_empty() {
        return Err(malformed(line, &format!("{what}: empty (an empty set is '-')")));
    }
    CpuSet::parse(text).map_err(|e| malformed(line, &format!("{what}: {e}")))
}

fn number(text: &str, line: usize, what: &str) -> Result<u32, TableError> {
    if text.is_empty() || text.len() > 10 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed(
            line,
            &format!("{what} '{}' is not a number", slurm_formats::text::clip(text, 20)),
        ));
    }
    text.parse().map_err(|_| malformed(line, &format!("{what} '{text}' is not a number")))
}

/// Exactly four hex digits (`10de`, `0302`).
fn hex16(text: &str, line: usize, what: &str) -> Result<u16, TableError> {
    if text.len() != 4 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(malformed(
            line,
            &format!("{what} '{}' is not 4 hex digits", slurm_formats::text::clip(text, 20)),
        ));
    }
    u16::from_str_radix(text, 16)
        .map_err(|_| malformed(line, &format!("{what} '{text}' is not 4 hex digits")))
}

/// `-` or a comma-separated list of numbers, strictly increasing.
fn numbers(text: &str, line: usize, what: &str) -> Result<Vec<u32>, TableError> {
    if text == "-" {
        return Ok(Vec::new());
    }
    let mut out: Vec<u32> = Vec::new();
    for item in text.split(',') {
        let n = number(item, line, what)?;
        if out.last().is_some_and(|last| *last >= n) {
            return Err(malformed(line, &format!("{what} list '{text}' is not in increasing order")));
        }
        if out.len() >= MAX_NUMA_NODES {
            return Err(too_many(line, &format!("more than {MAX_NUMA_NODES} {what}s")));
        }
        out.push(n);
    }
    Ok(out)
}

/// `-` or OS device names (`cuda0`, `nvml0`, `card1`, `renderD128`,
/// `opencl0d0`), comma-separated.
fn os_names(text: &str, line: usize) -> Result<Vec<String>, TableError> {
    if text == "-" {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for name in text.split(',') {
        let ok = !name.is_empty()
            && name.len() <= MAX_OS_NAME_BYTES
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
        if !ok || name == "-" {
            let why = format!("'{}' is not an OS device name", slurm_formats::text::clip(name, 40));
            return Err(malformed(line, &why));
        }
        if out.len() >= MAX_OS_NAMES {
            return Err(too_many(line, &format!("more than {MAX_OS_NAMES} OS device names")));
        }
        out.push(name.to_owned());
    }
    Ok(out)
}

impl Records {
    /// Reads one machine record (its fields, the `@kind` first) of line `line`.
    pub(super) fn read(&mut self, line: usize, fields: &[&str]) -> Result<(), TableError> {
        match fields {
            ["@allowed", cpus] => {
                if self.allowed.is_some() {
                    return Err(duplicate(line, "a second @allowed record"));
                }
                self.allowed = Some(cpus_field(cpus, line, "allowed CPUs")?);
            }
            ["@numa", index, cpus] => {
                let os_index = number(index, line, "NUMA node")?;
                if let Some(last) = self.numa.last() {
                    if last.os_index == os_index {
                        return Err(duplicate(line, &format!("NUMA node {os_index} appears twice")));
                    }
                    if last.os_index > os_index {
                        return Err(malformed(line, "@numa records are not in NUMA node order"));
                    }
                }
                if self.numa.len() >= MAX_NUMA_NODES {
                    return Err(too_many(line, &format!("more than {MAX_NUMA_NODES} NUMA nodes")));
                }
                let cpus = cpus_field(cpus, line, "NUMA node CPUs")?;
                self.numa.push(NumaNode { os_index, cpus });
            }
            ["@cores", list] => {
                if self.cores.is_some() {
                    return Err(duplicate(line, "a second @cores record"));
                }
                self.cores = Some(cores(list, line)?);
            }
            ["@pci", bus, vendor, device, class, numa, cpus, names] => {
                let Ok(bus_id) = PciAddr::parse_with_function(bus) else {
                    return Err(malformed(
                        line,
                        &format!("'{}' is not a PCI bus id", slurm_formats::text::clip(bus, 40)),
                    ));
                };
                if let Some(last) = self.pci.last() {
                    if last.bus_id.same_function(bus_id) {
                        return Err(duplicate(line, &format!("PCI device {} appears twice", bus_id.hwloc())));
                    }
                    if (last.bus_id, last.bus_id.function()) > (bus_id, bus_id.function()) {
                        return Err(malformed(line, "@pci records are not in bus id order"));
                    }
                }
                if self.pci.len() >= MAX_PCI {
                    return Err(too_many(line, &format!("more than {MAX_PCI} PCI devices")));
                }
                self.pci.push(PciGpu {
                    bus_id,
                    vendor: hex16(vendor, line, "vendor")?,
                    device: hex16(device, line, "device")?,
                    class: hex16(class, line, "class")?,
                    numa_nodes: numbers(numa, line, "NUMA node")?,
                    cpus: cpus_field(cpus, line, "PCI device CPUs")?,
                    os_names: os_names(names, line)?,
                });
            }
            [kind, ..] => {
                let known = ["@allowed", "@numa", "@cores", "@pci"];
                let why = if known.contains(kind) {
                    format!("{kind} has the wrong number of fields ({})", fields.len())
                } else {
                    format!("'{}' is not a machine record", slurm_formats::text::clip(kind, 20))
                };
                return Err(malformed(line, &why));
            }
            [] => return Err(malformed(line, "an empty record")),
        }
        Ok(())
    }

    /// The machine, once every line is read.
    ///
    /// # Errors
    /// No `@allowed` or no `@cores` record (a table cut short).
    pub(super) fn finish(self) -> Result<Topology, TableError> {
        let missing = |what: &str| {
            TableError::new(
                TableErrorKind::Incomplete,
                format!(
                    "a v3 table without its {what} record; rewrite it with `gpu-node-agent topology --write`"
                ),
            )
        };
        let allowed_cpus = self.allowed.ok_or_else(|| missing("@allowed"))?;
        let cores = self.cores.ok_or_else(|| missing("@cores"))?;
        Ok(Topology { numa_nodes: self.numa, cores, gpus: self.pci, allowed_cpus })
    }
}

/// `-`, or each core's CPUs separated by single spaces, in order of their
/// lowest CPU, no CPU in two cores.
fn cores(text: &str, line: usize) -> Result<Vec<CpuSet>, TableError> {
    if text == "-" {
        return Ok(Vec::new());
    }
    let mut seen = CpuSet::new();
    let mut out: Vec<CpuSet> = Vec::new();
    let mut last_first: Option<u32> = None;
    for item in text.split(' ') {
        if out.len() >= MAX_CORES {
            return Err(too_many(line, &format!("more than {MAX_CORES} cores")));
        }
        let core = CpuSet::parse(item)
            .map_err(|e| malformed(line, &format!("core '{}': {e}", slurm_formats::text::clip(item, 40))))?;
        if core.is_empty() {
            return Err(malformed(line, "an empty core (two spaces, or one at an end)"));
        }
        if core.len() > MAX_PUS_PER_CORE {
            return Err(too_many(
                line,
                &format!(
                    "core '{}' has more than {MAX_PUS_PER_CORE} CPUs",
                    slurm_formats::text::clip(item, 40)
                ),
            ));
        }
        let first = core.iter().next().unwrap_or(0);
        if last_first.is_some_and(|l| l >= first) {
            return Err(malformed(line, "@cores is not in order of each core's lowest CPU"));
        }
        last_first = Some(first);
        for cpu in core.iter() {
            if seen.contains(cpu) {
                return Err(duplicate(line, &format!("CPU {cpu} is in two cores")));
            }
            seen.insert(cpu);
        }
        out.push(core);
    }
    Ok(out)
}

/// The machine as far as a table without machine records (v1, v2) tells it,
/// for binding until the agent rewrites the table:
///
/// * each NUMA node named in a GPU row has the union of the CPUs of the rows
///   that name it (a GPU local to two nodes gives both its whole set);
/// * each distinct GPU CPU set is one "core": a task gets its GPUs' whole
///   local CPUs (∩ what Slurm allowed), shared with the other tasks of those
///   GPUs, never a share of them, and SMT siblings are never split, since
///   the real cores are unknown;
/// * no PCI devices, and the allowed CPUs are those of the rows.
pub fn from_gpu_rows(table: &GpuTable) -> Topology {
    let mut numa: Vec<NumaNode> = Vec::new();
    let mut units: Vec<CpuSet> = Vec::new();
    let mut seen = CpuSet::new();
    for g in &table.gpus {
        for n in &g.numa_nodes {
            match numa.iter_mut().find(|x| x.os_index == *n) {
                Some(x) => x.cpus = x.cpus.union(&g.cpus),
                None => numa.push(NumaNode { os_index: *n, cpus: g.cpus.clone() }),
            }
        }
        let fresh: CpuSet = g.cpus.iter().filter(|c| !seen.contains(*c)).collect();
        if !fresh.is_empty() {
            seen = seen.union(&fresh);
            units.push(fresh);
        }
    }
    numa.sort_by_key(|n| n.os_index);
    units.sort_by_key(|u| u.iter().next());
    Topology { numa_nodes: numa, cores: units, gpus: Vec::new(), allowed_cpus: seen }
}

#[cfg(test)]
mod tests {
    use super::super::{GpuEntry, HEADER, HEADER_V2, version_of};
    use super::*;

    fn set(list: &str) -> CpuSet {
        CpuSet::parse(list).unwrap()
    }

    /// Two sockets (NUMA 0 and 8), 2 cores of 2 threads each, a GPU-memory
    /// node without CPUs, an NVIDIA GPU and a BMC VGA chip.
    fn machine() -> Topology {
        Topology {
            numa_nodes: vec![
                NumaNode { os_index: 0, cpus: set("0-1,4-5") },
                NumaNode { os_index: 8, cpus: set("2-3,6-7") },
                NumaNode { os_index: 255, cpus: CpuSet::new() },
            ],
            cores: vec![set("0,4"), set("1,5"), set("2,6"), set("3,7")],
            gpus: vec![
                PciGpu {
                    bus_id: "0000:03:00.0".parse().unwrap(),
                    vendor: 0x1a03,
                    device: 0x2000,
                    class: 0x0300,
                    numa_nodes: vec![0],
                    cpus: set("0-1,4-5"),
                    os_names: vec![],
                },
                PciGpu {
                    bus_id: "0004:9d:00.0".parse().unwrap(),
                    vendor: 0x10de,
                    device: 0x2330,
                    class: 0x0302,
                    numa_nodes: vec![8],
                    cpus: set("2-3,6-7"),
                    os_names: vec!["cuda0".into(), "nvml0".into(), "renderD128".into()],
                },
            ],
            allowed_cpus: set("0-6"),
        }
    }

    fn table() -> GpuTable {
        let gpu = GpuEntry {
            slurm_index: 0,
            minor: Some(0),
            pci_bus_id: "0004:9d:00.0".parse().unwrap(),
            uuid: Some("GPU-aaaa".into()),
            numa_nodes: vec![8],
            cpus: set("2-3,6-7"),
            mig_uuids: vec![],
        };
        GpuTable { gpus: vec![gpu], machine: Some(machine()) }
    }

    #[test]
    fn a_v3_table_round_trips_with_its_machine() {
        let t = table();
        let text = t.to_text();
        assert!(text.starts_with(HEADER));
        assert_eq!(GpuTable::parse(&text).unwrap(), t);
        assert!(text.contains("\n@cores\t0,4 1,5 2,6 3,7\n"), "{text}");
        assert!(text.contains("\n@numa\t255\t-\n"), "{text}");
        assert!(
            text.contains("\n@pci\t0004:9d:00.0\t10de\t2330\t0302\t8\t2-3,6-7\tcuda0,nvml0,renderD128\n"),
            "{text}"
        );
        assert!(text.contains("\n@pci\t0000:03:00.0\t1a03\t2000\t0300\t0\t0-1,4-5\t-\n"), "{text}");
        let back = GpuTable::parse(&text).unwrap();
        let (topology, degraded) = back.topology();
        assert!(!degraded);
        assert_eq!(*topology, machine());
        // An empty machine is a machine too.
        let empty = GpuTable { gpus: vec![], machine: Some(Topology::default()) };
        assert_eq!(GpuTable::parse(&empty.to_text()).unwrap(), empty);
        assert_eq!(version_of(HEADER), Some(3));
        assert_eq!(version_of(HEADER_V2), Some(2));
        assert_eq!(version_of("# spank-gpu gpu table v1"), Some(1));
        assert_eq!(version_of("# spank-gpu gpu table v4"), None);
    }

    /// The table's text with `from` replaced by `to` (exactly once).
    fn edited(from: &str, to: &str) -> String {
        let text = table().to_text();
        assert_eq!(text.matches(from).count(), 1, "{from:?} in {text}");
        text.replacen(from, to, 1)
    }

    #[test]
    fn malformed_machine_records_reject_the_table() {
        let original = table().to_text();
        // The line where `from` starts (counting from 1, like the parser).
        let line_of =
            |from: &str| original.get(..original.find(from).unwrap()).unwrap().matches('\n').count() + 1;
        let malformed = [
            ("@allowed\t0-6\n", "@allowed\t6-0\n"),
            ("@allowed\t0-6\n", "@allowed\t0-6\t-\n"),
            ("@allowed\t0-6\n", "@allowed 0-6\n"),
            ("@numa\t8\t", "@numa\tx\t"),
            ("@numa\t8\t", "@numa\t+8\t"),
            ("@numa\t8\t", "@numa\t-1\t"),
            ("@numa\t8\t", "@numa\t99999999999\t"),
            ("@numa\t8\t", "@numa\t0\t"),
            ("@numa\t255\t-", "@numa\t255\t"),
            ("@cores\t0,4 1,5", "@cores\t1,5 0,4"),
            ("@cores\t0,4 1,5", "@cores\t0,4  1,5"),
            ("@cores\t0,4 1,5", "@cores\t0,4 1,q"),
            ("@cores\t0,4", "@cores\t 0,4"),
            ("\t10de\t", "\t10DEX\t"),
            ("\t10de\t", "\t10d\t"),
            ("\t2330\t", "\t2330 \t"),
            ("\t0302\t", "\t302\t"),
            ("0004:9d:00.0\t10de", "0004:9d:00\t10de"),
            ("0004:9d:00.0\t10de", "../../x\t10de"),
            ("0004:9d:00.0\t10de\t2330", "0000:01:00.0\t10de\t2330"),
            ("cuda0,nvml0", "cuda0,,nvml0"),
            ("cuda0,nvml0", "cuda0,nvml0;reboot"),
            ("cuda0,nvml0", "cuda0,-"),
            ("\t8\t2-3,6-7\tcuda0", "\t8,0\t2-3,6-7\tcuda0"),
            ("\t8\t2-3,6-7\tcuda0", "\t8,8\t2-3,6-7\tcuda0"),
            ("@pci\t0000", "@pcie\t0000"),
            ("@pci\t0000", "@\t0000"),
            ("\tcuda0,nvml0,renderD128\n", "\n"),
        ];
        for (from, to) in malformed {
            let text = edited(from, to);
            let Err(e) = GpuTable::parse(&text) else { panic!("{to:?} was accepted") };
            let line = line_of(from.trim_start_matches('\n')) + usize::from(from.starts_with('\n'));
            assert!(
                matches!(e.kind, TableErrorKind::Malformed { .. } | TableErrorKind::Duplicate { .. }),
                "{to:?}: {e}"
            );
            assert!(e.detail.starts_with(&format!("line {line}:")), "{to:?} (line {line}): {e}");
        }
        let duplicates = [
            ("@allowed\t0-6\n", "@allowed\t0-6\n@allowed\t0-6\n"),
            ("@numa\t255\t-\n", "@numa\t255\t-\n@numa\t255\t-\n"),
            ("@cores\t0,4 1,5", "@cores\t0,4 1,4"),
            ("@cores\t0,4 1,5 2,6 3,7\n", "@cores\t0,4 1,5 2,6 3,7\n@cores\t-\n"),
            ("@pci\t0000:03:00.0", "@pci\t0004:9d:00.0\t10de\t2330\t0302\t8\t2-3,6-7\t-\n@pci\t0000:03:00.0"),
        ];
        for (from, to) in duplicates {
            let e = GpuTable::parse(&edited(from, to)).unwrap_err();
            assert!(
                matches!(e.kind, TableErrorKind::Duplicate { .. } | TableErrorKind::Malformed { .. }),
                "{to:?}: {e}"
            );
        }
        for (from, what) in [("@allowed\t0-6\n", "@allowed"), ("@cores\t0,4 1,5 2,6 3,7\n", "@cores")] {
            let e = GpuTable::parse(&edited(from, "")).unwrap_err();
            assert_eq!(e.kind, TableErrorKind::Incomplete, "{e}");
            assert!(e.detail.contains(what) && e.detail.contains("--write"), "{e}");
        }
        // Machine records belong to version 3 only.
        let v2 = table().to_text().replacen(HEADER, HEADER_V2, 1);
        let e = GpuTable::parse(&v2).unwrap_err();
        assert!(matches!(e.kind, TableErrorKind::Malformed { .. }) && e.detail.contains("version 2"), "{e}");
    }

    #[test]
    fn machine_records_have_limits() {
        let many_cores = (0..=MAX_CORES).map(|c| c.to_string()).collect::<Vec<_>>().join(" ");
        let e = GpuTable::parse(&edited("@cores\t0,4 1,5 2,6 3,7", &format!("@cores\t{many_cores}")))
            .unwrap_err();
        assert!(matches!(e.kind, TableErrorKind::TooMany { .. }), "{e}");
        let e = GpuTable::parse(&edited("@cores\t0,4 1,5 2,6 3,7", "@cores\t0-64")).unwrap_err();
        assert!(matches!(e.kind, TableErrorKind::TooMany { .. }), "{e}");
        let names = (0..=MAX_OS_NAMES).map(|i| format!("n{i}")).collect::<Vec<_>>().join(",");
        let e = GpuTable::parse(&edited("cuda0,nvml0,renderD128", &names)).unwrap_err();
        assert!(matches!(e.kind, TableErrorKind::TooMany { .. }), "{e}");
        let long = "a".repeat(MAX_OS_NAME_BYTES + 1);
        let e = GpuTable::parse(&edited("cuda0,nvml0,renderD128", &long)).unwrap_err();
        assert!(matches!(e.kind, TableErrorKind::Malformed { .. }), "{e}");
        let mut numa = String::new();
        for n in 0..=MAX_NUMA_NODES {
            numa.push_str(&format!("@numa\t{}\t-\n", 1000 + n));
        }
        let e = GpuTable::parse(&edited("@numa\t255\t-\n", &format!("@numa\t255\t-\n{numa}"))).unwrap_err();
        assert!(matches!(e.kind, TableErrorKind::TooMany { .. }), "{e}");
    }

    #[test]
    fn a_table_without_machine_binds_from_its_gpu_rows() {
        let mut t = table();
        t.machine = None;
        t.gpus.push(GpuEntry {
            slurm_index: 1,
            minor: Some(1),
            pci_bus_id: "0000:1b:00.0".parse().unwrap(),
            uuid: None,
            numa_nodes: vec![0, 1],
            cpus: set("0-1,4-5,8-9"),
            mig_uuids: vec![],
        });
        t.gpus.push(GpuEntry { slurm_index: 2, numa_nodes: vec![8], ..t.gpus[0].clone() });
        let back = GpuTable::parse(&t.to_text()).unwrap();
        assert_eq!(back.machine, None);
        let (topology, degraded) = back.topology();
        assert!(degraded);
        assert_eq!(
            topology.numa_nodes,
            vec![
                NumaNode { os_index: 0, cpus: set("0-1,4-5,8-9") },
                NumaNode { os_index: 1, cpus: set("0-1,4-5,8-9") },
                NumaNode { os_index: 8, cpus: set("2-3,6-7") },
            ]
        );
        assert_eq!(topology.cores, vec![set("0-1,4-5,8-9"), set("2-3,6-7")], "one unit per GPU CPU set");
        assert_eq!(topology.allowed_cpus, set("0-9"));
        assert!(topology.gpus.is_empty());
        // Two tasks on one GPU both get its whole local CPUs.
        let gpu = crate::binding::GpuLocality { numa_nodes: vec![8], cpus: set("2-3,6-7") };
        let tasks: Vec<crate::binding::TaskGpus> = (0..2)
            .map(|i| crate::binding::TaskGpus { local_id: i, allowed: set("0-9"), gpus: vec![gpu.clone()] })
            .collect();
        let plan = crate::binding::plan(&topology, &tasks);
        assert!(plan.iter().all(|b| b.cpus == set("2-3,6-7") && b.numa_nodes == [8]), "{plan:?}");
    }
}
