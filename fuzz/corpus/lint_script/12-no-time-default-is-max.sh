#!/bin/bash
#SBATCH --partition=gpu-a100
#SBATCH --gpus-per-node=1
srun python train.py
