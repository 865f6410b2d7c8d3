"""Slurm: a contract as one ``sbatch`` job whose batch script runs `runner run` on the node
(``batch``: its request, script and options, pure), the batch step's own process that runs it
and outlives a client whose served runner runs on (``step``), the Slurm commands that submit
it, read its state back and fence an earlier attempt's job (``cluster``), and the fence a
takeover asks, which imports those commands only when it asks (``fence``).
"""

__all__: list[str] = []
