#!/bin/bash
#SBATCH --gpus-per-node=1
#SBATCH --signal=B:USR1@180
#SBATCH --requeue

on_usr1() {
  touch "ckpt/SAVE_AND_EXIT"
  wait "$SRUN_PID"
}
trap on_usr1 USR1

srun python train.py --ckpt-dir ckpt &
SRUN_PID=$!
wait "$SRUN_PID"
