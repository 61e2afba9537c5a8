#!/bin/bash
#SBATCH --job-name=t01
#SBATCH --gpus-per-node=1
#SBATCH --output=/scratch/%u/missing/%x-%j.out
srun python train.py
