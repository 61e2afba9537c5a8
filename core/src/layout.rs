//! The rank `--auto-rdzv` gives a task: Slurm's, with task 0's node as
//! `MASTER_ADDR`, when srun said where task 0 is; else its place in node order.
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
//!
//! Node order is the fallback. JAX (`jax.distributed.initialize()`) and
//! Lightning's `SLURMEnvironment` number their processes by `SLURM_PROCID`
//! whatever the environment says, so their process 0 is where Slurm's task 0
//! is. srun knows that: it hands its local plugins the step's layout, and
//! the plugin's `local_user_init` reads it (`slurm_job_step_layout_get`, one
//! RPC per step) and, when task 0 is not on the first node, passes the
//! nodes' order of first tasks to the step in [`TASK_ORDER_VAR`]. With it,
//! every node follows Slurm's numbering: `RANK` is `SLURM_PROCID`,
//! `MASTER_ADDR` is task 0's node and `NODE_RANK` is the node's place in that
//! order, so the plugin, torch, JAX and Lightning agree on one host.

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

/// The variable srun's plugin passes to the step's tasks when Slurm's task 0
/// is not on the step's first node: `JOB.STEP:ORDER`, the step's node
/// indices in the order of their first task (`1,0`; ranges as `8-15,0-7`).
/// The job and step tag it: a value inherited from an enclosing step is
/// never read as this step's. The `SLURM` prefix keeps it through `srun
/// --export=NONE`, which passes on only names starting with `SLURM` (and
/// SPANK options) from srun's environment (srun launch.c `_build_user_env`).
pub const TASK_ORDER_VAR: &str = "SLURM_SPANK_GPU_TASK_ORDER";

/// Longest [`TASK_ORDER_VAR`] value srun writes and a node reads.
pub const MAX_TASK_ORDER: usize = 64 << 10;

/// The step's node indices in the order of their first task, from each
/// node's lowest task id (`u32::MAX` for a node without tasks, which goes
/// last), when Slurm's task 0 is not on node 0; `None` when it is (the
/// default block and cyclic distributions, or an arbitrary layout that
/// starts on node 0), and node order serves.
pub fn task_order(first_tasks: &[u32]) -> Option<Vec<u32>> {
    let mut order: Vec<u32> = (0..u32::try_from(first_tasks.len()).ok()?).collect();
    order.sort_by_key(|&n| (first_tasks[n as usize], n));
    order.first().is_some_and(|n| *n != 0).then_some(order)
}

/// The [`TASK_ORDER_VAR`] value for `order` of step `job_id.step_id`.
pub fn format_task_order(job_id: u32, step_id: u32, order: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < order.len() {
        let start = order[i];
        let mut end = start;
        while i + 1 < order.len() && end.checked_add(1) == Some(order[i + 1]) {
            end = order[i + 1];
            i += 1;
        }
        parts.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
        i += 1;
    }
    format!("{job_id}.{step_id}:{}", parts.join(","))
}

/// Reads a [`TASK_ORDER_VAR`] value: the order, when it is for step
/// `job_id.step_id`, names each of its `nnodes` nodes exactly once (at most
/// [`crate::hostlist::MAX_HOSTS`]), and does not start with node 0. Anything
/// else (another step's, a hand-made value) is `None`, and the caller keeps
/// node order.
pub fn parse_task_order(text: &str, job_id: u32, step_id: u32, nnodes: u32) -> Option<Vec<u32>> {
    if text.len() > MAX_TASK_ORDER || nnodes as usize > crate::hostlist::MAX_HOSTS {
        return None;
    }
    let (tag, list) = text.trim().split_once(':')?;
    let (job, step) = tag.split_once('.')?;
    if job.parse::<u32>().ok()? != job_id || step.parse::<u32>().ok()? != step_id {
        return None;
    }
    let n = nnodes as usize;
    let mut order = Vec::with_capacity(n);
    let mut seen = vec![false; n];
    for part in list.split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?),
            None => {
                let a = part.parse::<u32>().ok()?;
                (a, a)
            }
        };
        if a > b || b >= nnodes {
            return None;
        }
        for node in a..=b {
            let slot = seen.get_mut(node as usize)?;
            if *slot {
                return None;
            }
            *slot = true;
            order.push(node);
        }
    }
    (order.len() == n && order.first().is_some_and(|x| *x != 0)).then_some(order)
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
    fn the_order_of_first_tasks_is_given_only_when_it_is_not_node_order() {
        assert_eq!(task_order(&[0, 2]), None, "block");
        assert_eq!(task_order(&[0, 1, 2]), None, "cyclic");
        assert_eq!(task_order(&[1, 0]), Some(vec![1, 0]), "26.05 topology order, -m arbitrary");
        assert_eq!(task_order(&[0, 2, 1]), None, "task 0 on node 0: node order serves");
        assert_eq!(
            task_order(&[4, 0, u32::MAX, 2]),
            Some(vec![1, 3, 0, 2]),
            "a node without tasks goes last"
        );
        assert_eq!(task_order(&[]), None);
    }

    #[test]
    fn task_orders_round_trip_and_are_tagged_by_step() {
        let order: Vec<u32> = (8..16).chain(0..8).collect();
        let text = format_task_order(77, 3, &order);
        assert_eq!(text, "77.3:8-15,0-7");
        assert_eq!(parse_task_order(&text, 77, 3, 16), Some(order));
        assert_eq!(format_task_order(5, 0, &[1, 0]), "5.0:1,0");
        assert_eq!(parse_task_order("5.0:1,0", 5, 0, 2), Some(vec![1, 0]));
        assert_eq!(parse_task_order("5.0:1,0", 5, 1, 2), None, "an enclosing step's");
        assert_eq!(parse_task_order("5.0:1,0", 6, 0, 2), None, "another job's");
    }

    #[test]
    fn hand_made_task_orders_are_refused() {
        for bad in [
            "5.0:0,1",
            "5.0:0,2,1",
            "5.0:1",
            "5.0:1,1",
            "5.0:2,0",
            "5.0:1,0,2",
            "5.0:1-0",
            "5.0:",
            "1,0",
            "5:1,0",
            "5.0:a",
        ] {
            assert_eq!(parse_task_order(bad, 5, 0, 2), None, "{bad}");
        }
        assert_eq!(parse_task_order("5.0:0-4294967295", 5, 0, 2), None);
        assert_eq!(parse_task_order(&format!("5.0:1,0{}", ",".repeat(70_000)), 5, 0, 2), None);
        assert_eq!(parse_task_order("5.0:1,0", 5, 0, u32::MAX), None, "no allocation for a claimed 4G nodes");
    }

    #[test]
    fn gtids_are_counted() {
        assert_eq!(count_gtids("0,1,2"), Some(3));
        assert_eq!(count_gtids("7"), Some(1));
        assert_eq!(count_gtids(""), None);
        assert_eq!(count_gtids("0,x"), None);
    }
}
