"""``loong launch slurm|k8s [overrides] --nnodes N --nproc-per-node P ...``: job files for
cluster schedulers that run the same ``loong train`` on every node."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from loong_core.cli.launch_args import add_launch_arguments


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("overrides", nargs="*", help="Hydra overrides, as for loong train")
    add_launch_arguments(p)
    p.add_argument("--job-name", default=None, help="job name (default: loong-<experiment>)")
    p.add_argument("--rdzv-port", type=int, default=29400,
                   help="port of the rendezvous on the first node (default 29400)")
    p.add_argument("-o", "--output", default=None, help="write the job file here (default: stdout)")


def add_slurm_parser(subparsers) -> None:
    """Add ``loong launch slurm``."""
    p = subparsers.add_parser(
        "slurm", help="write (or --submit) an sbatch script: srun runs loong train on every node",
        description="Write an sbatch script that runs the same 'loong train' on every node with "
                    "srun, the first node as rendezvous. Near the time limit (--save-lead) or "
                    "on preemption the ranks write a checkpoint (trainer.save_on_signal) and "
                    "the requeued job resumes (trainer.resume=auto). --nnodes, --node-rank and "
                    "--rdzv-endpoint of loong train are set per node by the script.")
    _common(p)
    p.add_argument("--gpus-per-node", type=int, default=None, help="#SBATCH --gpus-per-node")
    p.add_argument("--cpus-per-task", type=int, default=None,
                   help="#SBATCH --cpus-per-task (one task per node runs all its ranks)")
    p.add_argument("--time", default=None, help="#SBATCH --time (HH:MM:SS, D-HH:MM, ...)")
    p.add_argument("--partition", default=None, help="#SBATCH --partition")
    p.add_argument("--account", default=None, help="#SBATCH --account")
    p.add_argument("--log", default="slurm-%x-%j.out", help="#SBATCH --output (default %(default)s)")
    p.add_argument("--save-lead", type=int, default=120,
                   help="seconds before the time limit to checkpoint and requeue (default 120)")
    p.add_argument("--sbatch-arg", action="append", default=[], metavar="OPTION",
                   help="another #SBATCH option, e.g. --sbatch-arg=--qos=high (repeatable)")
    p.add_argument("--setup", action="append", default=[], metavar="LINE",
                   help="shell line run before srun, e.g. 'source venv/bin/activate' (repeatable)")
    p.add_argument("--submit", action="store_true",
                   help="submit with sbatch (the script is kept: -o, else ./<job-name>.sbatch)")
    p.set_defaults(func=run_slurm, accepts_overrides=True)


def add_k8s_parser(subparsers) -> None:
    """Add ``loong launch k8s``."""
    p = subparsers.add_parser(
        "k8s", help="write a Kubernetes PyTorchJob (Kubeflow) or JobSet manifest",
        description="Write a manifest whose pods each run 'loong train' as one node: a "
                    "PyTorchJob for the Kubeflow training operator or a JobSet. Apply it with "
                    "kubectl apply -f FILE.")
    _common(p)
    p.add_argument("--kind", choices=("pytorchjob", "jobset"), default="pytorchjob",
                   help="PyTorchJob (kubeflow.org/v1) or JobSet (jobset.x-k8s.io/v1alpha2)")
    p.add_argument("--image", required=True, help="container image with loong installed")
    p.add_argument("--namespace", default=None, help="metadata.namespace")
    p.add_argument("--gpus-per-node", type=int, default=None, help="nvidia.com/gpu per pod")
    p.add_argument("--cpus", default=None, help="CPU request per pod, e.g. 32")
    p.add_argument("--memory", default=None, help="memory request per pod, e.g. 256Gi")
    p.add_argument("--restarts", type=int, default=0,
                   help="restarts of the whole job after a failure, resuming (default 0)")
    p.add_argument("--grace", type=int, default=120,
                   help="seconds to write the checkpoint after SIGTERM (default 120)")
    p.add_argument("--pvc", default=None, metavar="CLAIM:PATH",
                   help="PersistentVolumeClaim mounted at PATH on every pod; runs go under it")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="container environment variable (repeatable)")
    p.set_defaults(func=run_k8s, accepts_overrides=True)


def _write(text: str, output: str | None) -> None:
    if output is None:
        sys.stdout.write(text)
        return
    Path(output).write_text(text)
    print(f"wrote {output}", file=sys.stderr)


def run_slurm(args, extra) -> int:
    """Write the sbatch script; with ``--submit`` submit it."""
    from loong_core.schedulers import slurm
    from loong_core.schedulers.job import scheduler_job

    job = scheduler_job(args, list(args.overrides) + list(extra), "slurm", slurm.RESTARTS_INSTEAD)
    options = slurm.SlurmOptions(
        gpus_per_node=args.gpus_per_node, cpus_per_task=args.cpus_per_task, time=args.time,
        partition=args.partition, account=args.account, log=args.log, save_lead=args.save_lead,
        sbatch_args=args.sbatch_arg, setup=args.setup)
    script = slurm.sbatch_script(job, options)
    output = args.output or (f"{job.name}.sbatch" if args.submit else None)
    _write(script, output)
    if args.submit:
        print(slurm.submit(output))
    return 0


def run_k8s(args, extra) -> int:
    """Write the PyTorchJob or JobSet manifest."""
    from loong_core.schedulers import k8s
    from loong_core.schedulers.job import scheduler_job

    job = scheduler_job(args, list(args.overrides) + list(extra), "k8s", k8s.RESTARTS_INSTEAD)
    options = k8s.K8sOptions(
        kind=args.kind, image=args.image, namespace=args.namespace, gpus_per_node=args.gpus_per_node,
        cpus=args.cpus, memory=args.memory, restarts=args.restarts, grace=args.grace, pvc=args.pvc,
        env=args.env)
    _write(k8s.to_yaml(k8s.manifest(job, options)), args.output)
    return 0
