"""The signed result: attestations, and bundle export and verification."""
