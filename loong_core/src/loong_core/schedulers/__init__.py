"""Cluster schedulers: job files that run the same ``loong train`` on every node.

``job`` holds what every scheduler shares (the flags it owns, the defaults it adds, the per-node
command); ``slurm`` writes an sbatch script, ``k8s`` a PyTorchJob or JobSet manifest.
"""
