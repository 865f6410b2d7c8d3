"""Host policy: what this host grants, whatever a contract asks.

This first version holds the two switches the runner needs today; the full policy file (maxima,
registries, signatures) builds on the same object.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from runner.contract import VerifiedContract
from runner.errors import PolicyViolation


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class HostPolicy:
    """What the host allows. Defaults are the safe ones."""

    allow_network: bool = False
    """Grant network to contracts that ask for it (``environment.networkAccess``)."""
    allow_unpinned_images: bool = False
    """Accept a tag (``name:tag``) where a digest or image id pin is expected."""

    @classmethod
    def from_environment(cls) -> HostPolicy:
        """Defaults, loosened by ``RUNNER_ALLOW_NETWORK`` / ``RUNNER_ALLOW_UNPINNED_IMAGES``."""
        return cls(
            allow_network=_env_flag("RUNNER_ALLOW_NETWORK"),
            allow_unpinned_images=_env_flag("RUNNER_ALLOW_UNPINNED_IMAGES"),
        )


def check(contract: VerifiedContract, policy: HostPolicy) -> None:
    """Refuse what the contract asks and the host does not grant."""
    env = contract.model.environment
    if env.networkAccess and not policy.allow_network:
        raise PolicyViolation(
            "$.environment.networkAccess: the contract asks for network access (true) and this "
            "host grants none",
            hint="issue the contract with networkAccess false, or run on a host started with "
            "--allow-network / RUNNER_ALLOW_NETWORK=1",
        )
