//! A machine's topology, as the GPU-aware binding needs it.
//!
//! A plain [`Topology`]: the NUMA nodes
//! with their CPUs, the cores with their hardware threads (PUs), the GPUs with
//! their PCI bus ids and the CPUs and NUMA nodes closest to them, and the CPUs
//! the machine allows. That is all the GPU-aware binding in
//! [`crate::binding`] needs, and it is a small value the node can cache.
//!
//! # The model
//!
//! * **CPU numbers** are the operating system's (hwloc's `os_index`, the
//!   numbers in `taskset` and `Cpus_allowed_list`), never hwloc's logical
//!   indexes.
//! * **Cores** ([`Topology::cores`]) are the PUs under each `Core` object,
//!   sorted by their lowest CPU. A PU with no `Core` above it is a core of its
//!   own. A topology with SMT has several PUs per core; without, one.
//! * **NUMA nodes** ([`Topology::numa_nodes`]) are every `NUMANode` object,
//!   sorted by OS number: numbers need not be contiguous (POWER9 numbers its
//!   two sockets 0 and 8), and nodes without CPUs (the GPU memory that POWER9
//!   and Grace machines expose as NUMA nodes 252-255 and up) are kept, with an
//!   empty CPU set. The list is the machine's: it is not cut down to the
//!   memory nodes the exporting process was allowed.
//! * **GPUs** ([`Topology::gpus`]) are the PCI devices of class `0x03xx`
//!   (display controllers: VGA, 3D, other display), of every vendor, sorted by
//!   bus id. [`Topology::nvidia_gpus`] keeps NVIDIA's (vendor `0x10de`): AMD
//!   accelerators (vendor `0x1002`, class `0x0380`) and BMC VGA chips (ASPEED,
//!   Matrox) are in `gpus` but never among them. The order is the bus-id order,
//!   which is neither the XML's order nor, on every machine, NVML's: look GPUs
//!   up by bus id ([`Topology::gpu_by_bus_id`]) or by OS device name
//!   ([`Topology::gpu_by_os_name`]), never by position.
//! * **A GPU's locality** ([`PciGpu::cpus`]) is the CPU set of the nearest
//!   ancestor that is not an I/O object (a bridge, a PCI device, an OS device,
//!   a Misc object): the NUMA node, package, group or cache the host bridge
//!   hangs from. This is what `hwloc-calc pci=BUSID` prints. [`PciGpu::numa_nodes`]
//!   are the NUMA nodes with CPUs that overlap it (`hwloc-calc pci=BUSID
//!   --intersect NUMAnode --po`); when the locality has no CPUs at all, the
//!   ancestor's `nodeset` is used instead. The locality is not cut down to the
//!   allowed CPUs: a GPU may be local only to CPUs the job cannot use, and the
//!   binding says so.
//! * **Allowed CPUs** ([`Topology::allowed_cpus`]) are the root object's
//!   `cpuset` ∩ `allowed_cpuset` ∩ `online_cpuset`, each where present. On a
//!   machine where the exporting process ran in a cgroup they are fewer than
//!   the machine's CPUs.
//!
//! # Where it comes from
//!
//! `gpu-node-agent` asks hwloc's object API for these objects (its
//! `machine` module) and writes them into the GPU table, version 3
//! ([`crate::gputable`]); the plugin reads them back from the table with no
//! XML parser. [`synthetic_xml`] writes a small hwloc XML for tests and the
//! local cluster's fake nodes, which the agent loads through hwloc.

use slurm_formats::cpuset::CpuSet;
use slurm_formats::pci::PciAddr;

/// The PCI vendor id of NVIDIA.
pub const NVIDIA_VENDOR: u16 = 0x10de;

/// The machine, as the binding needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    /// Every NUMA node, sorted by OS number; nodes without CPUs have empty `cpus`.
    pub numa_nodes: Vec<NumaNode>,
    /// Each core's PUs (its SMT siblings), sorted by lowest CPU.
    pub cores: Vec<CpuSet>,
    /// PCI display-class devices (class `0x03xx`) of every vendor, sorted by bus id.
    pub gpus: Vec<PciGpu>,
    /// The CPUs the machine allows: the root's cpuset ∩ allowed ∩ online.
    pub allowed_cpus: CpuSet,
}

/// One NUMA node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumaNode {
    /// The OS number (`/sys/devices/system/node/nodeN`), not hwloc's logical index.
    pub os_index: u32,
    /// Its CPUs; empty for memory-only nodes (GPU memory, CXL, HBM).
    pub cpus: CpuSet,
}

/// One GPU-like PCI device (class `0x03xx`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciGpu {
    /// The bus id, with its function (hwloc's form, `0000:1b:00.0`, is
    /// [`PciAddr::hwloc`]).
    pub bus_id: PciAddr,
    /// The PCI vendor id (`0x10de` for NVIDIA, `0x1002` for AMD).
    pub vendor: u16,
    /// The PCI device id.
    pub device: u16,
    /// The PCI class and subclass (`0x0302` for a 3D controller, `0x0300` for VGA).
    pub class: u16,
    /// The NUMA nodes with CPUs local to the device, sorted.
    pub numa_nodes: Vec<u32>,
    /// The CPUs local to the device: the cpuset of its nearest non-I/O ancestor.
    pub cpus: CpuSet,
    /// The names of its OS devices in document order: `cuda0`, `nvml0`, `card1`, `opencl0d0`, ...
    pub os_names: Vec<String>,
}

impl Topology {
    /// The GPU with this bus id, in any form
    /// [`PciAddr::parse_with_function`] accepts, function included.
    pub fn gpu_by_bus_id(&self, id: &str) -> Option<&PciGpu> {
        let id = PciAddr::parse_with_function(id).ok()?;
        self.gpus.iter().find(|g| g.bus_id.same_function(id))
    }

    /// The GPU with an OS device of this name (`nvml2`, `cuda0`, `card1`).
    pub fn gpu_by_os_name(&self, name: &str) -> Option<&PciGpu> {
        self.gpus.iter().find(|g| g.os_names.iter().any(|n| n == name))
    }

    /// NVIDIA GPUs: vendor `0x10de` and PCI class `0x03xx`, in bus-id order.
    pub fn nvidia_gpus(&self) -> impl Iterator<Item = &PciGpu> {
        self.gpus.iter().filter(|g| g.vendor == NVIDIA_VENDOR && g.class >> 8 == 0x03)
    }

    /// The OS numbers of the NUMA nodes that have CPUs in `cpus`, sorted.
    pub fn numa_of_cpus(&self, cpus: &CpuSet) -> Vec<u32> {
        let mut out: Vec<u32> = self
            .numa_nodes
            .iter()
            .filter(|n| !n.cpus.intersection(cpus).is_empty())
            .map(|n| n.os_index)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The CPUs of these NUMA nodes (by OS number); unknown numbers add nothing.
    pub fn cpus_of_numa(&self, nodes: &[u32]) -> CpuSet {
        self.numa_nodes
            .iter()
            .filter(|n| nodes.contains(&n.os_index))
            .fold(CpuSet::new(), |acc, n| acc.union(&n.cpus))
    }
}

/// Writes a set as an hwloc bitmap (`0x0000000f,0xffffffff`).
pub fn format_hwloc_bitmap(set: &CpuSet) -> String {
    let words64 = set.to_words(1);
    let mut words32: Vec<u32> = Vec::new();
    for w in &words64 {
        words32.push(u32::try_from(w & 0xffff_ffff).unwrap_or(0));
        words32.push(u32::try_from(w >> 32).unwrap_or(0));
    }
    while words32.len() > 1 && words32.last() == Some(&0) {
        words32.pop();
    }
    words32.iter().rev().map(|w| format!("0x{w:08x}")).collect::<Vec<_>>().join(",")
}

/// A small hwloc 2 XML topology: one package and NUMA node per domain, one
/// core (one PU) per CPU, and NVIDIA GPUs at the given bus ids behind each
/// domain's host bridge. For tests and the local cluster's fake nodes.
pub fn synthetic_xml(domains: &[(CpuSet, Vec<&str>)]) -> String {
    let all = domains.iter().fold(CpuSet::new(), |acc, (c, _)| acc.union(c));
    let nodes: CpuSet = (0..u32::try_from(domains.len()).unwrap_or(0)).collect();
    let (cs, ns) = (format_hwloc_bitmap(&all), format_hwloc_bitmap(&nodes));
    let mut gp = 1;
    let mut next = || {
        gp += 1;
        gp
    };
    let mut x = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n",
    );
    x.push_str("<topology version=\"2.0\">\n");
    x.push_str(&format!(
        "  <object type=\"Machine\" os_index=\"0\" cpuset=\"{cs}\" complete_cpuset=\"{cs}\" allowed_cpuset=\"{cs}\" \
         nodeset=\"{ns}\" complete_nodeset=\"{ns}\" allowed_nodeset=\"{ns}\" gp_index=\"1\">\n"
    ));
    for (n, (cpus, gpus)) in (0u32..).zip(domains) {
        let c = format_hwloc_bitmap(cpus);
        let nn = format_hwloc_bitmap(&std::iter::once(n).collect());
        x.push_str(&format!(
            "    <object type=\"Package\" os_index=\"{n}\" cpuset=\"{c}\" complete_cpuset=\"{c}\" nodeset=\"{nn}\" \
             complete_nodeset=\"{nn}\" gp_index=\"{}\">\n",
            next()
        ));
        x.push_str(&format!(
            "      <object type=\"NUMANode\" os_index=\"{n}\" cpuset=\"{c}\" complete_cpuset=\"{c}\" nodeset=\"{nn}\" \
             complete_nodeset=\"{nn}\" gp_index=\"{}\" local_memory=\"1073741824\"/>\n",
            next()
        ));
        for cpu in cpus.iter() {
            let one = format_hwloc_bitmap(&std::iter::once(cpu).collect());
            x.push_str(&format!(
                "      <object type=\"Core\" os_index=\"{cpu}\" cpuset=\"{one}\" complete_cpuset=\"{one}\" \
                 nodeset=\"{nn}\" complete_nodeset=\"{nn}\" gp_index=\"{}\">\n        <object type=\"PU\" \
                 os_index=\"{cpu}\" cpuset=\"{one}\" complete_cpuset=\"{one}\" nodeset=\"{nn}\" \
                 complete_nodeset=\"{nn}\" gp_index=\"{}\"/>\n      </object>\n",
                next(),
                next()
            ));
        }
        if !gpus.is_empty() {
            x.push_str(&format!(
                "      <object type=\"Bridge\" gp_index=\"{}\" bridge_type=\"0-1\" depth=\"0\" bridge_pci=\"0000:[00-ff]\">\n",
                next()
            ));
            for bus in gpus {
                x.push_str(&format!(
                    "        <object type=\"PCIDev\" gp_index=\"{}\" pci_busid=\"{bus}\" \
                     pci_type=\"0302 [10de:2330] [10de:16c1] a1\" pci_link_speed=\"0.000000\"/>\n",
                    next()
                ));
            }
            x.push_str("      </object>\n");
        }
        x.push_str("    </object>\n");
    }
    x.push_str("  </object>\n</topology>\n");
    x
}
