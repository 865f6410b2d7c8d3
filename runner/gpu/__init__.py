"""GPUs: what the host has (detection) and how it is handed to a container (CDI specs)."""

__all__: list[str] = []
