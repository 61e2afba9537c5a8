#!/bin/bash
#SBATCH --nodes=8
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-task=1
#SBATCH --cpus-per-task=12

# The guide's fixes: a #! line (sbatch refuses a script without one),
# --cpus-per-task passed again ("safe regardless of version") and
# --kill-on-bad-exit=1 (one dead rank must not leave the rest burning GPU-hours).
srun --cpus-per-task="$SLURM_CPUS_PER_TASK" --kill-on-bad-exit=1 python train.py --config configs/7b.yaml
