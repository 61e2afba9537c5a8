#!/bin/bash
#SBATCH --signal=B:USR1@180     # send USR1 to the batch shell 180 seconds before termination
#SBATCH --requeue               # allow requeuing
#SBATCH --qos=low
#SBATCH --gpus-per-node=1

CKPT_DIR=/scratch/$USER/ckpt/$SLURM_JOB_NAME
mkdir -p "$CKPT_DIR"

on_preempt() {
  echo "[$(date -Is)] Received USR1. Requesting a checkpoint save."
  touch "$CKPT_DIR/SAVE_AND_EXIT"     # the training loop checks for this file every step
  wait "$SRUN_PID"                    # wait for the save to finish
  echo "[$(date -Is)] Requeuing."
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
}
trap on_preempt USR1

srun --cpus-per-task="$SLURM_CPUS_PER_TASK" python train.py --ckpt-dir "$CKPT_DIR" &
SRUN_PID=$!
wait "$SRUN_PID"
