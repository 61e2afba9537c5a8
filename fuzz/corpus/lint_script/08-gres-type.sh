#!/bin/bash
#SBATCH --gres=gpu:v100:8
srun python train.py
