"""Kubernetes: a PyTorchJob (Kubeflow training operator) or a JobSet running ``loong train``.

Each pod is one node: one container that runs ``loong train --nnodes N --node-rank R
--nproc-per-node P --rdzv-endpoint HEAD:PORT``.

* **PyTorchJob** (``kubeflow.org/v1``): one ``Master`` and ``N-1`` ``Worker`` replicas, each with
  a container named ``pytorch`` and the port ``pytorchjob-port``. The operator sets
  ``MASTER_ADDR``/``MASTER_PORT`` (the master's service) and ``RANK`` (0 for the master,
  1..N-1 for the workers): the node's rank and the rendezvous.
* **JobSet** (``jobset.x-k8s.io/v1alpha2``): one replicated job of ``N`` indexed pods; the node
  rank is ``JOB_COMPLETION_INDEX`` and the rendezvous is pod 0's DNS name
  ``<name>-node-0-0.<name>``. ``failurePolicy.maxRestarts`` recreates every pod after a failure.

Pod deletion (preemption, eviction) sends SIGTERM: with ``trainer.save_on_signal`` the ranks
write a checkpoint within ``terminationGracePeriodSeconds``, and a restarted job resumes from it
(``trainer.resume=auto``) in the same run directory, which must be on shared storage
(``--pvc``) for that.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from loong_core.errors import ConfigError
from loong_core.schedulers.job import SchedulerJob, dns_label

RESTARTS_INSTEAD = ("Kubernetes restarts the job instead (--restarts N: the JobSet's "
                    "failurePolicy.maxRestarts or the PyTorchJob's backoffLimit)")
KINDS = ("pytorchjob", "jobset")
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
JOBSET_REPLICATED_JOB = "node"


@dataclass
class K8sOptions:
    """The pod settings of the manifest.

    Attributes:
        kind: ``pytorchjob`` or ``jobset``.
        image: Container image with loong installed (``loong`` on its PATH).
        namespace: ``metadata.namespace`` (None: kubectl's current one).
        gpus_per_node: ``nvidia.com/gpu`` limit per pod (None: not requested).
        cpus: CPU request per pod (``"32"``, ``"500m"``).
        memory: Memory request per pod (``"256Gi"``).
        restarts: Whole-job restarts after a failure (0: none; pods never restart alone).
        grace: ``terminationGracePeriodSeconds``: time to write the checkpoint after SIGTERM.
        pvc: ``CLAIM:PATH``: a PersistentVolumeClaim mounted at PATH on every pod; the run
            directory goes under it. Without it the run directory is in the container.
        env: ``NAME=VALUE`` environment variables of the container.
    """

    kind: str = "pytorchjob"
    image: str = ""
    namespace: str | None = None
    gpus_per_node: int | None = None
    cpus: str | None = None
    memory: str | None = None
    restarts: int = 0
    grace: int = 120
    pvc: str | None = None
    env: list[str] = field(default_factory=list)


def manifest(job: SchedulerJob, options: K8sOptions) -> dict:
    """The PyTorchJob or JobSet (``options.kind``) as a dict ready for YAML."""
    if options.kind not in KINDS:
        raise ConfigError(f"--kind {options.kind!r} is not one of {', '.join(KINDS)}.")
    if not options.image:
        raise ConfigError("--image is required: the container image with loong installed.")
    if options.restarts < 0 or options.grace < 1:
        raise ConfigError("--restarts must be 0 or more and --grace at least 1 second.")
    check_name(job, options.kind)
    return (_pytorchjob if options.kind == "pytorchjob" else _jobset)(job, options)


def check_name(job: SchedulerJob, kind: str) -> None:
    """The job name must make valid pod names (DNS-1035 labels of at most 63 characters).

    Raises:
        ConfigError: Naming ``--job-name``, the rule and the longest name it would give.
    """
    if kind == "jobset":  # JobSet validates the longest pod name plus a 5-character suffix
        longest = f"{job.name}-{JOBSET_REPLICATED_JOB}-0-{job.nnodes - 1}-abcde"
    else:
        longest = f"{job.name}-worker-{max(job.nnodes - 2, 0)}"
    if not DNS_1035.fullmatch(job.name):
        raise ConfigError(
            f"--job-name {job.name!r} cannot name a {kind}: use lower-case letters, digits and "
            f"'-', starting with a letter. Fix: --job-name {dns_label(job.name)}")
    if len(longest) > 63:
        raise ConfigError(
            f"--job-name {job.name!r} is too long for a {kind} of {job.nnodes} node(s): its longest "
            f"pod name {longest!r} has {len(longest)} characters, Kubernetes allows 63. "
            "Fix: a shorter --job-name.")


def _run_dir(job: SchedulerJob, options: K8sOptions) -> str:
    """The run directory as a shell word: the same for every restart of the job."""
    root = f"{_pvc(options)[1].rstrip('/')}/runs" if options.pvc else "runs"
    return shlex.quote(f"{root}/{job.experiment}/{job.name}")


def _pvc(options: K8sOptions) -> tuple[str, str]:
    claim, _, path = (options.pvc or "").partition(":")
    if not claim or not path.startswith("/"):
        raise ConfigError(f"--pvc {options.pvc!r} is not CLAIM:/absolute/path. "
                          "Fix: --pvc shared-runs:/mnt/runs")
    return claim, path


def _container(job: SchedulerJob, options: K8sOptions, name: str, command: str, port: dict) -> dict:
    env = [{"name": "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "value": str(options.grace)}]
    for item in options.env:
        key, sep, value = item.partition("=")
        if not sep or not ENV_NAME.fullmatch(key):
            raise ConfigError(f"--env {item!r} is not NAME=VALUE. Fix: --env NCCL_DEBUG=WARN")
        env.append({"name": key, "value": value})
    container = {"name": name, "image": options.image, "command": ["/bin/sh", "-c", command],
                 "ports": [dict(port)], "env": env,
                 "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}
    requests = {k: v for k, v in (("cpu", options.cpus), ("memory", options.memory)) if v}
    limits = {"nvidia.com/gpu": options.gpus_per_node} if options.gpus_per_node else {}
    if requests or limits:
        container["resources"] = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    if options.pvc:
        container["volumeMounts"].append({"name": "runs", "mountPath": _pvc(options)[1]})
    return container


def _pod_spec(options: K8sOptions, container: dict, restart_policy: str) -> dict:
    # data-loader workers share tensors through /dev/shm, which is 64 MiB in a container
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    if options.pvc:
        volumes.append({"name": "runs", "persistentVolumeClaim": {"claimName": _pvc(options)[0]}})
    return {"restartPolicy": restart_policy, "terminationGracePeriodSeconds": options.grace,
            "containers": [container], "volumes": volumes}


def _metadata(job: SchedulerJob, options: K8sOptions) -> dict:
    meta = {"name": job.name, "labels": {"app.kubernetes.io/created-by": "loong"}}
    if options.namespace:
        meta["namespace"] = options.namespace
    return meta


def _pytorchjob(job: SchedulerJob, options: K8sOptions) -> dict:
    command = job.train_command(nnodes=str(job.nnodes), node_rank='"$RANK"',
                                endpoint='"$MASTER_ADDR:$MASTER_PORT"',
                                rdzv_id=shlex.quote(job.rdzv_id or job.name), run_dir=_run_dir(job, options))
    port = {"name": "pytorchjob-port", "containerPort": job.rdzv_port}
    # A failed pod restarts only when restarts are allowed; then all of them fail and restart.
    policy = "OnFailure" if options.restarts else "Never"
    replicas = {"Master": 1, "Worker": job.nnodes - 1}
    specs = {
        role: {"replicas": count, "restartPolicy": policy,
               "template": {"spec": _pod_spec(options, _container(job, options, "pytorch", command, port),
                                              policy)}}
        for role, count in replicas.items() if count
    }
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": _metadata(job, options),
            "spec": {"nprocPerNode": str(job.nproc_per_node),
                     "runPolicy": {"backoffLimit": options.restarts},
                     "pytorchReplicaSpecs": specs}}


def _jobset(job: SchedulerJob, options: K8sOptions) -> dict:
    head = f"{job.name}-{JOBSET_REPLICATED_JOB}-0-0.{job.name}"  # pod 0's hostname.subdomain
    command = job.train_command(nnodes=str(job.nnodes), node_rank='"$JOB_COMPLETION_INDEX"',
                                endpoint=f"{head}:{job.rdzv_port}", rdzv_id=shlex.quote(job.rdzv_id or job.name),
                                run_dir=_run_dir(job, options))
    port = {"name": "rendezvous", "containerPort": job.rdzv_port}
    pod = _pod_spec(options, _container(job, options, "loong", command, port), "Never")
    nodes = {"parallelism": job.nnodes, "completions": job.nnodes, "completionMode": "Indexed",
             "backoffLimit": 0, "template": {"spec": pod}}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": _metadata(job, options),
            "spec": {"failurePolicy": {"maxRestarts": options.restarts},
                     "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                     "replicatedJobs": [{"name": JOBSET_REPLICATED_JOB, "replicas": 1,
                                         "template": {"spec": nodes}}]}}


def to_yaml(document: dict) -> str:
    """``document`` as YAML, keys in the order written."""
    import yaml

    return yaml.safe_dump(document, sort_keys=False, width=10_000)
