//! Launchers: what each reads for the one rendezvous point, the command-line
//! flags with which a user gives it one of their own, and MPI launchers'
//! daemon steps.
//!
//! `--auto-rdzv` computes one rendezvous point per step, `MASTER_ADDR:MASTER_PORT`
//! (rank 0's host and the step's port, see [`crate::rdzv`]). Frameworks that
//! read `MASTER_ADDR`/`MASTER_PORT`, `RANK` and `WORLD_SIZE` need nothing more
//! (`init_process_group("gloo")`, Lightning Fabric, a plain `Accelerator()`,
//! `deepspeed.init_distributed()`). The launchers below read other names, so
//! the plugin sets those too, to the same point, where the user set nothing:
//!
//! | launcher | reads | facts (from its source) |
//! | --- | --- | --- |
//! | torchrun (`torch.distributed.run`) | `PET_RDZV_ENDPOINT`, `PET_RDZV_ID` | every flag defaults to `PET_<FLAG>`; with `--rdzv-backend=static` (the default) an endpoint beats `--master-addr`/`--master-port`, with `c10d` the endpoint is the only way to the store (else each node waits on its own `localhost:29400`) |
//! | `accelerate launch` | nothing of its own | `--main_process_ip/port`, `--machine_rank`, `--num_machines` come from its flags or its config file only; it hands the rest to torchrun's parser, so `PET_*` (and `PET_RDZV_ENDPOINT`, which beats its default port 29500) are its defaults on one machine per task |
//! | `jax.distributed.initialize()` | `JAX_COORDINATOR_ADDRESS`, else its Slurm detection with `JAX_COORDINATOR_PORT` | the Slurm detection takes the first host of `SLURM_STEP_NODELIST` and, without `JAX_COORDINATOR_PORT`, port `61440 + job_id % 4096` (one per job: concurrent steps collide); the process id is `SLURM_PROCID`, the count `SLURM_NTASKS`; no variable sets the process id |
//!
//! A flag on the step's command line wins over these variables only where the
//! launcher reads the flag first. `PET_RDZV_ENDPOINT` would beat a
//! `--master-port` the user wrote (torchrun's static backend prefers the
//! endpoint) and accelerate's `--main_process_port` (on one machine it becomes
//! torchrun's `--master-port`), so it is left unset when the command line
//! carries one of those ([`ENDPOINT_FLAGS`]). The plugin reads the command
//! line from Slurm (`S_JOB_ARGV`); `explain` from its own, or the one given
//! after `--`.
//!
//! ## MPI launchers' daemons
//! `mpirun` inside an allocation starts one daemon per node with srun: Open
//! MPI 4 `orted`, Open MPI 5 (PRRTE) `prted`, MPICH's and Intel MPI's Hydra
//! `hydra_pmi_proxy` (Intel MPI also `hydra_bstrap_proxy`, and `pmi_proxy`
//! in older releases). From Slurm 23.11 that srun is `srun
//! --external-launcher` (Slurm exports `OMPI_MCA_plm_slurm_args`,
//! `PRTE_MCA_plm_slurm_args` and the Hydra bootstrap arguments to every job,
//! env.c `set_env_from_opts`), a step with one task per node that uses all
//! the job's resources (stepmgr.c `_build_ext_launcher_step`); before, it is
//! an ordinary step. Either way the daemons then start the MPI ranks, which
//! inherit the daemon's environment: a `RANK`, `LOCAL_RANK` or `PET_*` set
//! for the daemon (the node's index) would reach every rank of the node, and
//! a CPU mask set for it would bind every rank to it.
//!
//! Slurm does not tell a SPANK plugin that a step is an external launcher's
//! (`LAUNCH_EXT_LAUNCHER` reaches slurmstepd's step flags only; no SPANK item
//! or variable carries it), so the step is recognised by its command
//! (`S_JOB_ARGV`), on every release; it gets only what all its ranks share
//! ([`crate::rdzv::Step::shared_only`]), none of the variables above.

use std::fmt;

/// The daemons MPI launchers start with srun, one per node.
pub const MPI_DAEMONS: &[&str] = &["orted", "prted", "hydra_pmi_proxy", "hydra_bstrap_proxy", "pmi_proxy"];

/// The MPI launcher daemon a step's command (`argv[0]`, a name or a path)
/// is, if it is one.
pub fn mpi_daemon(argv0: &str) -> Option<&'static str> {
    let name = argv0.trim().rsplit('/').next().unwrap_or_default();
    MPI_DAEMONS.iter().copied().find(|d| *d == name)
}

/// Every variable this module may set: none can be a site default.
pub const VARS: &[&str] =
    &["PET_RDZV_ENDPOINT", "PET_RDZV_ID", "JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_PORT"];

/// Flags that give torchrun (directly, or through `accelerate launch`) a
/// rendezvous point of the user's own; `PET_RDZV_ENDPOINT` would override
/// some of them, and is pointless beside the others.
pub const ENDPOINT_FLAGS: &[&str] = &[
    // torchrun: an endpoint of their own (the variable would only be a default).
    "--rdzv-endpoint",
    "--rdzv_endpoint",
    // torchrun: static rendezvous at their own master (the endpoint would win over it).
    "--master-port",
    "--master_port",
    "--master-addr",
    "--master_addr",
    // accelerate launch: becomes torchrun's --master-addr/--master-port on one machine.
    "--main_process_ip",
    "--main_process_port",
];

/// Flags that give torchrun a rendezvous id of the user's own.
pub const ID_FLAGS: &[&str] = &["--rdzv-id", "--rdzv_id"];

/// The rendezvous point every task of the step agrees on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Point<'a> {
    /// `MASTER_ADDR` as the task will see it (the user's, when kept).
    pub addr: &'a str,
    /// `MASTER_PORT` as the task will see it.
    pub port: &'a str,
    /// The job id.
    pub job_id: u32,
    /// The step id.
    pub step_id: u32,
    /// One task per node: the tasks are launchers (torchrun, `accelerate launch`).
    pub launcher_layout: bool,
}

/// One variable for a launcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LauncherVar {
    /// Its name.
    pub name: &'static str,
    /// The value, from the rendezvous point.
    pub value: String,
    /// Why (shown by `verbose` and `explain`).
    pub why: &'static str,
    /// The flag on the command line that makes the plugin leave it unset.
    pub given: Option<&'static str>,
}

impl fmt::Display for LauncherVar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.value)
    }
}

/// The first of `flags` the command line carries, as a word of its own or
/// `--flag=value`. Each argument is also split at white space, so a
/// `bash -c "torchrun --master-port 29577 train.py"` step is read too.
pub fn given_flag(argv: &[String], flags: &[&'static str]) -> Option<&'static str> {
    argv.iter().flat_map(|a| a.split_whitespace()).find_map(|word| {
        let name = word.split_once('=').map_or(word, |(n, _)| n);
        flags.iter().copied().find(|f| *f == name)
    })
}

/// The launchers' variables for a task of a (non-batch) step, in a stable
/// order: torchrun's (one-task-per-node steps only), then JAX's.
pub fn plan(point: &Point<'_>, argv: &[String]) -> Vec<LauncherVar> {
    let endpoint = format!("{}:{}", point.addr, point.port);
    let mut out = Vec::new();
    if point.launcher_layout {
        out.push(LauncherVar {
            name: "PET_RDZV_ENDPOINT",
            value: endpoint.clone(),
            why: "MASTER_ADDR:MASTER_PORT, torchrun's --rdzv-endpoint",
            given: given_flag(argv, ENDPOINT_FLAGS),
        });
        out.push(LauncherVar {
            name: "PET_RDZV_ID",
            value: format!("{}.{}", point.job_id, slurm_formats::step_id::step_name(point.step_id)),
            why: "job.step, torchrun's --rdzv-id",
            given: given_flag(argv, ID_FLAGS),
        });
    }
    out.push(LauncherVar {
        name: "JAX_COORDINATOR_ADDRESS",
        value: endpoint,
        why: "MASTER_ADDR:MASTER_PORT, for jax.distributed.initialize()",
        given: None,
    });
    out.push(LauncherVar {
        name: "JAX_COORDINATOR_PORT",
        value: point.port.to_owned(),
        why: "MASTER_PORT",
        given: None,
    });
    out
}

/// The warning for a task whose `RANK` is not its `SLURM_PROCID`: JAX and
/// Lightning's `SLURMEnvironment` number their processes by `SLURM_PROCID`,
/// and their process 0 hosts the coordinator or store, which is at
/// `MASTER_ADDR` (rank 0's host). JAX takes a process id as an argument;
/// Lightning reads `SLURM_PROCID` whatever the environment says.
pub fn jax_rank_warning(rank: u32, procid: u32) -> Option<String> {
    (rank != procid).then(|| {
        format!(
            "RANK={rank} but SLURM_PROCID={procid}: JAX and Lightning number their processes by \
             SLURM_PROCID, and their process 0 must be on MASTER_ADDR: for JAX call \
             jax.distributed.initialize(process_id=int(os.environ[\"RANK\"])); Lightning's \
             SLURMEnvironment fails on this layout (docs/users.md, Frameworks)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    fn point(launcher_layout: bool) -> Point<'static> {
        Point { addr: "node1", port: "20017", job_id: 1234, step_id: 1, launcher_layout }
    }

    fn names(vars: &[LauncherVar]) -> Vec<&str> {
        vars.iter().map(|v| v.name).collect()
    }

    #[test]
    fn one_task_per_node_gets_torchruns_endpoint_and_id_and_every_step_jaxs() {
        let vars = plan(&point(true), &argv(&["torchrun", "train.py"]));
        assert_eq!(names(&vars), VARS);
        let value = |n: &str| vars.iter().find(|v| v.name == n).map(|v| v.value.as_str());
        assert_eq!(value("PET_RDZV_ENDPOINT"), Some("node1:20017"));
        assert_eq!(value("PET_RDZV_ID"), Some("1234.1"));
        assert_eq!(value("JAX_COORDINATOR_ADDRESS"), Some("node1:20017"));
        assert_eq!(value("JAX_COORDINATOR_PORT"), Some("20017"));
        assert!(vars.iter().all(|v| v.given.is_none()));
        // Several tasks per node are the workers themselves: no torchrun variables.
        let vars = plan(&point(false), &argv(&["python", "train.py"]));
        assert_eq!(names(&vars), ["JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_PORT"]);
    }

    #[test]
    fn a_flag_the_user_wrote_leaves_the_endpoint_unset() {
        for cmd in [
            &["torchrun", "--master-port", "29577", "train.py"][..],
            &["torchrun", "--master_port=29577", "train.py"],
            &["python", "-m", "torch.distributed.run", "--master-addr=node2", "t.py"],
            &["torchrun", "--rdzv-backend=c10d", "--rdzv-endpoint=node1:29400", "t.py"],
            &["torchrun", "--rdzv_endpoint", "node1:29400", "t.py"],
            &["accelerate", "launch", "--main_process_port", "29577", "t.py"],
            &["accelerate", "launch", "--main_process_ip=node1", "t.py"],
            &["bash", "-c", "torchrun --master-port 29577 train.py"],
        ] {
            let vars = plan(&point(true), &argv(cmd));
            let endpoint = vars.iter().find(|v| v.name == "PET_RDZV_ENDPOINT").unwrap();
            assert!(endpoint.given.is_some(), "{cmd:?}");
            assert!(cmd.iter().any(|w| w.contains(endpoint.given.unwrap())), "{cmd:?}");
        }
        let vars = plan(&point(true), &argv(&["torchrun", "--rdzv-id=run7", "t.py"]));
        let id = vars.iter().find(|v| v.name == "PET_RDZV_ID").unwrap();
        assert_eq!(id.given, Some("--rdzv-id"));
    }

    #[test]
    fn only_whole_flags_count() {
        // A longer flag, or the flag's text inside a value, is not the flag.
        for cmd in [
            &["torchrun", "--master-port-extra=1", "t.py"][..],
            &["python", "t.py", "--out=--master-port"],
            &["torchrun", "--nnodes=2", "--rdzv-backend=c10d", "t.py"],
        ] {
            assert_eq!(given_flag(&argv(cmd), ENDPOINT_FLAGS), None, "{cmd:?}");
        }
        assert_eq!(given_flag(&[], ENDPOINT_FLAGS), None);
    }

    #[test]
    fn the_batch_steps_id_reads_as_slurm_names_it() {
        let p = Point { step_id: slurm_formats::step_id::BATCH_STEP, ..point(true) };
        let vars = plan(&p, &[]);
        assert_eq!(vars[1].value, "1234.batch");
    }

    #[test]
    fn jax_is_warned_of_only_when_rank_and_procid_differ() {
        assert_eq!(jax_rank_warning(3, 3), None);
        let w = jax_rank_warning(0, 1).unwrap();
        assert!(w.contains("process_id=int(os.environ[\"RANK\"])"), "{w}");
        assert!(w.starts_with("RANK=0 but SLURM_PROCID=1"), "{w}");
    }

    #[test]
    fn daemons_are_known_by_name_or_path() {
        assert_eq!(mpi_daemon("prted"), Some("prted"));
        assert_eq!(mpi_daemon("/usr/lib/x86_64-linux-gnu/openmpi/bin/orted"), Some("orted"));
        assert_eq!(mpi_daemon("/opt/intel/mpi/bin/hydra_bstrap_proxy"), Some("hydra_bstrap_proxy"));
        assert_eq!(mpi_daemon("python"), None);
        assert_eq!(mpi_daemon("/home/u/prted.sh"), None);
        assert_eq!(mpi_daemon(""), None);
    }
}
