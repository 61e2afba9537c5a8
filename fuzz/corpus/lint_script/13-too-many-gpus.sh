#!/bin/bash
#SBATCH --gpus-per-node=16
srun python train.py
