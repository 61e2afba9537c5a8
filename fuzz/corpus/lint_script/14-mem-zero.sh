#!/bin/bash
#SBATCH --gpus-per-node=1
#SBATCH --mem=0
srun python train.py
