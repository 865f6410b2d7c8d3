"""Signing and verifying: DSSE envelopes, Ed25519 keys, trusted key sets."""

__all__: list[str] = []
