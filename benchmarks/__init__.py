"""The runner's benchmarks (scripts/benchmark.py, scripts/bench_slurm.py): each figure beside
its baseline, measured interleaved in one run.

One module per figure, as ``scripts/benchmark.py --only`` names it (toy, startup, stdout,
staging, parse, concurrent_jobs for ``concurrent``, egress, fetch, stagecache, agentimage),
with targets.py (every figure's target by figure id, the comparison with the previous report,
the docs' performance table), profiles.py (where the time goes), report.py (the markdown and
JSON report), cli.py (the flags, the modes and the run) and _support.py (the session, the
bench, statistics, rows, interleaving and timers). inproc.py is run by path as a process of
its own for the in-process figures; slurm.py is the Slurm benchmark. The reports are in
benchmarks/results/. The helpers shared with the tests (contract writers, the egress test
topology) are :mod:`runner.testing`'s.
"""
