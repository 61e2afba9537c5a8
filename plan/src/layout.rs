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
//! is. slurmctld knows that: where task 0 can be elsewhere
//! ([`layout_question`]: `-m arbitrary`, a heterogeneous allocation, 26.05's
//! topology order under a topology that ranks nodes), the plugin's
//! `local_user_init` in srun asks for the step's layout
//! (`slurm_job_step_layout_get`, one `REQUEST_STEP_LAYOUT` RPC) and, when
//! task 0 is not on the first node, passes the nodes' order of first tasks
//! to the step in [`TASK_ORDER_VAR`]. The default layout costs slurmctld
//! nothing. With it,
//! every node follows Slurm's numbering: `RANK` is `SLURM_PROCID`,
//! `MASTER_ADDR` is task 0's node and `NODE_RANK` is the node's place in that
//! order, so the plugin, torch, JAX and Lightning agree on one host.

use std::fmt;

use slurm_formats::release::Release;

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
/// [`slurm_formats::hostlist::MAX_HOSTS`]), and does not start with node 0. Anything
/// else (another step's, a hand-made value) is `None`, and the caller keeps
/// node order.
pub fn parse_task_order(text: &str, job_id: u32, step_id: u32, nnodes: u32) -> Option<Vec<u32>> {
    if text.len() > MAX_TASK_ORDER || nnodes as usize > slurm_formats::hostlist::MAX_HOSTS {
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

/// What srun's own `slurm.conf` (libslurm's `slurm_conf`, read without an
/// RPC) says about laying a step's tasks out by network topology.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopologyConf {
    /// `TopologyPlugin` (`topology/tree`, `topology/block`, ...; Slurm
    /// reads `topology/none` and `topology/default` as `topology/flat`).
    pub plugin: String,
    /// `SelectTypeParameters` holds `CR_NO_DIST_TOPO_BLOCK`
    /// (`SELECT_NO_DIST_TOPO_BLOCK`): slurmctld never ranks nodes by topology.
    pub no_dist_topo_block: bool,
    /// A `topology.yaml` beside `slurm.conf`: topologies per partition,
    /// which may rank nodes whatever `TopologyPlugin` says (the flat
    /// topology's `alpha_step_rank`).
    pub topology_yaml: bool,
}

/// `SELECT_NO_DIST_TOPO_BLOCK` of `slurm.h` (26.05: `SLURM_BIT(11)` of
/// `select_type_param`).
pub const SELECT_NO_DIST_TOPO_BLOCK: u16 = 1 << 11;

/// The first release whose step layout follows the topology's node ranks
/// (`slurm_step_layout.c` `_task_layout_topo`, absent up to 25.11).
pub const TOPOLOGY_LAYOUT_SINCE: Release = Release { major: 26, minor: 5 };

/// Why srun asks slurmctld for a step's layout, when it must.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayoutQuestion {
    /// `-m arbitrary` or `SLURM_HOSTFILE` (which srun turns into it): task
    /// 0 is on the hostfile's first line.
    Arbitrary,
    /// A heterogeneous allocation (`SLURM_HET_SIZE`): its components'
    /// layouts are asked for as before, whatever each says.
    Heterogeneous,
    /// 26.05 and later, a block layout and a topology that may rank nodes
    /// (the plugin's name, or `topology.yaml`).
    Topology(String),
    /// 26.05 and later, a block layout, and srun's configuration could not
    /// be read: asking is the safe side.
    TopologyUnknown(String),
}

impl fmt::Display for LayoutQuestion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayoutQuestion::Arbitrary => f.write_str("-m arbitrary (or SLURM_HOSTFILE)"),
            LayoutQuestion::Heterogeneous => f.write_str("a heterogeneous allocation"),
            LayoutQuestion::Topology(what) => write!(f, "{what} may lay tasks out by topology"),
            LayoutQuestion::TopologyUnknown(why) => {
                write!(f, "srun's topology settings could not be read ({why})")
            }
        }
    }
}

/// Whether srun must ask slurmctld where a multi-node step's tasks are
/// (one `REQUEST_STEP_LAYOUT` RPC), and why: only where Slurm's task 0 can
/// be on another node than the step's first. `None` is the default: every
/// release's block, cyclic and plane layouts put task 0 on node 0
/// (`slurm_step_layout.c`), and so does 26.05's topology order wherever no
/// topology ranks nodes.
///
/// - `distribution`: srun's `SLURM_DISTRIBUTION`, which srun sets in its own
///   environment from `-m` (or from `SLURM_HOSTFILE`, which makes it
///   `arbitrary`) before its plugins' `local_user_init` (srun.c
///   `_setup_one_job_env` → env.c `setup_env`, every release); unset
///   when the user gave no distribution;
/// - `het_size`: srun's `SLURM_HET_SIZE`, set in a heterogeneous allocation;
/// - `release`: the Slurm release the plugin was built for;
/// - `topology`: srun's configuration, read only on releases that lay
///   tasks out by topology (the caller passes a closure, so older releases
///   read nothing).
pub fn layout_question(
    distribution: Option<&str>,
    het_size: Option<&str>,
    release: Release,
    topology: impl FnOnce() -> Result<TopologyConf, String>,
) -> Option<LayoutQuestion> {
    // The node-level distribution is the first word: `arbitrary`,
    // `block:cyclic`, `cyclic,pack`, `plane`, `*:block` (`*` = default).
    let node_dist = distribution.unwrap_or("").trim().split([':', ',']).next().unwrap_or("").trim();
    if node_dist.eq_ignore_ascii_case("arbitrary") {
        return Some(LayoutQuestion::Arbitrary);
    }
    if het_size.is_some_and(|s| !s.trim().is_empty()) {
        return Some(LayoutQuestion::Heterogeneous);
    }
    // Topology order replaces only the block layout (`_task_layout`: cyclic
    // and plane come first), which is also the default.
    let block = matches!(node_dist.to_ascii_lowercase().as_str(), "" | "*" | "block");
    if release < TOPOLOGY_LAYOUT_SINCE || !block {
        return None;
    }
    match topology() {
        Err(why) => Some(LayoutQuestion::TopologyUnknown(why)),
        Ok(conf) if conf.no_dist_topo_block => None,
        Ok(conf) if conf.topology_yaml => Some(LayoutQuestion::Topology("topology.yaml".into())),
        Ok(conf) => {
            let flat = matches!(
                conf.plugin.trim().to_ascii_lowercase().as_str(),
                "" | "topology/flat" | "topology/none" | "topology/default"
            );
            (!flat).then(|| LayoutQuestion::Topology(format!("TopologyPlugin={}", conf.plugin.trim())))
        }
    }
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

    fn rel((major, minor): (u32, u32)) -> Release {
        Release { major, minor }
    }

    fn conf(plugin: &str, no_block: bool, yaml: bool) -> Result<TopologyConf, String> {
        Ok(TopologyConf { plugin: plugin.into(), no_dist_topo_block: no_block, topology_yaml: yaml })
    }

    #[test]
    fn the_default_layout_asks_nothing_on_any_release() {
        for release in [(22, 5), (24, 11), (25, 11), (26, 5), (27, 11)].map(rel) {
            for dist in
                [None, Some("block"), Some("cyclic"), Some("block:cyclic"), Some("plane"), Some("*:block")]
            {
                let q = layout_question(dist, None, release, || conf("topology/flat", false, false));
                assert_eq!(q, None, "{release:?} {dist:?}");
            }
        }
    }

    #[test]
    fn arbitrary_layouts_and_het_allocations_ask_on_every_release() {
        let never = || -> Result<TopologyConf, String> { panic!("not read") };
        for release in [(22, 5), (24, 11), (26, 5)].map(rel) {
            assert_eq!(
                layout_question(Some("arbitrary"), None, release, never),
                Some(LayoutQuestion::Arbitrary)
            );
            assert_eq!(
                layout_question(Some("Arbitrary,pack"), Some("2"), release, never),
                Some(LayoutQuestion::Arbitrary)
            );
            assert_eq!(layout_question(None, Some("2"), release, never), Some(LayoutQuestion::Heterogeneous));
        }
    }

    #[test]
    fn a_topology_asks_only_from_26_05_and_only_for_block_layouts() {
        let tree = || conf("topology/tree", false, false);
        assert_eq!(
            layout_question(None, None, rel((25, 11)), || -> Result<TopologyConf, String> { panic!() }),
            None
        );
        assert_eq!(
            layout_question(None, None, rel((26, 5)), tree),
            Some(LayoutQuestion::Topology("TopologyPlugin=topology/tree".into()))
        );
        assert!(layout_question(Some("block:block"), None, rel((26, 5)), tree).is_some());
        assert_eq!(layout_question(Some("cyclic"), None, rel((26, 5)), tree), None);
        assert_eq!(layout_question(Some("plane"), None, rel((26, 5)), tree), None);
        // CR_NO_DIST_TOPO_BLOCK turns node ranking off.
        assert_eq!(layout_question(None, None, rel((26, 5)), || conf("topology/block", true, false)), None);
        // Flat, under any of its names, ranks nothing; topology.yaml may.
        for flat in ["topology/flat", "topology/none", "topology/default", ""] {
            assert_eq!(
                layout_question(None, None, rel((26, 5)), || conf(flat, false, false)),
                None,
                "{flat}"
            );
        }
        assert_eq!(
            layout_question(None, None, rel((26, 5)), || conf("topology/flat", false, true)),
            Some(LayoutQuestion::Topology("topology.yaml".into()))
        );
        // Unreadable settings: ask.
        assert!(matches!(
            layout_question(None, None, rel((26, 5)), || Err("no slurm_conf".into())),
            Some(LayoutQuestion::TopologyUnknown(_))
        ));
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
