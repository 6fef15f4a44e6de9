"""``loong launch k8s``: PyTorchJob and JobSet manifests whose pods each run one node.

No cluster here: the manifests are checked against the rules their controllers document and
enforce (the training operator's PyTorchJob validation, the JobSet webhook, Kubernetes' name and
pod rules), and each pod's command is run under ``sh`` with the variables the controller gives
that pod, a fake ``loong`` recording what it was asked to run.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from loong_core.cli.main import build_parser
from loong_core.cli.main import main as loong_main

TOY = ["experiment=toy", "trainer.micro_batch_size=1", "trainer.global_batch_size=24"]
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # names of jobs, services, JobSets
DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # container and volume names
PORT_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")  # IANA_SVC_NAME, at most 15
ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
FAKE_LOONG = '#!/bin/sh\nprintf "%s\\n" "$@" > "$OUT/argv.$NODE"\n'


def launch_k8s(capsys, *argv: str) -> dict:
    assert loong_main(["launch", "k8s", *TOY, "--image", "registry.example/loong:1", *argv]) == 0
    return yaml.safe_load(capsys.readouterr().out)


def label(name: str, pattern: re.Pattern = DNS_1035, limit: int = 63) -> bool:
    return bool(pattern.fullmatch(name)) and len(name) <= limit


def assert_valid_pod(pod: dict, restart_policies: tuple[str, ...]) -> dict:
    """The Kubernetes pod rules this manifest can break; returns the single container."""
    assert pod["restartPolicy"] in restart_policies
    assert isinstance(pod["terminationGracePeriodSeconds"], int)
    volumes = {v["name"] for v in pod.get("volumes", [])}
    assert all(label(v, DNS_1123) for v in volumes)
    (container,) = pod["containers"]
    assert label(container["name"], DNS_1123) and container["image"]
    assert container["command"][:2] == ["/bin/sh", "-c"] and len(container["command"]) == 3
    assert all(label(p["name"], PORT_NAME, 15) and 0 < p["containerPort"] < 65536
               for p in container["ports"])
    assert all(ENV_NAME.fullmatch(e["name"]) and isinstance(e["value"], str) for e in container["env"])
    assert {m["name"] for m in container.get("volumeMounts", [])} <= volumes
    return container


def assert_valid_pytorchjob(doc: dict) -> None:
    """The training operator's rules for a kubeflow.org/v1 PyTorchJob (its validation and the
    fields it reads): replica types Master/Worker, one master, a container named ``pytorch`` with
    an image in every replica, the master's port named ``pytorchjob-port``, nprocPerNode a string."""
    assert (doc["apiVersion"], doc["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert label(doc["metadata"]["name"])
    spec = doc["spec"]
    assert set(spec) <= {"runPolicy", "elasticPolicy", "pytorchReplicaSpecs", "nprocPerNode"}
    assert isinstance(spec["nprocPerNode"], str) and "elasticPolicy" not in spec
    assert isinstance(spec["runPolicy"]["backoffLimit"], int) and spec["runPolicy"]["backoffLimit"] >= 0
    replicas = spec["pytorchReplicaSpecs"]
    assert set(replicas) <= {"Master", "Worker"} and replicas["Master"]["replicas"] == 1
    for replica in replicas.values():
        assert replica["replicas"] >= 1
        assert replica["restartPolicy"] in ("Always", "OnFailure", "Never", "ExitCode")
        container = assert_valid_pod(replica["template"]["spec"], ("Always", "OnFailure", "Never"))
        assert container["name"] == "pytorch"
    master = replicas["Master"]["template"]["spec"]["containers"][0]
    assert [p["name"] for p in master["ports"]] == ["pytorchjob-port"]


def assert_valid_jobset(doc: dict) -> None:
    """The JobSet webhook's rules for jobset.x-k8s.io/v1alpha2 and the Job rules under it:
    job and pod names (with the 5-character pod suffix) are DNS-1035 labels of at most 63
    characters, Indexed completion for stable hostnames, pod restartPolicy Never or OnFailure."""
    assert (doc["apiVersion"], doc["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    name, spec = doc["metadata"]["name"], doc["spec"]
    assert label(name) and spec["network"]["enableDNSHostnames"] is True
    assert spec["failurePolicy"]["maxRestarts"] >= 0
    for rjob in spec["replicatedJobs"]:
        job = rjob["template"]["spec"]
        assert label(f"{name}-{rjob['name']}-{rjob['replicas'] - 1}")
        assert label(f"{name}-{rjob['name']}-{rjob['replicas'] - 1}-{job['completions'] - 1}-abcde")
        assert job["completionMode"] == "Indexed" and job["parallelism"] == job["completions"]
        assert job["backoffLimit"] == 0
        assert_valid_pod(job["template"]["spec"], ("OnFailure", "Never"))


def run_pods(tmp_path: Path, pods: list[tuple[dict, dict]]) -> list:
    """Run each ``(container, env)`` command with a fake loong; the parsed ``loong train`` args."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "loong").write_text(FAKE_LOONG)
    (bin_dir / "loong").chmod(0o755)
    base = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "OUT": str(tmp_path)}
    for node, (container, env) in enumerate(pods):
        subprocess.run(container["command"], env={**base, **env, "NODE": str(node)}, check=True, timeout=30)
    parsed = []
    for node in range(len(pods)):
        argv = (tmp_path / f"argv.{node}").read_text().splitlines()
        assert argv[0] == "train"
        parsed.append(build_parser().parse_known_args(argv)[0])
    return parsed


def test_pytorchjob_has_one_master_and_n_minus_1_workers_as_the_operator_requires(toy_site, capsys):
    doc = launch_k8s(capsys, "--nnodes", "3", "--nproc-per-node", "8", "--job-name", "llama-a",
                     "--gpus-per-node", "8")
    assert_valid_pytorchjob(doc)
    replicas = doc["spec"]["pytorchReplicaSpecs"]
    assert {k: v["replicas"] for k, v in replicas.items()} == {"Master": 1, "Worker": 2}
    assert doc["spec"]["nprocPerNode"] == "8"
    limits = replicas["Worker"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": 8}


def test_pytorchjob_pods_run_loong_train_as_nodes_0_to_2_with_the_master_as_rendezvous(toy_site, capsys, tmp_path):
    doc = launch_k8s(capsys, "--nnodes", "3", "--job-name", "llama-a", "--rdzv-port", "29500")
    replicas = doc["spec"]["pytorchReplicaSpecs"]
    # what the operator sets: the master's service and port, RANK 0 (master) / 1 + index (workers)
    operator = {"MASTER_ADDR": "llama-a-master-0", "MASTER_PORT": "29500", "WORLD_SIZE": "3"}
    pods = [(replicas["Master"]["template"]["spec"]["containers"][0], {**operator, "RANK": "0"})]
    pods += [(replicas["Worker"]["template"]["spec"]["containers"][0], {**operator, "RANK": str(i + 1)})
             for i in range(replicas["Worker"]["replicas"])]
    nodes = run_pods(tmp_path, pods)
    assert [a.node_rank for a in nodes] == [0, 1, 2]
    for a in nodes:
        assert (a.nnodes, a.nproc_per_node, a.rdzv_endpoint, a.rdzv_id, a.max_restarts) == \
            ("3", 1, "llama-a-master-0:29500", "llama-a", 0)
        assert a.overrides == [*TOY, "trainer.save_on_signal=true", "trainer.resume=auto",
                               "trainer.run_dir=runs/toy/llama-a"]


def test_jobset_is_one_indexed_job_of_n_pods_as_the_webhook_requires(toy_site, capsys):
    doc = launch_k8s(capsys, "--kind", "jobset", "--nnodes", "4", "--job-name", "llama-b", "--restarts", "3")
    assert_valid_jobset(doc)
    (rjob,) = doc["spec"]["replicatedJobs"]
    assert (rjob["replicas"], rjob["template"]["spec"]["completions"]) == (1, 4)
    assert doc["spec"]["failurePolicy"] == {"maxRestarts": 3}


def test_jobset_pods_run_their_completion_index_as_node_rank_with_pod_0_as_rendezvous(toy_site, capsys, tmp_path):
    doc = launch_k8s(capsys, "--kind", "jobset", "--nnodes", "2", "--job-name", "llama-b")
    (rjob,) = doc["spec"]["replicatedJobs"]
    container = rjob["template"]["spec"]["template"]["spec"]["containers"][0]
    nodes = run_pods(tmp_path, [(container, {"JOB_COMPLETION_INDEX": str(i)}) for i in range(2)])
    assert [a.node_rank for a in nodes] == [0, 1]
    # pod hostname <jobset>-<replicatedJob>-<job index>-<pod index>, subdomain the JobSet's name
    head = f"llama-b-{rjob['name']}-0-0.llama-b"
    assert "subdomain" not in doc["spec"]["network"]
    assert {(a.rdzv_endpoint, a.nnodes, a.rdzv_id) for a in nodes} == {(f"{head}:29400", "2", "llama-b")}


def test_sigterm_gives_the_ranks_the_grace_period_to_checkpoint(toy_site, capsys):
    doc = launch_k8s(capsys, "--kind", "jobset", "--nnodes", "2", "--grace", "300")
    pod = doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert pod["terminationGracePeriodSeconds"] == 300 and env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "300"
    assert "trainer.save_on_signal=true" in pod["containers"][0]["command"][2]


def test_pvc_holds_the_run_directory_on_every_pod(toy_site, capsys):
    doc = launch_k8s(capsys, "--nnodes", "2", "--job-name", "llama-c", "--pvc", "shared-runs:/mnt/runs")
    assert_valid_pytorchjob(doc)
    for replica in doc["spec"]["pytorchReplicaSpecs"].values():
        pod = replica["template"]["spec"]
        assert {"name": "runs", "persistentVolumeClaim": {"claimName": "shared-runs"}} in pod["volumes"]
        container = pod["containers"][0]
        assert {"name": "runs", "mountPath": "/mnt/runs"} in container["volumeMounts"]
        assert "trainer.run_dir=/mnt/runs/runs/toy/llama-c" in container["command"][2]


def test_restarts_are_whole_job_restarts_and_none_by_default(toy_site, capsys):
    doc = launch_k8s(capsys, "--nnodes", "2")
    master = doc["spec"]["pytorchReplicaSpecs"]["Master"]
    assert (master["restartPolicy"], doc["spec"]["runPolicy"]["backoffLimit"]) == ("Never", 0)
    doc = launch_k8s(capsys, "--nnodes", "2", "--restarts", "2")
    master = doc["spec"]["pytorchReplicaSpecs"]["Master"]
    assert (master["restartPolicy"], doc["spec"]["runPolicy"]["backoffLimit"]) == ("OnFailure", 2)


def test_one_node_is_a_master_alone(toy_site, capsys):
    doc = launch_k8s(capsys, "--nnodes", "1")
    assert_valid_pytorchjob(doc)
    assert list(doc["spec"]["pytorchReplicaSpecs"]) == ["Master"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--max-restarts", "1"], "--max-restarts 1 is refused by 'loong launch k8s': Kubernetes restarts "
                              "the job instead (--restarts N"),
    (["--job-name", "Llama_A"], "--job-name 'Llama_A' cannot name a pytorchjob: use lower-case letters, "
                                "digits and '-', starting with a letter. Fix: --job-name llama-a"),
    (["--kind", "jobset", "--job-name", "a" * 50], "is too long for a jobset of 2 node(s): its longest "
                                                   "pod name"),
    (["--pvc", "shared-runs"], "--pvc 'shared-runs' is not CLAIM:/absolute/path"),
    (["--env", "NO_VALUE"], "--env 'NO_VALUE' is not NAME=VALUE"),
])
def test_bad_options_are_refused_naming_the_option(toy_site, capsys, argv, message):
    assert loong_main(["launch", "k8s", *TOY, "--image", "x", "--nnodes", "2", *argv]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and not captured.out
