"""Running jobs elsewhere: Slurm (batch scripts, allocations, the cluster) and Kubernetes (render,
plan, apply).
"""
