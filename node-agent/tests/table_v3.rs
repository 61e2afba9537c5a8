//! Issue 31, "same answers": the GPU table version 3 that the agent makes
//! through hwloc's object API gives the plugin the same bindings as the hwloc
//! XML walker the plugin used before (`hwloc_xml_oracle::from_hwloc_xml`).
//!
//! For every real topology in `plan/tests/fixtures/topologies/` (the
//! project's own fixtures and every topology of the shared research data) and
//! the synthetic nodes the local cluster gives its fake GPUs:
//!
//! 1. **new**: real hwloc loads the XML (`TopologyBuilder::from_xml`, the
//!    system libhwloc), `gpu_node_agent::sources::machine::from_hwloc` walks it with
//!    the object API, `topo::build_table` makes the table as `topology
//!    --write` does without NVML, and `GpuTable::parse` reads its text back as
//!    the plugin does;
//! 2. **old**: the walker reads the XML, and the same `build_table` makes the
//!    GPU rows from its topology (what the agent wrote before v3);
//! 3. the machines are compared, then the binding plans of `task_plan::binding`
//!    case by case: each GPU alone, all GPUs in one task, one task per GPU,
//!    two tasks per GPU, and every local task's share of the step through
//!    `plan_task` (as `task_init` plans, for 1, 2 and 3 tasks per GPU and
//!    for fewer tasks than GPUs), each with SMT on (every allowed CPU) and
//!    off (one PU per core, as `--hint=nomultithread` gives), and each
//!    display-class PCI device of any vendor alone, comparing CPUs,
//!    NUMA nodes (what `--gpu-affinity=mem` prefers) and notes.
//!
//! hwloc 2.9 (this machine's) cannot read hwloc 3's XML (`*.v3.xml`): those
//! files are reported and skipped; the test fails if hwloc refuses any other
//! file, or reads a v3 file and gives a different answer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use gpu_node_agent::{reports::topo, sources::machine};
use slurm_formats::cpuset::CpuSet;
use task_plan::binding::{self, Binding, GpuLocality, TaskGpus, TaskShare};
use task_plan::gputable::GpuTable;
use task_plan::topology::{Topology, synthetic_xml};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../plan/tests/fixtures/topologies");

/// What one side gives the plugin: the machine and the GPU table.
struct Side {
    topology: Topology,
    table: GpuTable,
}

impl Side {
    /// The GPUs the cases bind to: the table's rows (NVIDIA GPUs), else (a
    /// machine without NVIDIA GPUs) the machine's display-class PCI devices.
    fn gpus(&self) -> Vec<GpuLocality> {
        if self.table.gpus.is_empty() {
            self.topology.gpus.iter().map(GpuLocality::from).collect()
        } else {
            self.table
                .gpus
                .iter()
                .map(|g| GpuLocality { numa_nodes: g.numa_nodes.clone(), cpus: g.cpus.clone() })
                .collect()
        }
    }
}

/// The one difference between the machines: an hwloc 1 export whose NUMA
/// nodes 1 and 3 have no memory (`nodeset="0x0"`, outside `allowed_nodeset`;
/// their CPUs are listed). hwloc 2 drops memory-less NUMA nodes when it
/// imports such a file; the walker kept them. No binding case differs: CPU
/// sets are the same, and no GPU is local to those CPUs.
const MEMORYLESS_NUMA: &[(&str, &[u32])] = &[("fluxsched_chimera_multi_gpu_types.xml", &[1, 3])];

/// The plugin's view through table v3 made with real hwloc.
fn new_side(xml: &str) -> Result<Side, String> {
    let machine = machine::from_xml_text(xml)?;
    let text = topo::build_table(&machine, None, None).to_text();
    assert!(text.starts_with(task_plan::gputable::HEADER), "{text}");
    assert!(text.len() <= task_plan::gputable::MAX_BYTES);
    let table =
        GpuTable::parse(&text).unwrap_or_else(|e| panic!("the agent's table does not parse: {e}\n{text}"));
    let topology = table.topology().0.into_owned();
    assert!(!table.topology().1, "a v3 table is never degraded");
    Ok(Side { topology, table })
}

/// The plugin's view before v3: the walker's topology and the rows made from it.
fn old_side(xml: &str) -> Side {
    let topology = hwloc_xml_oracle::from_hwloc_xml(xml).unwrap();
    let mut table = topo::build_table(&topology, None, None);
    table.machine = None;
    Side { topology, table }
}

/// One PU per core: what Slurm gives with SMT off.
fn one_pu_per_core(t: &Topology) -> CpuSet {
    t.cores.iter().filter_map(|c| c.iter().next()).filter(|c| t.allowed_cpus.contains(*c)).collect()
}

/// Every case of one machine: (name, plan) pairs in a fixed order.
fn cases(side: &Side) -> Vec<(String, Vec<Binding>)> {
    let gpus = side.gpus();
    let t = &side.topology;
    let mut out = Vec::new();
    for (smt, allowed) in [("smt-on", t.allowed_cpus.clone()), ("smt-off", one_pu_per_core(t))] {
        let task =
            |id: u32, g: Vec<GpuLocality>| TaskGpus { local_id: id, allowed: allowed.clone(), gpus: g };
        for (i, g) in gpus.iter().enumerate() {
            out.push((format!("{smt} gpu {i} alone"), binding::plan(t, &[task(0, vec![g.clone()])])));
        }
        // Every display-class device (AMD GPUs and BMC VGA chips too), alone.
        for (i, g) in t.gpus.iter().enumerate() {
            let one = task(0, vec![GpuLocality::from(g)]);
            out.push((
                format!("{smt} display device {i} ({}) alone", g.bus_id.hwloc()),
                binding::plan(t, &[one]),
            ));
        }
        out.push((format!("{smt} all gpus, one task"), binding::plan(t, &[task(0, gpus.clone())])));
        let per_gpu: Vec<TaskGpus> = (0u32..).zip(&gpus).map(|(i, g)| task(i, vec![g.clone()])).collect();
        out.push((format!("{smt} one task per gpu"), binding::plan(t, &per_gpu)));
        let two: Vec<TaskGpus> =
            (0u32..).zip(gpus.iter().flat_map(|g| [g, g])).map(|(i, g)| task(i, vec![g.clone()])).collect();
        out.push((format!("{smt} two tasks per gpu"), binding::plan(t, &two)));
        // task_init's path: every local task sees the step's GPUs and takes its share.
        let n = u32::try_from(side.table.gpus.len()).unwrap();
        if n == 0 {
            continue;
        }
        let step: Vec<u32> = side.table.gpus.iter().map(|g| g.slurm_index).collect();
        for tasks in [n, 2 * n, 3 * n, n.div_ceil(2)] {
            for local in 0..tasks {
                let all: Vec<Vec<u32>> = task_plan::gputable::task_gpus(&step, &step, local, tasks)
                    .into_iter()
                    .map(Option::unwrap_or_default)
                    .collect();
                let share = TaskShare::new(step.clone(), &all, local);
                let b = binding::plan_task(t, &side.table, &share, &allowed);
                out.push((format!("{smt} plan_task local {local} of {tasks}"), vec![b]));
            }
        }
    }
    out
}

/// Compares the two sides of one machine; returns the number of cases.
fn compare(name: &str, xml: &str, new: &Side) -> usize {
    let old = old_side(xml);
    let dropped = MEMORYLESS_NUMA.iter().find(|(file, _)| *file == name).map_or(&[][..], |(_, nodes)| *nodes);
    let mut old_numa = old.topology.numa_nodes.clone();
    old_numa.retain(|n| !dropped.contains(&n.os_index));
    assert_eq!(
        old_numa.len() + dropped.len(),
        old.topology.numa_nodes.len(),
        "{name}: {dropped:?} not in the XML"
    );
    assert_eq!(new.topology.numa_nodes, old_numa, "{name}: NUMA nodes");
    assert_eq!(new.topology.cores, old.topology.cores, "{name}: cores");
    assert_eq!(new.topology.allowed_cpus, old.topology.allowed_cpus, "{name}: allowed CPUs");
    assert_eq!(new.topology.gpus, old.topology.gpus, "{name}: display-class PCI devices");
    assert_eq!(new.table.gpus, old.table.gpus, "{name}: GPU rows");
    let (a, b) = (cases(new), cases(&old));
    assert_eq!(a.len(), b.len(), "{name}");
    for ((case, got), (_, want)) in a.iter().zip(&b) {
        assert_eq!(got, want, "{name}: {case}");
    }
    a.len()
}

fn fixture_files() -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(FIXTURES)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "xml"))
        .map(|p| {
            (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(&p).unwrap())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn every_real_topology_binds_the_same_from_table_v3_as_from_the_xml() {
    let files = fixture_files();
    assert!(files.len() >= 19, "{} fixtures", files.len());
    let (mut compared, mut cases, mut refused) = (0, 0, Vec::new());
    for (name, xml) in &files {
        match new_side(xml) {
            Ok(new) => {
                let n = compare(name, xml, &new);
                eprintln!(
                    "{name}: {n} cases, {} GPU rows, {} cores",
                    new.table.gpus.len(),
                    new.topology.cores.len()
                );
                compared += 1;
                cases += n;
            }
            Err(e) => {
                assert!(name.ends_with(".v3.xml"), "hwloc refused {name}: {e}");
                refused.push(name.as_str());
            }
        }
    }
    eprintln!("compared {compared} topologies, {cases} cases; hwloc refused (hwloc 3 XML): {refused:?}");
    assert!(compared >= 16 && cases >= 1000, "{compared} topologies, {cases} cases");
}

/// The local cluster's nodes (`tests/src/agents.rs`): fake GPUs on a synthetic
/// XML of two domains, interleaved or in blocks, on 2, 8 and 16 CPUs; and the
/// plugin's unit tests' node.
#[test]
fn the_labs_fake_gpu_nodes_bind_the_same_from_table_v3() {
    let bus: Vec<String> = (0..8).map(|i| format!("0000:{:02x}:00.0", 0x10 + i)).collect();
    let bus: Vec<&str> = bus.iter().map(String::as_str).collect();
    let odd: Vec<&str> = bus.iter().skip(1).step_by(2).copied().collect();
    let even: Vec<&str> = bus.iter().step_by(2).copied().collect();
    let set = |s: &str| CpuSet::parse(s).unwrap();
    let nodes = [
        ("interleaved, 2 CPUs", synthetic_xml(&[(set("0"), odd.clone()), (set("1"), even.clone())])),
        ("blocks, 2 CPUs", synthetic_xml(&[(set("0"), bus[..4].to_vec()), (set("1"), bus[4..].to_vec())])),
        (
            "blocks, 16 CPUs",
            synthetic_xml(&[(set("0-7"), bus[..4].to_vec()), (set("8-15"), bus[4..].to_vec())]),
        ),
        ("interleaved, 8 CPUs, odd split", synthetic_xml(&[(set("0-2"), odd), (set("3-7"), even)])),
    ];
    let mut cases = 0;
    for (name, xml) in &nodes {
        let new = new_side(xml).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(new.table.gpus.len(), 8, "{name}: every fake GPU has a row");
        assert!(new.table.gpus.iter().all(|g| !g.cpus.is_empty() && g.numa_nodes.len() == 1), "{name}");
        cases += compare(name, xml, &new);
    }
    eprintln!("compared {} lab nodes, {cases} cases", nodes.len());
}
