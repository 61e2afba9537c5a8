//! The rank `--auto-rdzv` gives a task: its place in node order.
//!
//! Slurm numbers a step's tasks (`SLURM_PROCID`) by the step's distribution,
//! while the node indices (`SLURM_NODEID`) and the node list
//! (`SLURM_STEP_NODELIST`, whose first host is `MASTER_ADDR`) keep node-index
//! order. With the default block distribution task 0 is on node 0, but not
//! always:
//!
//! - `-m arbitrary` with `SLURM_HOSTFILE` (every release) puts task 0 on the
//!   hostfile's first line, which need not be the node list's first host;
//! - from Slurm 26.05, with a `TopologyPlugin` (`topology/tree`,
//!   `topology/block`) and without `CR_NO_DIST_TOPO_BLOCK`, task ids follow
//!   the topology's order: `slurm_step_layout.c` `_task_layout_topo` counts
//!   `tasks[]` per node index but hands out `tids` in switch/block order, so
//!   when the first switch of topology.conf holds the higher-numbered nodes,
//!   task 0 runs on the step's second host;
//! - heterogeneous steps number their components in order, whatever nodes
//!   each component got.
//!
//! An `env://` rendezvous then hangs: rank 0 hosts the store at
//! `MASTER_ADDR`, which is another node. The one numbering every node can
//! compute alone, and that puts rank 0 on `MASTER_ADDR`'s node with
//! `NODE_RANK` 0, is node order: `RANK` = the tasks of the step on
//! lower-indexed nodes + the task's local id, from `SLURM_STEP_TASKS_PER_NODE`
//! (node-index order on every release, env.c `env_array_for_step`). It is
//! also torchrun's own convention (`node_rank * nproc_per_node +
//! local_rank`), and equals `SLURM_PROCID` under block distribution.
//! `SLURM_PROCID` itself is Slurm's and is left alone.

/// The task's rank in node order, when the step's layout says it: `None`
/// when the counts do not describe this step (missing, of another length
/// than the step's nodes, not adding up to its tasks, or another count for
/// this node than its own tasks, as when two components of a heterogeneous
/// step share a node), and the caller keeps `SLURM_PROCID`.
///
/// - `tasks_per_node`: the step's tasks on each node, in node-index order;
/// - `node_id`, `nnodes`, `ntasks`: this node's index, the step's nodes and tasks;
/// - `local_id`, `local_tasks`: the task's local id and this node's tasks
///   of the step, as Slurm counted them for this process (`S_JOB_LOCAL_TASK_COUNT`,
///   or the entries of `SLURM_GTIDS`).
pub fn node_order_rank(
    tasks_per_node: &[u32],
    node_id: u32,
    nnodes: u32,
    ntasks: u32,
    local_id: u32,
    local_tasks: u32,
) -> Option<u32> {
    if u32::try_from(tasks_per_node.len()).ok()? != nnodes {
        return None;
    }
    let total = tasks_per_node.iter().try_fold(0u32, |acc, n| acc.checked_add(*n))?;
    let here = *tasks_per_node.get(node_id as usize)?;
    if total != ntasks || here != local_tasks || local_id >= here {
        return None;
    }
    let before = tasks_per_node.iter().take(node_id as usize).sum::<u32>();
    before.checked_add(local_id)
}

/// The number of entries of a `SLURM_GTIDS` list (`0,1,2`): the tasks of
/// this step on this node.
pub fn count_gtids(text: &str) -> Option<u32> {
    let ids: Option<Vec<u32>> =
        text.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| s.parse().ok()).collect();
    u32::try_from(ids?.len()).ok().filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_layouts_keep_slurms_numbering() {
        // -n3 -N2: node 0 has tasks 0-1, node 1 has task 2.
        assert_eq!(node_order_rank(&[2, 1], 0, 2, 3, 1, 2), Some(1));
        assert_eq!(node_order_rank(&[2, 1], 1, 2, 3, 0, 1), Some(2));
        assert_eq!(node_order_rank(&[4], 0, 1, 4, 3, 4), Some(3));
    }

    #[test]
    fn every_rank_is_given_once_and_rank_0_is_on_node_0() {
        let counts = [3u32, 1, 4, 2];
        let mut seen = Vec::new();
        for (node, n) in (0u32..).zip(counts) {
            for local in 0..n {
                seen.push(node_order_rank(&counts, node, 4, 10, local, n).unwrap());
            }
        }
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
        assert_eq!(node_order_rank(&counts, 0, 4, 10, 0, 3), Some(0));
    }

    #[test]
    fn counts_that_do_not_describe_the_step_give_nothing() {
        assert_eq!(node_order_rank(&[2, 1], 0, 3, 3, 0, 2), None, "another node count");
        assert_eq!(node_order_rank(&[2, 1], 0, 2, 4, 0, 2), None, "another task count");
        // Two components of a het step on one node: the node's count is both's.
        assert_eq!(node_order_rank(&[3], 0, 1, 3, 0, 1), None);
        assert_eq!(node_order_rank(&[2, 1], 1, 2, 3, 1, 1), None, "local id past the node's tasks");
        assert_eq!(node_order_rank(&[2, 1], 5, 2, 3, 0, 1), None);
        assert_eq!(node_order_rank(&[u32::MAX, 2], 1, 2, 1, 0, 2), None, "overflow");
    }

    #[test]
    fn gtids_are_counted() {
        assert_eq!(count_gtids("0,1,2"), Some(3));
        assert_eq!(count_gtids("7"), Some(1));
        assert_eq!(count_gtids(""), None);
        assert_eq!(count_gtids("0,x"), None);
    }
}
