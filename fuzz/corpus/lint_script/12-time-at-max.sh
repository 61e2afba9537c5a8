#!/bin/bash
#SBATCH --gpus-per-node=1
#SBATCH --time=3-00:00:00
srun python train.py
