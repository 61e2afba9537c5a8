#!/bin/bash
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --gpus-per-task=1
srun --cpus-per-task=32 python train.py
