#!/bin/bash
#SBATCH --gpus-per-node=1
#SBATCH --error=/readonly/logs/%j.err
srun python train.py
