#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-task=1
srun --kill-on-bad-exit=1 torchrun --nnodes=2 --nproc-per-node=8 train.py
