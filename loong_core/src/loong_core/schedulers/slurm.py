"""Slurm: an sbatch script that runs one ``loong train`` per node through ``srun``.

The first node of the allocation hosts the rendezvous. Stopping and restarting follow
``trainer.save_on_signal`` and ``trainer.resume=auto``:

* ``#SBATCH --signal=B:USR1@LEAD`` wakes the script LEAD seconds before the time limit; it sends
  SIGTERM to every node's ``loong train`` (each rank finishes its step, one checkpoint is
  written), waits for them, then requeues the job with ``scontrol requeue``.
* On preemption Slurm sends SIGTERM itself; the script waits for the checkpoint and Slurm
  requeues the job (``#SBATCH --requeue``).

The requeued job keeps its job id, hence its run directory, and resumes from the checkpoint.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass, field

from loong_core import __version__
from loong_core.errors import ConfigError, LoongError
from loong_core.schedulers.job import SchedulerJob

RESTARTS_INSTEAD = ("Slurm requeue replaces torchrun restarts: a preempted or timed-out job "
                    "writes a checkpoint on SIGTERM (trainer.save_on_signal) and is requeued")


@dataclass
class SlurmOptions:
    """The ``#SBATCH`` settings of the job beyond its nodes.

    Attributes:
        gpus_per_node: ``--gpus-per-node`` (None: not requested).
        cpus_per_task: ``--cpus-per-task``; one task per node runs all its ranks.
        time: ``--time`` limit (``HH:MM:SS``, ``D-HH:MM``...; None: the partition's).
        partition: ``--partition``.
        account: ``--account``.
        log: ``--output`` file pattern (``%x`` job name, ``%j`` job id); appended on requeue.
        save_lead: Seconds before the time limit at which the job checkpoints and requeues.
        sbatch_args: Further ``#SBATCH`` options, written as given (``--qos=high``).
        setup: Shell lines run before ``srun`` (``source venv/bin/activate``, ``module load``).
    """

    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    log: str = "slurm-%x-%j.out"
    save_lead: int = 120
    sbatch_args: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)


def sbatch_directives(job: SchedulerJob, options: SlurmOptions) -> list[str]:
    """The ``#SBATCH`` lines."""
    if options.save_lead < 1:
        raise ConfigError(f"--save-lead {options.save_lead} must be at least 1 second (the time "
                          "the ranks get to write a checkpoint before the time limit).")
    pairs = [("job-name", job.name), ("nodes", job.nnodes), ("ntasks-per-node", 1),
             ("gpus-per-node", options.gpus_per_node), ("cpus-per-task", options.cpus_per_task),
             ("time", options.time), ("partition", options.partition),
             ("account", options.account), ("output", options.log), ("open-mode", "append"),
             ("signal", f"B:USR1@{options.save_lead}")]
    lines = [f"#SBATCH --{key}={value}" for key, value in pairs if value is not None]
    lines.append("#SBATCH --requeue")
    for arg in options.sbatch_args:
        if not arg.startswith("-"):
            raise ConfigError(f"--sbatch-arg {arg!r} is not an sbatch option. "
                              "Fix: --sbatch-arg=--qos=high (with '=' and the leading dashes).")
        lines.append(f"#SBATCH {arg}")
    return lines


def sbatch_script(job: SchedulerJob, options: SlurmOptions) -> str:
    """The sbatch script: ``#SBATCH`` lines, the rendezvous on the first node, ``srun``, and the
    signal handling that checkpoints and requeues."""
    run_dir = f'"${{LOONG_RUNS:-runs}}/{job.experiment}/slurm-$SLURM_JOB_ID"'
    rdzv_id = shlex.quote(job.rdzv_id) if job.rdzv_id else '"$SLURM_JOB_ID"'
    # Expanded by each task (single quotes here), so that every node reads its own SLURM_NODEID.
    command = job.train_command(nnodes='"$SLURM_NNODES"', node_rank='"$SLURM_NODEID"',
                                endpoint='"$LOONG_RDZV_ENDPOINT"', rdzv_id=rdzv_id,
                                run_dir=run_dir)
    lead = options.save_lead
    lines = [
        "#!/bin/bash",
        f"# Written by 'loong launch slurm' (loong {__version__}): {job.nnodes} node(s) x "
        f"{job.nproc_per_node} rank(s) of experiment {job.experiment}.",
        *sbatch_directives(job, options),
        "",
        "set -eu",
        *options.setup,
        "",
        "# The first node of the allocation hosts the rendezvous of every node's torchrun.",
        'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        f'export LOONG_RDZV_ENDPOINT="$HEAD_NODE:{job.rdzv_port}"',
        "# After SIGTERM torchrun gives its ranks this long to finish the checkpoint (default 30 s).",
        f"export TORCH_ELASTIC_SHUTDOWN_TIMEOUT={lead}",
        "",
        f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c {shlex.quote(command)} &",
        "SRUN_PID=$!",
        "",
        "checkpoint_and_requeue() {",
        f"  # USR1 (#SBATCH --signal): the time limit is {lead} s away. SIGTERM makes every rank",
        "  # stop after its step and write a checkpoint (trainer.save_on_signal); the requeued job",
        "  # keeps its id and run directory and resumes from it (trainer.resume=auto).",
        "  trap '' TERM",
        '  echo "loong: time limit near: checkpointing, then requeueing job $SLURM_JOB_ID" >&2',
        '  scancel --signal=TERM "$SLURM_JOB_ID" || kill -TERM "$SRUN_PID"',
        '  wait "$SRUN_PID" || true',
        '  scontrol requeue "$SLURM_JOB_ID"',
        "  exit 0",
        "}",
        "finish_checkpoint() {",
        "  # SIGTERM: preempted or cancelled; Slurm signals the ranks too. Let them write their",
        "  # checkpoint; Slurm requeues a preempted job itself (#SBATCH --requeue).",
        "  trap '' TERM",
        "  status=0",
        '  wait "$SRUN_PID" || status=$?',
        '  exit "$status"',
        "}",
        "trap checkpoint_and_requeue USR1",
        "trap finish_checkpoint TERM",
        'wait "$SRUN_PID"',
        "",
    ]
    return "\n".join(lines)


def submit(script_path: str) -> str:
    """Submit ``script_path`` with ``sbatch``; return what sbatch printed (the job id).

    Raises:
        LoongError: sbatch is not on PATH, or it refused the script (its message included).
    """
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise LoongError(f"--submit needs 'sbatch', which is not on PATH. Run on a Slurm login "
                         f"node, or submit the written script there: sbatch {script_path}")
    done = subprocess.run([sbatch, script_path], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise LoongError(f"sbatch refused {script_path} (exit {done.returncode}): "
                         f"{(done.stderr or done.stdout).strip()}")
    return done.stdout.strip()
