"""Container images: digest pins and the pull policy, and the container registry client."""

__all__: list[str] = []
