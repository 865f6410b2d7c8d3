"""Every environment variable the runner reads on the host, and every one it sets in a job's
container: the declared list the documentation's reference page is generated from
(``scripts/gen_docs.py``). ``tests/unit/test_docs.py`` reads the code and fails when it reads a
variable not listed in :data:`READ` (or one listed there is no longer read), or names a
``RUNNER_*`` variable listed nowhere.

A declaration only: the code reads each variable where it is used, by its name.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["READ", "SET_IN_JOB", "EnvVar"]


@dataclass(frozen=True)
class EnvVar:
    """One variable: its name, what it means, and the default when it is unset."""

    name: str
    meaning: str
    default: str = ""


READ: tuple[EnvVar, ...] = (
    EnvVar(
        "RUNNER_CONFIG_DIR",
        "The runner's config folder (trusted keys, policy, runner key, server socket).",
        "the user's (`~/.config/runner`)",
    ),
    EnvVar(
        "RUNNER_STATE_DIR",
        "Where job folders, ledgers and caches live; `--state-dir` wins over it (either, when "
        "relative, from the working directory).",
        "the user's state folder",
    ),
    EnvVar(
        "RUNNER_TRUSTED_KEYS",
        "The folder of trusted issuer keys; `--trusted-keys` wins over it.",
        "`<config>/trusted-keys`",
    ),
    EnvVar(
        "RUNNER_POLICY",
        "The host policy file; `--policy` wins over it.",
        "`<config>/policy.json` when it exists, else the defaults",
    ),
    EnvVar(
        "RUNNER_ALLOW_UNSIGNED",
        "`1`, `true`, `yes` or `on`: run unsigned contracts (local development), as "
        "`--allow-unsigned`.",
        "off",
    ),
    EnvVar(
        "RUNNER_ALLOW_NETWORK",
        "`1`, `true`, `yes` or `on`: grant a contract's `networkAccess`, as `--allow-network`.",
        "off",
    ),
    EnvVar(
        "RUNNER_ALLOW_UNPINNED_IMAGES",
        "`1`, `true`, `yes` or `on`: accept tag-only images, as `--allow-unpinned-image`.",
        "off",
    ),
    EnvVar(
        "RUNNER_ENGINE",
        "The container engine when the policy's `engine` is `auto`: `docker`, `podman` or `auto`.",
        "`auto`",
    ),
    EnvVar(
        "RUNNER_SERVER",
        "The socket of `runner serve`; `off` keeps every command in its own process.",
        "`<config>/server.sock`",
    ),
    EnvVar(
        "RUNNER_AUTOSERVE",
        "A duration of at most 7 days (`10m`): a `runner run` or `runner verify contract` that "
        "finds no server starts `runner serve --idle-exit <duration>` in the background (its "
        "log: `<socket>.log`) and runs itself as usual; later commands use the server. `0` or "
        "`off`: none. Never under Slurm (`SLURM_JOB_ID` set).",
        "off",
    ),
    EnvVar(
        "PYTHONPATH",
        "Read by `RUNNER_AUTOSERVE` only: a server it starts gets this runner's folder, then "
        "these entries made absolute.",
        "",
    ),
    EnvVar(
        "RUNNER_LOG_LEVEL",
        "The log level (`debug`, `info`, `warning`, `error`), as `--log-level`.",
        "no log",
    ),
    EnvVar("RUNNER_LOG_FORMAT", "`text` or `json`, as `--log-format`.", "`text`"),
    EnvVar(
        "RUNNER_GPU_LOCK_DIR",
        "The folder of GPU device locks shared by every user's runner on this host.",
        "`/run/lock/runner-gpus`",
    ),
    EnvVar(
        "RUNNER_CDI_DIRS",
        "CDI spec folders, separated by `:`, lowest priority first.",
        "`/etc/cdi` and `/var/run/cdi`",
    ),
    EnvVar("DOCKER_HOST", "Where the Docker engine listens.", "`unix:///var/run/docker.sock`"),
    EnvVar("DOCKER_TLS_VERIFY", "Not empty and not `0`: speak TLS to a TCP engine.", "off"),
    EnvVar("DOCKER_CERT_PATH", "The TLS certificates of a TCP engine.", "`~/.docker`"),
    EnvVar(
        "DOCKER_CONFIG",
        "The folder of the docker config file with registry credentials, when the policy's "
        "`dockerConfig` names none.",
        "`~/.docker`",
    ),
    EnvVar("CONTAINER_HOST", "Where Podman's API listens.", "its usual socket for this user"),
    EnvVar(
        "XDG_RUNTIME_DIR",
        "Where rootless Podman's socket is looked for.",
        "`/run/user/<uid>`",
    ),
    EnvVar(
        "KUBECONFIG",
        "The cluster `runner submit --to kubernetes` talks to, without `--kubeconfig`.",
        "`~/.kube/config`",
    ),
    EnvVar(
        "SLURM_JOB_ID",
        "Set: `runner run` runs inside a Slurm allocation, checks its caps against it and "
        "records the job in each attempt (a later takeover asks Slurm about it).",
    ),
    EnvVar("SLURMD_NODENAME", "The Slurm node an attempt runs on, recorded with its job."),
    EnvVar(
        "SLURM_RESTART_COUNT",
        "How often Slurm has started the job again (a requeue), recorded with its job.",
        "0",
    ),
    EnvVar("SLURM_CPUS_ON_NODE", "The allocation's CPUs on this node (the CPU cap's bound)."),
    EnvVar("SLURM_MEM_PER_NODE", "The allocation's memory in MiB (the memory cap's bound)."),
    EnvVar(
        "SLURM_MEM_PER_CPU",
        "The allocation's memory per CPU in MiB, when `SLURM_MEM_PER_NODE` is unset.",
    ),
    EnvVar("SLURM_GPUS_ON_NODE", "The allocation's GPUs on this node (the GPU count's bound)."),
    EnvVar(
        "SLURM_JOB_GPUS",
        "Slurm's global IDs of the job's GPUs: under Slurm only these are handed out, each the "
        "GPU whose device file is `/dev/nvidia<ID>`.",
    ),
    EnvVar("SLURM_STEP_GPUS", "The same for an `srun` step; read before `SLURM_JOB_GPUS`."),
    EnvVar(
        "CUDA_VISIBLE_DEVICES",
        "Under Slurm, when it holds GPU UUIDs: the GPUs handed out (before the IDs above); "
        "indices in it are not read.",
    ),
)
"""What the runner reads on the host. (An agent adapter's secrets are read from the variables
the host policy names: their names are the operator's, not the runner's.)"""

SET_IN_JOB: tuple[EnvVar, ...] = (
    EnvVar("RUNNER_JOB_ID", "The job's id."),
    EnvVar("RUNNER_ATTEMPT", "The attempt's number (1, 2, ...)."),
    EnvVar("RUNNER_STDOUT", "Where the job's stdout is kept (`/job/output/<stdoutPath>`)."),
    EnvVar("RUNNER_STDERR", "Where the job's stderr is kept (`/job/output/<stderrPath>`)."),
    EnvVar(
        "RUNNER_BUDGET_FILE",
        "The runtime budget: used and left (`/job/execution/runtime-budget.json`).",
    ),
    EnvVar(
        "RUNNER_COMPUTE_DECISION",
        "The compute decision (`/job/input/compute-decision.json`).",
    ),
    EnvVar("RUNNER_AGENT_PROMPT", "An agent_planned job's prompt file."),
    EnvVar("HOME", "`/tmp`, the job's own tmpfs."),
    EnvVar("XDG_CACHE_HOME", "`/job/runtime-cache`, kept across attempts, in the disk quota."),
    EnvVar("PIP_CACHE_DIR", "`/job/runtime-cache/pip`."),
    EnvVar(
        "NVIDIA_VISIBLE_DEVICES",
        "The GPUs given to the job, by id, else `void`.",
    ),
    EnvVar(
        "HTTP_PROXY",
        "With an egress allowlist: the job's proxy (also `HTTPS_PROXY`, `http_proxy`, "
        "`https_proxy`; `NO_PROXY` and `no_proxy` empty).",
    ),
)
"""What the runner sets in a job's container (beside an agent adapter's own env and its
secrets, which the host policy names)."""
