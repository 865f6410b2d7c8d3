"""The job folder (JobDir, StateDir, atomic writes) and staging the contract's inputs into it,
bound to their digests.
"""

__all__: list[str] = []
