"""Running jobs elsewhere: a cluster decides where `runner run` runs, from above (scheduling
imports nothing of execution). ``slurm/``: the batch job and the Slurm commands;
``kubernetes/``: the manifests, their checked rendering and their apply; and what both share
(``planned``: the contract checked and planned as `runner run` does; ``submissions``: the
records of ``<state>/<cluster>/<job id>/``).
"""

__all__: list[str] = []
