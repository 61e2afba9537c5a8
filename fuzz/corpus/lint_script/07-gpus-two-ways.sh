#!/bin/bash
#SBATCH --gpus-per-node=4
#SBATCH --gres=gpu:4
srun python train.py
