//! The SLURM_* and CUDA_VISIBLE_DEVICES values the plugin reads, and CPU lists.
#![no_main]
use slurm_formats::cpuset::CpuSet;
use task_plan::{binding, gputable, layout, nodeaddr, ports, rdzv};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = rdzv::parse_tasks_per_node(text, 4096);
    let _ = rdzv::count_gpus(Some(text));
    let _ = ports::last_reserved_port(text);
    let _ = nodeaddr::from_aliases(text, "node1");
    let _ = nodeaddr::from_slurm_conf(text, "node1");
    let _ = binding::parse_hex_mask(text);
    let _ = ports::parse_ephemeral_range(text);
    let _ = ports::parse_reserved_ports(text);
    let _ = ports::listening_inodes(text, 20000);
    // srun's word on where task 0 is: a value read back is a permutation of the nodes.
    for nnodes in [2, 16, 1 << 16] {
        if let Some(order) = layout::parse_task_order(text, 5, 0, nnodes) {
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert!(sorted.iter().copied().eq(0..nnodes), "{text:?} gave {order:?}");
            assert_eq!(
                layout::parse_task_order(&layout::format_task_order(5, 0, &order), 5, 0, nnodes),
                Some(order)
            );
        }
    }
    if let Ok(set) = CpuSet::parse(text) {
        assert_eq!(CpuSet::parse(&set.to_string()).ok(), Some(set));
    }
    let nums: Vec<u32> = text.bytes().take(64).map(u32::from).collect();
    let (a, b) = nums.split_at(nums.len() / 2);
    let shares = gputable::task_gpus(a, b, u32::from(data.first().copied().unwrap_or(0) % 9), 8);
    assert_eq!(shares.len(), 8);
});
