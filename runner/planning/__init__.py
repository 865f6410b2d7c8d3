"""From a verified contract and the host's policy to an execution plan: the policy, and the plan it
yields.
"""

__all__: list[str] = []
