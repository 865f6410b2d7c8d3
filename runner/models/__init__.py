"""The models of what the runner records and signs about a job: the result envelope
(envelope.py), the job's self-report, its result.json (selfreport.py), and the reproducibility
report of its replays (replay.py). Models only: what builds or checks them lives above
(runner.results.envelope, runner.evidence.selfreport, runner.results.replay).
"""

__all__: list[str] = []
