//! The machine the plugin binds on, from hwloc's object API: loaded live (or
//! from an hwloc XML file, through hwloc itself) and walked into a
//! [`task_plan::topology::Topology`], which the GPU table (version 3) carries
//! to the plugin. hwloc's XML is never exported nor parsed here.
//!
//! What each part of the [`Topology`] means is in `task_plan::topology`; this
//! module asks hwloc for exactly that:
//!
//! * NUMA nodes: every `NUMANode` object's OS index and cpuset;
//! * cores: the PUs (by OS index) below each `Core`, a PU without a `Core`
//!   above it a core of its own, sorted by lowest CPU, no PU twice;
//! * GPUs: PCI devices of class `0x03xx` with their bus id, ids and the names
//!   of their OS devices, in bus-id order; each one's locality is the cpuset
//!   of its first non-I/O ancestor, its NUMA nodes those with CPUs in it (the
//!   ancestor's nodeset when it has no CPUs);
//! * allowed CPUs: the topology's cpuset ∩ its allowed cpuset.
//!
//! The topology is built with [`BuildFlags::INCLUDE_DISALLOWED`]: the table
//! describes the machine, not the agent's own cgroup.

use std::collections::BTreeMap;
use std::path::Path;

use hwlocality::Topology as Hwloc;
use hwlocality::bitmap::Bitmap;
use hwlocality::object::TopologyObject;
use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::ObjectType;
use hwlocality::topology::builder::{BuildFlags, TopologyBuilder, TypeFilter};
use slurm_formats::cpuset::{CpuSet, MAX_CPU};
use slurm_formats::pci::PciAddr;
use task_plan::topology::{NumaNode, PciGpu, Topology};

/// hwloc's discovery components that find GPUs through vendor libraries
/// (OpenCL, CUDA, NVML, ROCm SMI, Level Zero, OpenGL). The table needs only
/// hwloc's PCI devices and their locality, and these components cost much: on
/// a GPU node the OpenCL one loads an OpenCL runtime (pocl: LLVM and clang,
/// libcuda) and leaves its threads behind. Live discovery goes without them.
pub const VENDOR_COMPONENTS: &[&str] = &["opencl", "cuda", "nvml", "rsmi", "levelzero", "gl"];

/// A builder with I/O devices (the important ones: GPUs, NICs, storage, and
/// their OS devices) and the disallowed CPUs and NUMA nodes.
fn builder() -> Result<TopologyBuilder, String> {
    Hwloc::builder()
        .with_flags(BuildFlags::INCLUDE_DISALLOWED)
        .map_err(|e| format!("hwloc: {e}"))?
        .with_io_type_filter(TypeFilter::KeepImportant)
        .map_err(|e| format!("hwloc: {e}"))
}

/// The node's hwloc topology: from the XML file `xml` when given (read by
/// hwloc), else discovered live with I/O devices (without
/// [`VENDOR_COMPONENTS`]).
///
/// # Errors
/// hwloc cannot read the file or discover the machine.
pub fn load(xml: Option<&Path>) -> Result<Hwloc, String> {
    if let Some(path) = xml {
        let b = builder()?.from_xml_file(path).map_err(|e| format!("{}: hwloc: {e}", path.display()))?;
        return b.build().map_err(|e| format!("{}: hwloc: {e}", path.display()));
    }
    // hwloc refuses to exclude a component it does not have (its plugin is
    // not installed); a refusal consumes the builder, so start over without it.
    let fresh = |without: &[&str]| -> Result<TopologyBuilder, String> {
        let mut b = builder()?;
        for c in without {
            b = b.without_component(c).map_err(|e| format!("hwloc: {e}"))?;
        }
        Ok(b)
    };
    let mut excluded: Vec<&str> = Vec::new();
    let mut b = fresh(&excluded)?;
    for c in VENDOR_COMPONENTS {
        b = match b.without_component(c) {
            Ok(b) => {
                excluded.push(c);
                b
            }
            Err(_) => fresh(&excluded)?,
        };
    }
    b.build().map_err(|e| format!("hwloc: {e}"))
}

/// The machine of an hwloc XML text, read by hwloc and walked like a live
/// topology (for `topology --xml` in tests and for checking a topology offline).
///
/// # Errors
/// hwloc cannot read the text, or [`from_hwloc`] fails.
pub fn from_xml_text(xml: &str) -> Result<Topology, String> {
    let b = builder()?.from_xml(xml).map_err(|e| format!("hwloc XML: {e}"))?;
    from_hwloc(&b.build().map_err(|e| format!("hwloc: {e}"))?)
}

/// An hwloc cpuset or nodeset as a [`CpuSet`].
///
/// # Errors
/// An infinite set, or a member above [`MAX_CPU`].
fn to_set(bitmap: &Bitmap, what: &str) -> Result<CpuSet, String> {
    if bitmap.weight().is_none() {
        return Err(format!("hwloc: {what} is infinite"));
    }
    let mut set = CpuSet::new();
    for index in bitmap.iter_set() {
        let cpu = u32::try_from(usize::from(index)).ok().filter(|c| *c <= MAX_CPU);
        let Some(cpu) = cpu else { return Err(format!("hwloc: {what} has a member above {MAX_CPU}")) };
        set.insert(cpu);
    }
    Ok(set)
}

/// An object's cpuset (empty when it has none).
fn cpuset_of(obj: &TopologyObject) -> Result<CpuSet, String> {
    match obj.cpuset() {
        Some(c) => to_set(c.as_ref(), "a cpuset"),
        None => Ok(CpuSet::new()),
    }
}

fn os_index(obj: &TopologyObject) -> Option<u32> {
    obj.os_index().and_then(|i| u32::try_from(i).ok()).filter(|i| *i <= MAX_CPU)
}

/// The machine as the binding needs it, from a loaded hwloc topology.
///
/// # Errors
/// A set hwloc reports is infinite or holds a number above [`MAX_CPU`].
pub fn from_hwloc(topo: &Hwloc) -> Result<Topology, String> {
    let cpuset = to_set(topo.cpuset().as_ref(), "the machine's cpuset")?;
    let allowed = to_set(topo.allowed_cpuset().as_ref(), "the allowed cpuset")?;
    let allowed_cpus = cpuset.intersection(&allowed);

    let mut numa_nodes: Vec<NumaNode> = Vec::new();
    for n in topo.objects_with_type(ObjectType::NUMANode) {
        if let Some(os_index) = os_index(n) {
            numa_nodes.push(NumaNode { os_index, cpus: cpuset_of(n)? });
        }
    }
    numa_nodes.sort_by_key(|n| n.os_index);
    numa_nodes.dedup_by_key(|n| n.os_index);

    // Each Core's PUs (keyed by the core's persistent index), then lone PUs.
    let mut in_cores: BTreeMap<u64, CpuSet> = BTreeMap::new();
    let mut lone: Vec<CpuSet> = Vec::new();
    for pu in topo.objects_with_type(ObjectType::PU) {
        let Some(cpu) = os_index(pu) else { continue };
        match pu.ancestors().find(|a| a.object_type() == ObjectType::Core) {
            Some(core) => in_cores.entry(core.global_persistent_index()).or_default().insert(cpu),
            None => lone.push(std::iter::once(cpu).collect()),
        }
    }
    let mut seen = CpuSet::new();
    let mut cores: Vec<CpuSet> = Vec::new();
    for set in in_cores.into_values().chain(lone) {
        let fresh: CpuSet = set.iter().filter(|c| !seen.contains(*c)).collect();
        if !fresh.is_empty() {
            seen = seen.union(&fresh);
            cores.push(fresh);
        }
    }
    cores.sort_by_key(|c| c.iter().next());

    let partial = Topology { numa_nodes, cores, gpus: Vec::new(), allowed_cpus };
    let mut gpus: Vec<PciGpu> = Vec::new();
    for dev in topo.pci_devices() {
        let Some(ObjectAttributes::PCIDevice(pci)) = dev.attributes() else { continue };
        if pci.class_id() >> 8 != 0x03 {
            continue;
        }
        let text = format!(
            "{:04x}:{:02x}:{:02x}.{:x}",
            pci.domain(),
            pci.bus_id(),
            pci.bus_device(),
            pci.function()
        );
        let Ok(bus_id) = PciAddr::parse_with_function(&text) else { continue };
        let os_names = dev
            .io_children()
            .filter(|c| c.object_type() == ObjectType::OSDevice)
            .filter_map(|c| c.name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        let (cpus, numa) = match dev.first_non_io_ancestor() {
            None => (CpuSet::new(), Vec::new()),
            Some(anc) => {
                let cpus = cpuset_of(anc)?;
                let mut numa = partial.numa_of_cpus(&cpus);
                if cpus.is_empty() {
                    let nodeset = match anc.nodeset() {
                        Some(n) => to_set(n.as_ref(), "a nodeset")?,
                        None => CpuSet::new(),
                    };
                    numa = partial
                        .numa_nodes
                        .iter()
                        .map(|n| n.os_index)
                        .filter(|i| nodeset.contains(*i))
                        .collect();
                }
                (cpus, numa)
            }
        };
        gpus.push(PciGpu {
            bus_id,
            vendor: pci.vendor_id(),
            device: pci.device_id(),
            class: pci.class_id(),
            numa_nodes: numa,
            cpus,
            os_names,
        });
    }
    gpus.sort_by_key(|g| (g.bus_id, g.bus_id.function()));
    gpus.dedup_by(|a, b| a.bus_id.same_function(b.bus_id));
    Ok(Topology { gpus, ..partial })
}
