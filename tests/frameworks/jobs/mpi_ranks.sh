#!/bin/sh
# An MPI rank printer: the rank and size MPI gave this process (Open MPI's, or
# PMIx's under srun --mpi=pmix), beside what the plugin set (RANK must never be
# a daemon's: unset under mpirun, SLURM_PROCID under srun).
rank=${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-?}}
size=${OMPI_COMM_WORLD_SIZE:-${SLURM_STEP_NUM_TASKS:-?}}
echo "mpi-rank $rank size $size host $(hostname) RANK=${RANK-unset} MASTER_ADDR=${MASTER_ADDR-unset}"
