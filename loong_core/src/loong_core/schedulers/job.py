"""What every scheduler shares: the ``loong train`` flags it owns and the command each node runs.

A scheduler starts one ``loong train`` per node (``--nproc-per-node`` ranks each, through
torchrun) with the node's rank and the first node as rendezvous, both filled in by the job file.
Restarts belong to the scheduler: a stopped job resumes from its newest checkpoint, so the job
adds ``trainer.save_on_signal=true`` (SIGTERM writes a checkpoint), ``trainer.resume=auto`` and
a run directory that stays the same across restarts, unless the user set them.
"""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass

from loong_core.cli.launch_args import dest
from loong_core.errors import ConfigError

# Flags whose value the scheduler fills in per node, and what to do instead of setting them.
SET_BY_SCHEDULER = {
    "--node-rank": "each node's rank comes from the scheduler",
    "--rdzv-endpoint": "the rendezvous is the job's first node; choose its port with --rdzv-port",
    "--master-port": "it is for single-machine runs; choose the rendezvous port with --rdzv-port",
}
# Restart keys the job adds unless the user set them; the run directory is added per scheduler.
RESUME_DEFAULTS = (("trainer.save_on_signal", "true"), ("trainer.resume", "auto"))


@dataclass
class SchedulerJob:
    """One multi-node ``loong train`` as a scheduler runs it.

    Attributes:
        scheduler: ``slurm`` or ``k8s`` (named in messages).
        name: Job name.
        experiment: The composed config's ``name`` (the run directory's parent).
        nnodes: Nodes.
        nproc_per_node: Ranks per node.
        rdzv_port: Port of the rendezvous on the first node.
        rdzv_id: ``--rdzv-id`` when the user gave one; None: the scheduler's job id.
        overrides: The user's Hydra overrides, as typed.
    """

    scheduler: str
    name: str
    experiment: str
    nnodes: int
    nproc_per_node: int
    rdzv_port: int
    rdzv_id: str | None
    overrides: list[str]

    @property
    def world_size(self) -> int:
        """Ranks in total."""
        return self.nnodes * self.nproc_per_node

    def shell_overrides(self, run_dir: str) -> list[str]:
        """The overrides as shell words: the user's (quoted), then each restart default the user
        did not set; ``run_dir`` is a shell word and may expand variables of the node."""
        given = {override_key(o) for o in self.overrides}
        words = [shlex.quote(o) for o in self.overrides]
        for key, value in (*RESUME_DEFAULTS, ("trainer.run_dir", run_dir)):
            if key not in given:
                words.append(f"{key}={value}")
        return words

    def train_command(self, *, nnodes: str, node_rank: str, endpoint: str, rdzv_id: str,
                      run_dir: str) -> str:
        """The shell command one node runs. Every argument is a shell word (quoted as needed)."""
        words = ["exec", "loong", "train", "--nnodes", nnodes, "--node-rank", node_rank,
                 "--nproc-per-node", str(self.nproc_per_node), "--rdzv-endpoint", endpoint,
                 "--rdzv-id", rdzv_id, *self.shell_overrides(run_dir)]
        return " ".join(words)


def override_key(override: str) -> str:
    """``trainer.resume`` of ``trainer.resume=auto`` (also ``+key=``, ``++key=``, ``~key``)."""
    return override.lstrip("+~").split("=", 1)[0]


def check_launch_flags(args: argparse.Namespace, scheduler: str, restarts_instead: str) -> int:
    """Refuse the ``loong train`` flags a scheduler job sets itself; return the node count.

    Args:
        args: Parsed ``loong launch`` arguments (with the ``loong train`` launch flags).
        scheduler: ``slurm`` or ``k8s``.
        restarts_instead: How this scheduler restarts a failed job (for ``--max-restarts``).

    Raises:
        ConfigError: Naming the flag, why the job sets it, and what to do.
    """
    if args.max_restarts:
        raise ConfigError(
            f"--max-restarts {args.max_restarts} is refused by 'loong launch {scheduler}': "
            f"{restarts_instead}, and the job resumes from its newest checkpoint "
            "(trainer.resume=auto). torchrun restarts cannot re-form the process groups across "
            "machines. Fix: drop --max-restarts.")
    for flag, why in SET_BY_SCHEDULER.items():
        value = getattr(args, dest(flag))
        if value not in (None, 0):
            raise ConfigError(f"{flag} {value} is refused by 'loong launch {scheduler}': {why}. "
                              f"Fix: drop {flag}.")
    nnodes = str(args.nnodes)
    if ":" in nnodes:
        raise ConfigError(
            f"--nnodes {nnodes} (elastic MIN:MAX) is refused by 'loong launch {scheduler}': the "
            "scheduler starts a fixed number of nodes. Fix: --nnodes N.")
    if not nnodes.isdigit() or int(nnodes) < 1:
        raise ConfigError(f"--nnodes {nnodes} is not a positive whole number. Fix: --nnodes 2.")
    if args.nproc_per_node < 1:
        raise ConfigError(f"--nproc-per-node {args.nproc_per_node} must be at least 1 "
                          "(usually the accelerators of one node).")
    if not 1 <= args.rdzv_port <= 65535:
        raise ConfigError(f"--rdzv-port {args.rdzv_port} is not a TCP port (1-65535).")
    return int(nnodes)


def scheduler_job(args: argparse.Namespace, overrides: list[str], scheduler: str,
                  restarts_instead: str) -> SchedulerJob:
    """Check the flags and the config (composed, validated, layout fitted to all nodes' ranks).

    Args:
        args: Parsed ``loong launch`` arguments.
        overrides: Hydra overrides.
        scheduler: ``slurm`` or ``k8s``.
        restarts_instead: How this scheduler restarts a failed job (for ``--max-restarts``).
    """
    from loong_core.config.compose import load_config
    from loong_core.runtime import check_layout

    nnodes = check_launch_flags(args, scheduler, restarts_instead)
    cfg = load_config(overrides)  # a bad override fails here, not after hours in the queue
    check_layout(cfg, nnodes * args.nproc_per_node)
    name = args.job_name or default_job_name(cfg.name)
    return SchedulerJob(scheduler=scheduler, name=name, experiment=cfg.name, nnodes=nnodes,
                        nproc_per_node=args.nproc_per_node, rdzv_port=args.rdzv_port,
                        rdzv_id=None if args.rdzv_id == "loong" else args.rdzv_id,
                        overrides=list(overrides))


def default_job_name(experiment: str) -> str:
    """``loong-<experiment>`` as a valid Kubernetes name (see :func:`dns_label`)."""
    return dns_label(f"loong-{experiment}")


def dns_label(text: str) -> str:
    """``text`` in lower case with ``-`` for anything else, starting with a letter, at most 40
    characters (room for the pod-name suffixes Kubernetes adds)."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:40].rstrip("-")
    return label if label[:1].isalpha() else f"job-{label}"[:40].rstrip("-")
