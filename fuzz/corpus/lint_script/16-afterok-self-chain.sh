#!/bin/bash
#SBATCH --gpus-per-node=1
#SBATCH --signal=B:USR1@180
sbatch --dependency=afterok:$SLURM_JOB_ID "$0"
trap 'touch ckpt/SAVE_AND_EXIT; wait "$SRUN_PID"' USR1
srun python train.py --ckpt-dir ckpt &
SRUN_PID=$!
wait "$SRUN_PID"
