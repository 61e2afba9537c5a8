//! GPU-aware binding on real machines: the hwloc XML exports in
//! `fixtures/topologies/` (see `fixtures/topologies/SOURCES.md`).
//!
//! Every expected CPU set, NUMA node and core below was computed with hwloc's
//! own tools on the same file (`hwloc-calc --input FILE pci=BUSID`,
//! `--intersect NUMAnode --po`, `core:N -I pu --po`), then written in here:
//! the tests need no hwloc at run time.

// A test binary: a failed lookup in the fixture should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hwloc_xml_oracle::from_hwloc_xml;
use slurm_formats::cpuset::CpuSet;
use task_plan::binding::{Binding, GpuLocality, TaskGpus, plan};
use task_plan::topology::Topology;

const XE8640: &str = include_str!("fixtures/topologies/fluxcore_ipa20_dell-xe8640-4xH100.xml");
const SIERRA: &str = include_str!("fixtures/topologies/fluxcore_sierra_power9-4xV100.xml");
const DGX2_V2: &str = include_str!("fixtures/topologies/hwloc_nvidiaDGX2.v2.xml");
const DGX2_V3: &str = include_str!("fixtures/topologies/hwloc_nvidiaDGX2.v3.xml");
const GB10_V3: &str = include_str!("fixtures/topologies/hwloc_nvidia-dgx-gb10.v3.xml");
const EM64T_24: &str = include_str!("fixtures/topologies/hwloc_24em64t-2n6c2t-pci.xml");
const INTEL64_RESTRICTED: &str =
    include_str!("fixtures/topologies/hwloc_64intel64-3g2n+2n-irregulargroups+pci.xml");
const LASSEN_HWLOC1: &str = include_str!("fixtures/topologies/mpibind_coral-lassen-hwloc1.xml");
const G4DN: &str = include_str!("fixtures/topologies/mpibind_g4dnmetal.xml");
const TIOGA_MI250X: &str = include_str!("fixtures/topologies/mpibind_eas-tioga_amd-mi250x.xml");
const CORONA_MI50: &str = include_str!("fixtures/topologies/mpibind_epyc-corona-p2_amd-mi50.xml");
const CHIMERA: &str = include_str!("fixtures/topologies/fluxsched_chimera_multi_gpu_types.xml");

const ALL: [(&str, &str); 12] = [
    ("xe8640", XE8640),
    ("sierra", SIERRA),
    ("dgx2.v2", DGX2_V2),
    ("dgx2.v3", DGX2_V3),
    ("gb10.v3", GB10_V3),
    ("24em64t", EM64T_24),
    ("64intel64", INTEL64_RESTRICTED),
    ("lassen-hwloc1", LASSEN_HWLOC1),
    ("g4dn", G4DN),
    ("tioga", TIOGA_MI250X),
    ("corona", CORONA_MI50),
    ("chimera", CHIMERA),
];

fn set(list: &str) -> CpuSet {
    CpuSet::parse(list).unwrap()
}

fn topo(xml: &str) -> Topology {
    from_hwloc_xml(xml).unwrap()
}

/// The locality of the GPU with this OS device name (`nvml0`, `cuda2`).
fn gpu(t: &Topology, os_name: &str) -> GpuLocality {
    t.gpu_by_os_name(os_name).unwrap_or_else(|| panic!("no GPU {os_name}")).into()
}

fn task(t: &Topology, local_id: u32, allowed: &CpuSet, gpus: &[&str]) -> TaskGpus {
    TaskGpus { local_id, allowed: allowed.clone(), gpus: gpus.iter().map(|g| gpu(t, g)).collect() }
}

fn lists(p: &[Binding]) -> Vec<String> {
    p.iter().map(|b| b.cpus.to_string()).collect()
}

fn numas(p: &[Binding]) -> Vec<Vec<u32>> {
    p.iter().map(|b| b.numa_nodes.clone()).collect()
}

/// What must hold for every plan: one binding per task in order, within the
/// allowed set, non-empty, within the GPUs' CPUs unless kept with a note, and
/// whole cores (a core's usable PUs are all there or none are). With
/// `disjoint`, no CPU is in two bindings.
fn check(t: &Topology, tasks: &[TaskGpus], p: &[Binding], disjoint: bool) {
    assert_eq!(p.len(), tasks.len());
    for (b, task) in p.iter().zip(tasks) {
        assert_eq!(b.local_id, task.local_id);
        assert!(
            b.cpus.is_subset(&task.allowed),
            "task {}: {} not within {}",
            b.local_id,
            b.cpus,
            task.allowed
        );
        assert!(!b.cpus.is_empty() || task.allowed.is_empty(), "task {} got no CPUs", b.local_id);
        assert_eq!(b.numa_nodes, t.numa_of_cpus(&b.cpus));
        if b.note.is_some() {
            assert_eq!(b.cpus, task.allowed, "a note means Slurm's mask was kept");
            continue;
        }
        let near = task.gpus.iter().fold(CpuSet::new(), |a, g| a.union(&g.cpus));
        let usable = near.intersection(&task.allowed);
        assert!(b.cpus.is_subset(&usable), "task {}: {} outside its GPUs' {}", b.local_id, b.cpus, near);
        for core in &t.cores {
            if !core.intersection(&b.cpus).is_empty() {
                assert!(
                    core.intersection(&usable).is_subset(&b.cpus),
                    "task {} splits core {core}",
                    b.local_id
                );
            }
        }
    }
    if disjoint {
        for (i, a) in p.iter().enumerate() {
            for b in p.iter().skip(i + 1) {
                assert!(
                    a.cpus.intersection(&b.cpus).is_empty(),
                    "tasks {} and {} overlap",
                    a.local_id,
                    b.local_id
                );
            }
        }
    }
}

#[test]
fn every_fixture_parses_and_plans_within_the_rules() {
    for (name, xml) in ALL {
        let t = from_hwloc_xml(xml).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!t.cores.is_empty() && !t.numa_nodes.is_empty() && !t.allowed_cpus.is_empty(), "{name}");
        let nv: Vec<GpuLocality> = t.nvidia_gpus().map(GpuLocality::from).collect();
        if nv.is_empty() {
            continue;
        }
        for ntasks in [1usize, 2, 4, 8] {
            for per_task in [1usize, 2] {
                let tasks: Vec<TaskGpus> = (0..ntasks)
                    .map(|i| TaskGpus {
                        local_id: u32::try_from(i).unwrap(),
                        allowed: t.allowed_cpus.clone(),
                        gpus: (0..per_task).map(|k| nv[(i * per_task + k) % nv.len()].clone()).collect(),
                    })
                    .collect();
                check(&t, &tasks, &plan(&t, &tasks), false);
            }
        }
    }
}

// ---- Dell PowerEdge XE8640: 2 x Xeon 8480+ in SNC4 (8 NUMA nodes of 14 cores, SMT2), 4 x H100 ----

#[test]
fn xe8640_model_matches_hwloc() {
    let t = topo(XE8640);
    let expected_numa = [
        "0-13,112-125",
        "14-27,126-139",
        "28-41,140-153",
        "42-55,154-167",
        "56-69,168-181",
        "70-83,182-195",
        "84-97,196-209",
        "98-111,210-223",
    ];
    assert_eq!(t.numa_nodes.iter().map(|n| n.os_index).collect::<Vec<_>>(), (0..8).collect::<Vec<u32>>());
    for (n, want) in t.numa_nodes.iter().zip(expected_numa) {
        assert_eq!(n.cpus, set(want), "NUMA {}", n.os_index);
    }
    assert_eq!(t.cores.len(), 112);
    for (i, core) in (0u32..).zip(&t.cores) {
        assert_eq!(*core, [i, i + 112].into_iter().collect::<CpuSet>(), "core {i}: SMT siblings n and n+112");
    }
    assert_eq!(t.allowed_cpus, set("0-223"));

    // Bus-id order; nvml numbering is not NUMA order (nvml0 is on NUMA 3, nvml1 on NUMA 1).
    let buses: Vec<String> = t.nvidia_gpus().map(|g| g.bus_id.hwloc()).collect();
    let nv: Vec<(&str, Vec<u32>, String, String)> = t
        .nvidia_gpus()
        .zip(&buses)
        .map(|(g, b)| (b.as_str(), g.numa_nodes.clone(), g.cpus.to_string(), g.os_names.join(" ")))
        .collect();
    assert_eq!(
        nv,
        [
            ("0000:4e:00.0", vec![3], "42-55,154-167".to_string(), "opencl0d0 cuda0 nvml0".to_string()),
            ("0000:5f:00.0", vec![1], "14-27,126-139".into(), "opencl0d1 cuda1 nvml1".into()),
            ("0000:cb:00.0", vec![7], "98-111,210-223".into(), "opencl0d2 cuda2 nvml2".into()),
            ("0000:db:00.0", vec![5], "70-83,182-195".into(), "opencl0d3 cuda3 nvml3".into()),
        ]
    );
    let h100 = t.gpu_by_bus_id("00000000:5F:00.0").unwrap();
    assert_eq!((h100.vendor, h100.device, h100.class), (0x10de, 0x2330, 0x0302));
    // The BMC's Matrox VGA is a display device, not an NVIDIA GPU.
    let vga = t.gpu_by_bus_id("0000:03:00.0").unwrap();
    assert_eq!((vga.vendor, vga.class, vga.numa_nodes.clone()), (0x102b, 0x0300, vec![0]));
    assert_eq!(t.gpus.len(), 5);
    assert_eq!(t.numa_of_cpus(&set("13-14,200")), vec![0, 1, 6]);
}

#[test]
fn xe8640_one_task_per_gpu_gets_its_numa_node() {
    let t = topo(XE8640);
    let all = t.allowed_cpus.clone();
    let tasks: Vec<_> = (0..4).map(|i| task(&t, i, &all, &[&format!("nvml{i}")])).collect();
    let p = plan(&t, &tasks);
    check(&t, &tasks, &p, true);
    assert_eq!(lists(&p), ["42-55,154-167", "14-27,126-139", "98-111,210-223", "70-83,182-195"]);
    assert_eq!(numas(&p), [vec![3], vec![1], vec![7], vec![5]]);
    assert!(p.iter().all(|b| b.note.is_none()));
}

#[test]
fn xe8640_one_task_with_all_gpus_gets_the_union() {
    let t = topo(XE8640);
    let tasks = [task(&t, 0, &t.allowed_cpus, &["nvml0", "nvml1", "nvml2", "nvml3"])];
    let p = plan(&t, &tasks);
    check(&t, &tasks, &p, true);
    assert_eq!(lists(&p), ["14-27,42-55,70-83,98-111,126-139,154-167,182-195,210-223"]);
    assert_eq!(numas(&p), [vec![1, 3, 5, 7]]);
}

#[test]
fn xe8640_two_tasks_with_two_gpus_each() {
    let t = topo(XE8640);
    let all = t.allowed_cpus.clone();
    let tasks = [task(&t, 0, &all, &["nvml0", "nvml1"]), task(&t, 1, &all, &["nvml2", "nvml3"])];
    let p = plan(&t, &tasks);
    check(&t, &tasks, &p, true);
    assert_eq!(lists(&p), ["14-27,42-55,126-139,154-167", "70-83,98-111,182-195,210-223"]);
    assert_eq!(numas(&p), [vec![1, 3], vec![5, 7]]);
}

#[test]
fn xe8640_eight_tasks_two_per_gpu_split_each_numa_node() {
    let t = topo(XE8640);
    let all = t.allowed_cpus.clone();
    let tasks: Vec<_> = (0..8).map(|i| task(&t, i, &all, &[&format!("nvml{}", i / 2)])).collect();
    let p = plan(&t, &tasks);
    check(&t, &tasks, &p, true);
    assert_eq!(
        lists(&p),
        [
            "42-48,154-160",
            "49-55,161-167",
            "14-20,126-132",
            "21-27,133-139",
            "98-104,210-216",
            "105-111,217-223",
            "70-76,182-188",
            "77-83,189-195",
        ]
    );
    assert!(p.iter().all(|b| b.cpus.len() == 14), "7 whole cores each");
}

#[test]
fn xe8640_shared_node_with_part_of_a_socket() {
    let t = topo(XE8640);
    // Slurm gave the job cores 20-27 with both threads (NUMA 1) and cores 42-49
    // with one thread each (NUMA 3), nothing on the other socket.
    let allowed = set("20-27,132-139,42-49");
    let tasks = [
        task(&t, 0, &allowed, &["nvml0"]),
        task(&t, 1, &allowed, &["nvml1"]),
        task(&t, 2, &allowed, &["nvml2"]),
    ];
    let p = plan(&t, &tasks);
    check(&t, &tasks, &p, false);
    assert_eq!(lists(&p), ["42-49", "20-27,132-139", "20-27,42-49,132-139"]);
    assert_eq!((p[0].note.as_ref(), p[1].note.as_ref()), (None, None));
    let note = p[2].note.as_deref().unwrap();
    assert!(note.contains("98-111,210-223") && note.contains("20-27,42-49,132-139"), "{note}");
    assert!(note.contains("NUMA 7"), "{note}");
    assert_eq!(p[2].numa_nodes, [1, 3]);

    // Two tasks on the single-threaded cores: SMT off by mask, 4 cores each.
    let tasks = [task(&t, 0, &allowed, &["nvml0"]), task(&t, 1, &allowed, &["nvml0"])];
    let p = plan(&t, &tasks);
    check(&t, &tasks, &p, true);
    assert_eq!(lists(&p), ["42-45", "46-49"]);

    // A half-allowed core stays one unit: cores 20-22 whole, 23-25 one thread.
    let allowed = set("20-25,132-134");
    let tasks = [task(&t, 0, &allowed, &["nvml1"]), task(&t, 1, &allowed, &["nvml1"])];
    let p = plan(&t, &tasks);
    check(&t, &tasks, &p, true);
    assert_eq!(lists(&p), ["20-22,132-134", "23-25"]);
}

// ---- IBM AC922 (sierra): POWER9 SMT4, NUMA nodes 0 and 8, GPU memory nodes 252-255, hwloc 1.11 ----

#[test]
fn sierra_power9_numa_0_and_8() {
    let t = topo(SIERRA);
    let numa: Vec<(u32, String)> = t.numa_nodes.iter().map(|n| (n.os_index, n.cpus.to_string())).collect();
    assert_eq!(
        numa,
        [
            (0, "0-87".to_string()),
            (8, "88-175".into()),
            (252, String::new()),
            (253, String::new()),
            (254, String::new()),
            (255, String::new()),
        ]
    );
    assert_eq!(t.cores.len(), 44);
    assert!(t.cores.iter().all(|c| c.len() == 4), "SMT4");
    assert_eq!(t.cores[1], set("4-7"));
    let buses: Vec<String> = t.nvidia_gpus().map(|g| g.bus_id.hwloc()).collect();
    let nv: Vec<(&str, Vec<u32>, String)> = t
        .nvidia_gpus()
        .zip(&buses)
        .map(|(g, b)| (b.as_str(), g.numa_nodes.clone(), g.cpus.to_string()))
        .collect();
    assert_eq!(
        nv,
        [
            ("0004:04:00.0", vec![0], "0-87".to_string()),
            ("0004:05:00.0", vec![0], "0-87".into()),
            ("0035:03:00.0", vec![8], "88-175".into()),
            ("0035:04:00.0", vec![8], "88-175".into()),
        ]
    );
    assert_eq!(t.gpu_by_bus_id("00000035:03:00.0").unwrap().os_names, ["card2", "renderD130", "cuda2"]);
    // The ASPEED BMC VGA in domain 0002 is not an NVIDIA GPU.
    assert_eq!(t.gpu_by_bus_id("0002:02:00.0").unwrap().vendor, 0x1a03);
    assert_eq!(t.gpus.len(), 5);

    let all = t.allowed_cpus.clone();
    let tasks: Vec<_> = (0..4).map(|i| task(&t, i, &all, &[&format!("cuda{i}")])).collect();
    let p = plan(&t, &tasks);
    check(&t, &tasks, &p, true);
    assert_eq!(lists(&p), ["0-43", "44-87", "88-131", "132-175"]);
    assert_eq!(numas(&p), [vec![0], vec![0], vec![8], vec![8]]);

    let tasks = [task(&t, 0, &all, &["cuda0", "cuda1"]), task(&t, 1, &all, &["cuda2", "cuda3"])];
    let p = plan(&t, &tasks);
    check(&t, &tasks, &p, true);
    assert_eq!(lists(&p), ["0-87", "88-175"]);
    assert_eq!(numas(&p), [vec![0], vec![8]]);

    // 8 tasks, 2 per GPU: 4 tasks per 22-core socket get 6, 6, 5, 5 cores.
    let tasks: Vec<_> = (0..8).map(|i| task(&t, i, &all, &[&format!("cuda{}", i / 2)])).collect();
    let p = plan(&t, &tasks);
    check(&t, &tasks, &p, true);
    assert_eq!(lists(&p), ["0-23", "24-47", "48-67", "68-87", "88-111", "112-135", "136-155", "156-175"]);
}

#[test]
fn lassen_hwloc1_with_reserved_cores() {
    // hwloc 1.x export from a cgroup that reserves cores 0-7 and 88-95 (one per socket).
    let t = topo(LASSEN_HWLOC1);
    assert_eq!(t.allowed_cpus, set("8-87,96-175"));
    assert_eq!(t.numa_nodes.iter().map(|n| n.os_index).collect::<Vec<_>>(), [0, 8, 252, 253, 254, 255]);
    assert_eq!(t.cores.len(), 40);
    assert_eq!(t.cores[0], set("8-11"));
    assert_eq!(
        t.nvidia_gpus().map(|g| g.cpus.to_string()).collect::<Vec<_>>(),
        ["8-87", "8-87", "96-175", "96-175"]
    );
    let all = t.allowed_cpus.clone();
    let nv: Vec<GpuLocality> = t.nvidia_gpus().map(GpuLocality::from).collect();
    let tasks: Vec<_> = (0..4u32)
        .map(|i| TaskGpus { local_id: i, allowed: all.clone(), gpus: vec![nv[i as usize].clone()] })
        .collect();
    let p = plan(&t, &tasks);
    check(&t, &tasks, &p, true);
    assert_eq!(lists(&p), ["8-47", "48-87", "96-135", "136-175"]);
}

// ---- NVIDIA DGX-2H (16 x V100; hwloc's test file keeps 2 cores per socket, 1 PU each) ----

#[test]
fn dgx2_v2_and_v3_read_the_same() {
    let v2 = topo(DGX2_V2);
    let v3 = topo(DGX2_V3);
    assert_eq!(v2, v3);
    assert_eq!(v2.cores, [set("0"), set("1"), set("24"), set("25")], "SMT off: one PU per core");
    assert_eq!(v2.numa_nodes.iter().map(|n| n.cpus.to_string()).collect::<Vec<_>>(), ["0-1", "24-25"]);
    assert_eq!(v2.nvidia_gpus().count(), 16);
    for i in 0..16 {
        let g = v2.gpu_by_os_name(&format!("nvml{i}")).unwrap();
        let (cpus, numa) = if i < 8 { ("0-1", vec![0]) } else { ("24-25", vec![1]) };
        assert_eq!(
            (g.cpus.to_string(), g.numa_nodes.clone()),
            (cpus.to_string(), numa),
            "nvml{i} {}",
            g.bus_id
        );
    }
    assert_eq!(v2.gpu_by_bus_id("0000:b7:00.0").unwrap().os_names, ["nvml8"]);
}

#[test]
fn dgx2_more_tasks_than_cores_share_them_evenly() {
    let t = topo(DGX2_V3);
    let all = t.allowed_cpus.clone();
    // 16 tasks, one GPU each: 8 tasks per socket on 2 cores.
    let tasks: Vec<_> = (0..16).map(|i| task(&t, i, &all, &[&format!("nvml{i}")])).collect();
    let p = plan(&t, &tasks);
    check(&t, &tasks, &p, false);
    let mut want: Vec<&str> = ["0", "1"].repeat(4);
    want.extend(["24", "25"].repeat(4));
    assert_eq!(lists(&p), want);
    assert!(p.iter().all(|b| b.note.is_none()));
    // 8 tasks with 2 GPUs each.
    let tasks: Vec<_> = (0..8)
        .map(|i| task(&t, i, &all, &[&format!("nvml{}", 2 * i), &format!("nvml{}", 2 * i + 1)]))
        .collect();
    let p = plan(&t, &tasks);
    check(&t, &tasks, &p, false);
    assert_eq!(lists(&p), ["0", "1", "0", "1", "24", "25", "24", "25"]);
    // 2 tasks with 8 GPUs each.
    let gpus: Vec<String> = (0..16).map(|i| format!("nvml{i}")).collect();
    let names: Vec<&str> = gpus.iter().map(String::as_str).collect();
    let tasks = [task(&t, 0, &all, &names[..8]), task(&t, 1, &all, &names[8..])];
    let p = plan(&t, &tasks);
    check(&t, &tasks, &p, true);
    assert_eq!(lists(&p), ["0-1", "24-25"]);
}

// ---- AWS g4dn.metal: 2 x 24 cores SMT2, 8 x T4 ----

#[test]
fn g4dn_eight_gpus_with_1_2_and_8_tasks() {
    let t = topo(G4DN);
    let all = t.allowed_cpus.clone();
    assert_eq!(t.nvidia_gpus().count(), 8);
    assert_eq!(t.cores[5], set("5,53"));

    let names: Vec<String> = (0..8).map(|i| format!("nvml{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let one = [task(&t, 0, &all, &names)];
    let p = plan(&t, &one);
    check(&t, &one, &p, true);
    assert_eq!(lists(&p), ["0-95"]);
    assert_eq!(numas(&p), [vec![0, 1]]);

    let two = [task(&t, 0, &all, &names[..4]), task(&t, 1, &all, &names[4..])];
    let p = plan(&t, &two);
    check(&t, &two, &p, true);
    assert_eq!(lists(&p), ["0-23,48-71", "24-47,72-95"]);

    let eight: Vec<_> = (0..8).map(|i| task(&t, i, &all, &[names[i as usize]])).collect();
    let p = plan(&t, &eight);
    check(&t, &eight, &p, true);
    assert_eq!(
        lists(&p),
        [
            "0-5,48-53",
            "6-11,54-59",
            "12-17,60-65",
            "18-23,66-71",
            "24-29,72-77",
            "30-35,78-83",
            "36-41,84-89",
            "42-47,90-95",
        ]
    );

    // 8 tasks with 2 GPUs each (GPUs shared by 2 tasks): 4 tasks per socket again.
    let pairs: Vec<_> = (0..8)
        .map(|i| task(&t, i, &all, &[names[(2 * i as usize) % 8], names[(2 * i as usize + 1) % 8]]))
        .collect();
    let p = plan(&t, &pairs);
    check(&t, &pairs, &p, true);
    // Tasks 0, 1, 4, 5 have GPUs on socket 0 and share it in local_id order.
    assert_eq!(
        lists(&p),
        [
            "0-5,48-53",
            "6-11,54-59",
            "24-29,72-77",
            "30-35,78-83",
            "12-17,60-65",
            "18-23,66-71",
            "36-41,84-89",
            "42-47,90-95",
        ]
    );
}

// ---- 2 x 6 cores SMT2 with NUMA nodes on even/odd CPU numbers ----

#[test]
fn interleaved_cpu_numbering_keeps_siblings_together() {
    let t = topo(EM64T_24);
    assert_eq!(t.cores[0], set("0,12"));
    assert_eq!(t.numa_nodes[0].cpus, set("0,2,4,6,8,10,12,14,16,18,20,22"));
    let g = t.gpu_by_bus_id("0000:06:00.0").unwrap();
    assert_eq!(
        (g.cpus.to_string(), g.numa_nodes.clone()),
        ("0,2,4,6,8,10,12,14,16,18,20,22".into(), vec![0])
    );
    let loc = GpuLocality::from(g);
    let all = t.allowed_cpus.clone();
    let tasks: Vec<_> =
        (0..2).map(|i| TaskGpus { local_id: i, allowed: all.clone(), gpus: vec![loc.clone()] }).collect();
    let p = plan(&t, &tasks);
    check(&t, &tasks, &p, true);
    assert_eq!(lists(&p), ["0,2,4,12,14,16", "6,8,10,18,20,22"]);
}

// ---- A machine whose allowed cpuset is smaller than the machine ----

#[test]
fn gpus_outside_the_allowed_cpus_keep_slurms_mask() {
    let t = topo(INTEL64_RESTRICTED);
    assert_eq!(t.allowed_cpus, set("0-15"));
    assert_eq!(t.cores.len(), 64, "cores of the whole machine, allowed or not");
    let buses: Vec<String> = t.nvidia_gpus().map(|g| g.bus_id.hwloc()).collect();
    let nv: Vec<(&str, String, Vec<u32>)> = t
        .nvidia_gpus()
        .zip(&buses)
        .map(|(g, b)| (b.as_str(), g.cpus.to_string(), g.numa_nodes.clone()))
        .collect();
    assert_eq!(
        nv,
        [("0002:01:00.0", "32-39".to_string(), vec![4]), ("0004:01:00.0", "56-63".into(), vec![7])]
    );
    let gpus: Vec<GpuLocality> = t.nvidia_gpus().map(GpuLocality::from).collect();
    let tasks = [
        TaskGpus { local_id: 0, allowed: t.allowed_cpus.clone(), gpus: vec![gpus[0].clone()] },
        TaskGpus { local_id: 1, allowed: t.allowed_cpus.clone(), gpus: vec![] },
    ];
    let p = plan(&t, &tasks);
    check(&t, &tasks, &p, false);
    assert_eq!(lists(&p), ["0-15", "0-15"]);
    let note = p[0].note.as_deref().unwrap();
    assert!(note.contains("32-39") && note.contains("0-15") && note.contains("NUMA 4"), "{note}");
    assert_eq!(p[1].note.as_deref(), Some("no GPU"));
    assert_eq!(numas(&p), [vec![0, 1], vec![0, 1]]);
}

// ---- AMD GPUs are never taken for NVIDIA ones ----

#[test]
fn amd_machines_have_no_nvidia_gpus() {
    let tioga = topo(TIOGA_MI250X);
    assert_eq!(tioga.nvidia_gpus().count(), 0);
    assert_eq!(tioga.gpus.len(), 8);
    assert!(tioga.gpus.iter().all(|g| (g.vendor, g.device, g.class) == (0x1002, 0x7408, 0x0380)));
    // MI250X GCDs are local to one L3 (8 cores) each, as hwloc-calc says.
    let g = tioga.gpu_by_os_name("rsmi4").unwrap();
    assert_eq!(
        (g.bus_id.hwloc().as_str(), g.cpus.to_string(), g.numa_nodes.clone()),
        ("0000:d1:00.0", "0-7,64-71".into(), vec![0])
    );

    let corona = topo(CORONA_MI50);
    assert_eq!(corona.nvidia_gpus().count(), 0);
    assert_eq!(corona.gpus.iter().filter(|g| g.vendor == 0x1002).count(), 8);
    assert_eq!(corona.gpus.len(), 9, "8 MI50 and the ASPEED VGA");

    // A mixed node: one NVIDIA GTX 1070 (VGA class) and one AMD card.
    let chimera = topo(CHIMERA);
    let nv: Vec<String> = chimera.nvidia_gpus().map(|g| g.bus_id.hwloc()).collect();
    assert_eq!(nv, ["0000:08:00.0"]);
    assert_eq!(chimera.gpu_by_bus_id("08:00.0").unwrap().cpus, set("0-7,32-39"));
    assert_eq!(chimera.gpu_by_bus_id("0000:44:00.0").unwrap().vendor, 0x1002);
}

// ---- hwloc 3 export of an NVIDIA DGX Spark (GB10): 20 cores, no SMT, no PCI in the file ----

#[test]
fn gb10_v3_without_pci_uses_nvml_locality() {
    let t = topo(GB10_V3);
    assert!(t.gpus.is_empty());
    assert_eq!(t.cores.len(), 20);
    assert!(t.cores.iter().all(|c| c.len() == 1));
    assert_eq!(t.numa_nodes.len(), 1);
    // The locality as NVML would report it: NUMA node 0.
    let g = GpuLocality { numa_nodes: vec![0], cpus: CpuSet::new() };
    let tasks: Vec<_> = (0..2)
        .map(|i| TaskGpus { local_id: i, allowed: t.allowed_cpus.clone(), gpus: vec![g.clone()] })
        .collect();
    let p = plan(&t, &tasks);
    assert_eq!(lists(&p), ["0-9", "10-19"]);
}
