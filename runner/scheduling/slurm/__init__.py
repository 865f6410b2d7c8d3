"""Slurm: a contract as one ``sbatch`` job whose batch script ``exec``s `runner run` on the
node (``batch``: its request, script and options, pure), and the Slurm commands that submit
it and read its state back (``cluster``).
"""

__all__: list[str] = []
