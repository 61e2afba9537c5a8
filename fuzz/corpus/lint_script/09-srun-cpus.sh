#!/bin/bash
#SBATCH --gpus-per-node=1
#SBATCH --cpus-per-task=16
srun python train.py --workers 16
