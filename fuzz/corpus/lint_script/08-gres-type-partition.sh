#!/bin/bash
#SBATCH --partition=gpu-h100
#SBATCH --gpus-per-node=a100:4
srun python train.py
