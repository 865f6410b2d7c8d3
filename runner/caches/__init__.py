"""The asset and input caches, and downloading an asset's bytes into them."""

__all__: list[str] = []
