"""The torchrun options of ``loong train``, shared with ``loong launch slurm|k8s``.

``loong train`` takes them from the user; the scheduler commands take the same flags (so a
command line moves between them unchanged) and fill in the per-node ones themselves.
"""

from __future__ import annotations

import argparse

# flag: (type, default, help). The scheduler commands refuse a changed default for the flags the
# scheduler sets per node (see :func:`loong_core.schedulers.job.check_launch_flags`).
OPTIONS = {
    "--nproc-per-node": (int, 1, "ranks on this machine"),
    "--nnodes": (str, "1", "machines, N or MIN:MAX (elastic)"),
    "--node-rank": (int, 0, "this machine's rank"),
    "--rdzv-endpoint": (str, None, "host:port of the rendezvous"),
    "--rdzv-id": (str, "loong", "job id shared by all nodes"),
    "--max-restarts": (int, 0, "worker-group restarts (elastic)"),
    "--master-port": (int, None, "port for single-node runs"),
}


def dest(flag: str) -> str:
    """The attribute of the parsed arguments that holds ``flag`` (``--node-rank`` -> ``node_rank``)."""
    return flag.lstrip("-").replace("-", "_")


def add_launch_arguments(p: argparse.ArgumentParser) -> None:
    """Add the torchrun options of :data:`OPTIONS` to ``p``."""
    for flag, (kind, default, text) in OPTIONS.items():
        p.add_argument(flag, type=kind, default=default, help=text)


def launch_options(args: argparse.Namespace):
    """The :class:`~loong_core.launch.LaunchOptions` that ``args`` (parsed with
    :func:`add_launch_arguments`) ask for."""
    from loong_core.launch import LaunchOptions

    return LaunchOptions(**{dest(flag): getattr(args, dest(flag)) for flag in OPTIONS})
