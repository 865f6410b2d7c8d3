"""The agent's only way out: the egress proxy slots and the proxy's request log."""

__all__: list[str] = []
