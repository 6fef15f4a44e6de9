"""Start training ranks: in this process for one rank, through torchrun for more."""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass


@dataclass
class LaunchOptions:
    """torchrun options ``loong train`` passes through.

    Attributes:
        nproc_per_node: Ranks on this machine.
        nnodes: Machines (``N`` or ``MIN:MAX`` for elastic runs).
        node_rank: This machine's index (static rendezvous).
        rdzv_endpoint: ``host:port`` of the rendezvous (multi-node).
        rdzv_backend: torchrun rendezvous backend.
        rdzv_id: Job id shared by all nodes.
        max_restarts: Restarts of the worker group after a failure (elastic).
        master_port: Port for single-node runs (None: a free one).
    """

    nproc_per_node: int = 1
    nnodes: str = "1"
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_backend: str = "c10d"
    rdzv_id: str = "loong"
    max_restarts: int = 0
    master_port: int | None = None

    @property
    def single_process(self) -> bool:
        """One rank in total: run in this process."""
        return self.nproc_per_node == 1 and self.nnodes in ("1", "1:1")


def free_port() -> int:
    """A TCP port that is free on the loopback interface now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_args(options: LaunchOptions, overrides: list[str]) -> list[str]:
    """Command-line arguments for ``torch.distributed.run`` that start the loong worker."""
    args = [f"--nproc-per-node={options.nproc_per_node}", f"--nnodes={options.nnodes}",
            f"--max-restarts={options.max_restarts}"]
    if options.rdzv_endpoint:
        args += [f"--rdzv-backend={options.rdzv_backend}", f"--rdzv-endpoint={options.rdzv_endpoint}",
                 f"--rdzv-id={options.rdzv_id}", f"--node-rank={options.node_rank}"]
    else:
        port = options.master_port or free_port()
        args += ["--master-addr=127.0.0.1", f"--master-port={port}", f"--node-rank={options.node_rank}"]
    return args + ["-m", "loong_core.worker", *overrides]


def launch(options: LaunchOptions, overrides: list[str]) -> dict | None:
    """Train with ``overrides``; returns the metrics when run in-process."""
    if options.single_process:
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_WORLD_SIZE", "1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(options.master_port or free_port()))
        from loong_core.runtime import train_or_explain

        return train_or_explain(overrides)
    from torch.distributed import run as torchrun

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.stdout.flush()
    torchrun.main(torchrun_args(options, overrides))
    return None
