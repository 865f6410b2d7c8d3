"""Kubernetes: the plan as a Job and its NetworkPolicy, with the rules they keep (``render``,
pure), a contract checked and planned as `runner run` does and rendered (``plan``), and the
manifests applied with the official client, the Job's end read back (``apply``).
"""

__all__: list[str] = []
