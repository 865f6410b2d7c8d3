"""Running one job: the orchestrator, its attempts, the container, quotas, the agent's run, the
records of each attempt, outcomes, clean-up and take-over.
"""

__all__: list[str] = []
