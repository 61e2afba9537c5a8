#!/bin/bash
#SBATCH --qos=low
#SBATCH --gpus-per-node=1
srun python train.py
