//! MPI launchers' daemon steps.
//!
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
//! (`S_JOB_ARGV`), on every release.

/// The daemons MPI launchers start with srun, one per node.
pub const MPI_DAEMONS: &[&str] = &["orted", "prted", "hydra_pmi_proxy", "hydra_bstrap_proxy", "pmi_proxy"];

/// The MPI launcher daemon a step's command (`argv[0]`, a name or a path)
/// is, if it is one.
pub fn mpi_daemon(argv0: &str) -> Option<&'static str> {
    let name = argv0.trim().rsplit('/').next().unwrap_or_default();
    MPI_DAEMONS.iter().copied().find(|d| *d == name)
}

#[cfg(test)]
mod tests {
    use super::*;

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
