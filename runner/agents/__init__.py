"""Agent runtimes as the policy sees them: the adapters (Claude Code, scripted), their default
prompt, and the transcript reader.
"""

__all__: list[str] = []
