"""Start training ranks: in this process for one rank, through torchrun for more.

``--max-restarts N`` is loong's own loop on one machine: torch's elastic restart does not work
with gloo (restarted workers connect to the previous attempt's port, or wait in
``init_process_group`` for its timeout), so each attempt is a fresh torchrun job on a fresh port,
pinned to the first attempt's run directory and resuming from its newest intact checkpoint.
With several machines the flag is refused (see :func:`check_restarts`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
from dataclasses import dataclass

from loong_core.errors import ConfigError, TrainingError

logger = logging.getLogger(__name__)


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
        # every node must join within $LOONG_INIT_TIMEOUT seconds (torch's default: 10 minutes)
        join = int(float(os.environ.get("LOONG_INIT_TIMEOUT", "300")))
        conf = f"join_timeout={join}"
        # elastic MIN:MAX: once MIN nodes are there, wait this long for more (torch's default: 30 s)
        if os.environ.get("LOONG_RDZV_LAST_CALL"):
            conf += f",last_call_timeout={int(float(os.environ['LOONG_RDZV_LAST_CALL']))}"
        args += [f"--rdzv-backend={options.rdzv_backend}", f"--rdzv-endpoint={options.rdzv_endpoint}",
                 f"--rdzv-id={options.rdzv_id}", f"--node-rank={options.node_rank}",
                 f"--rdzv-conf={conf}"]
    else:
        port = options.master_port or free_port()
        args += ["--master-addr=127.0.0.1", f"--master-port={port}", f"--node-rank={options.node_rank}"]
    return args + ["-m", "loong_core.worker", *overrides]


def check_restarts(options: LaunchOptions) -> None:
    """Refuse ``--max-restarts`` where loong cannot restart correctly (several machines).

    Raises:
        ConfigError: Naming why and what to do instead.
    """
    if options.max_restarts and (options.rdzv_endpoint or options.nnodes not in ("1", "1:1")):
        raise ConfigError(
            "--max-restarts works on one machine only: torch's elastic restart cannot re-form the "
            "process groups on gloo (restarted workers connect to the previous attempt's port or "
            "wait for the 30-minute timeout), and loong restarts a job by starting it again on a "
            "fresh port, which all machines would have to agree on. Let the cluster scheduler "
            "restart the job with trainer.resume=auto (it continues from the newest intact "
            "checkpoint), or drop --max-restarts.")


def _with_override(overrides: list[str], key: str, value: str) -> list[str]:
    kept = [o for o in overrides if o.lstrip("+").split("=", 1)[0] != key]
    return [*kept, f"{key}={value}"]


def _run_torchrun(options: LaunchOptions, overrides: list[str]) -> None:
    from torch.distributed import run as torchrun

    try:
        torchrun.main(torchrun_args(options, overrides))
    except Exception as exc:
        from torch.distributed.elastic.rendezvous.api import RendezvousError

        if isinstance(exc, RendezvousError) or type(exc).__name__ in ("DistNetworkError", "DistStoreError"):
            where = options.rdzv_endpoint or "this machine"
            if _lost_after_joining(exc):
                raise TrainingError(
                    f"lost the rendezvous at {where} during the run: the node that hosts it (the "
                    "first 'loong train' started at that endpoint) died, was killed, or the network "
                    f"to it failed; this node (--node-rank {options.node_rank}, "
                    f"{socket.gethostname()}) stops too. Relaunch every node with "
                    "trainer.resume=auto to continue from the newest complete checkpoint.") from None
            raise TrainingError(
                f"could not join the rendezvous at {where} ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}). Check that node 0 is "
                "started with the same --rdzv-endpoint and --rdzv-id, that the address is "
                "reachable from this machine (firewall, port), and that --nnodes matches.") from None
        raise


def _lost_after_joining(exc: BaseException) -> bool:
    """Whether torchrun's agent raised ``exc`` while monitoring running workers (the rendezvous
    was reached, then lost), not while joining it."""
    import traceback

    frames = {frame.name for frame in traceback.extract_tb(exc.__traceback__)}
    return "_invoke_run" in frames and "_initialize_workers" not in frames


def _launch_with_restarts(options: LaunchOptions, overrides: list[str], cfg) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from loong_core.checkpoint import store
    from loong_core.runtime import pick_run_dir

    run_dir = pick_run_dir(cfg if cfg is not None else _load(overrides))
    overrides = _with_override(overrides, "trainer.run_dir", str(run_dir))
    single = dataclasses.replace(options, max_restarts=0)
    for attempt in range(options.max_restarts + 1):
        if attempt:
            single = dataclasses.replace(single, master_port=None)  # a fresh port: no stale peers
            if store.find_latest(run_dir / "checkpoints") is not None:  # else as first asked
                overrides = _with_override(overrides, "trainer.resume", "auto")
        try:
            _run_torchrun(single, overrides)
            return
        except ChildFailedError as exc:
            if attempt == options.max_restarts:
                raise
            failed = ", ".join(f"rank {r}" for r in sorted(exc.failures)) or "a rank"
            logger.warning("%s failed; restart %d of %d from the newest intact checkpoint in %s",
                           failed, attempt + 1, options.max_restarts, run_dir)


def _load(overrides: list[str]):
    from loong_core.config.compose import load_config

    return load_config(overrides)


def launch(options: LaunchOptions, overrides: list[str], cfg=None) -> dict | None:
    """Train with ``overrides``; returns the metrics when run in-process.

    Args:
        options: Launcher options.
        overrides: Hydra overrides.
        cfg: The composed config when the caller has it (``--max-restarts`` needs it).
    """
    check_restarts(options)
    if options.single_process and not options.max_restarts:
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_WORLD_SIZE", "1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(options.master_port or free_port()))
        from loong_core.runtime import train_or_explain

        return train_or_explain(overrides)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.stdout.flush()
    if options.max_restarts:
        _launch_with_restarts(options, overrides, cfg)
    else:
        _run_torchrun(options, overrides)
    return None
