#!/bin/bash
#SBATCH --gpus-per-node=1
#SBATCH --output=afile/%j.out
srun python train.py
