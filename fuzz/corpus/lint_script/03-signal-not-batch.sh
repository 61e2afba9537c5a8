#!/bin/bash
#SBATCH --gpus-per-node=1
#SBATCH --signal=USR1@180
#SBATCH --requeue

save() {
  touch SAVE_AND_EXIT
  wait "$SRUN_PID"
  scontrol requeue "$SLURM_JOB_ID"
}
trap save USR1

srun python train.py --ckpt-dir ckpt &
SRUN_PID=$!
wait "$SRUN_PID"
