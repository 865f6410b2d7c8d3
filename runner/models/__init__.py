"""The models of what the runner records and signs about a job: the result envelope
(envelope.py) and the job's self-report, its result.json (selfreport.py). Models only: what
builds or checks them lives above (runner.results.envelope, runner.evidence.selfreport).
"""

__all__: list[str] = []
