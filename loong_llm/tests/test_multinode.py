"""Two nodes on one machine: two ``loong train --nnodes 2 --node-rank {0,1} --nproc-per-node 2``
agents meet at a c10d rendezvous on loopback, each with its own node-local cache
(``data.shared_cache=false``, different ``LOONG_CACHE`` folders, as two machines' local disks) and
one shared run directory.

One module-scoped set of runs serves every test: a one-node DP4 reference, the same run on two
nodes (a checkpoint at step 2), and a relaunch of the two nodes from that checkpoint which is then
cut off by killing one node's ``loong train``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from loong_core.testing import free_port, losses, run_train

pytestmark = pytest.mark.multirank

STEPS = 4
COMMON = ["experiment=llama_debug", "model.num_layers=2", "trainer.log_interval=1", "trainer.eval_interval=0",
          "trainer.progress_bar=false", "trainer.tensorboard=false", "trainer.straggler_factor=0",
          "optim.lr_decay_iters=20"]  # a fixed schedule: the relaunch may ask for more steps


def node_args(rank: int, endpoint: str) -> list[str]:
    return ["--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", endpoint, "--rdzv-id", "two-nodes"]


def start_node(overrides: list[str], rank: int, endpoint: str, cache: Path, log: Path) -> subprocess.Popen:
    """One node's ``loong train`` (2 ranks) in the background, output to ``log``."""
    cmd = [sys.executable, "-m", "loong_core.cli.main", "train", *overrides, "--nproc-per-node", "2",
           *node_args(rank, endpoint)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LOONG_CACHE": str(cache)}
    with open(log, "w") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def end(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def steps_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines()[:-1] if path.exists() else []  # the last may be partial
    return sum('"split": "train"' in line for line in lines)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, loong_cache):
    """Reference, two-node run and the killed relaunch; their run dirs, caches and logs."""
    root = tmp_path_factory.mktemp("two_nodes")
    caches = [Path(loong_cache), root / "node1-disk"]  # node 1 prepares its own copy of the data
    ref = root / "ref"
    started = time.monotonic()
    run_train([*COMMON, f"trainer.train_iters={STEPS}", f"trainer.run_dir={ref}"], nproc=4)
    two = root / "two"
    overrides = [*COMMON, f"trainer.train_iters={STEPS}", "trainer.save_interval=2", "data.shared_cache=false",
                 f"trainer.run_dir={two}"]
    endpoint = f"127.0.0.1:{free_port()}"
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda r: run_train(overrides, nproc=2, env={"LOONG_CACHE": str(caches[r])},
                                                    check=False, launch_args=node_args(r, endpoint)), (0, 1)))
    for result in results:
        assert result.returncode == 0, result.stderr[-4000:]

    # Relaunch from step 2 (as after a failure there) for many steps; once step 4 is logged,
    # node 1's loong train is killed (SIGKILL: its workers die with it, as with a lost machine).
    again = root / "again"
    shutil.copytree(two, again, ignore=shutil.ignore_patterns("iter_0000004", "metrics.jsonl"))
    overrides = [*COMMON, "trainer.train_iters=1000", "trainer.resume=auto", "data.shared_cache=false",
                 f"trainer.run_dir={again}"]
    endpoint = f"127.0.0.1:{free_port()}"
    logs = [root / f"again{r}.log" for r in (0, 1)]
    nodes = [start_node(overrides, r, endpoint, caches[r], logs[r]) for r in (0, 1)]
    try:
        deadline = time.monotonic() + 240
        while steps_logged(again) < 2:
            assert time.monotonic() < deadline and nodes[0].poll() is None, logs[0].read_text()[-4000:]
            time.sleep(0.05)
        os.kill(nodes[1].pid, signal.SIGKILL)
        killed = time.monotonic()
        survivor = nodes[0].wait(timeout=120)
        survived_s = time.monotonic() - killed
    finally:
        for node in nodes:
            end(node)
    print(f"two-node module: {time.monotonic() - started:.0f} s, survivor ended {survived_s:.1f} s after the kill")
    return {"ref": ref, "two": two, "again": again, "caches": caches, "survivor": survivor,
            "survived_s": survived_s, "survivor_log": logs[0].read_text(),
            "again_logs": [log.read_text() for log in logs]}


def test_two_nodes_with_node_local_caches_train_as_one_node_at_dp4_bit_exact(runs):
    ref = losses(runs["ref"])
    assert sorted(ref) == list(range(1, STEPS + 1))
    assert losses(runs["two"]) == ref  # same ranks, same collectives: equal to the last bit


def test_each_node_builds_the_sample_index_in_its_own_cache(runs):
    indexes = [sorted(p.name.split("-", 1)[1] for p in Path(c).glob("text/*/index_cache/*.npy"))
               for c in runs["caches"]]
    assert "GPTDataset-train-document_index.npy" in indexes[1]
    assert set(indexes[1]) <= set(indexes[0])  # names carry a hash of the node's own cache path


def test_a_relaunch_with_resume_auto_continues_bit_exact(runs):
    """The relaunch asks for 1000 steps, where ``kernels=auto`` would compile on CPU: it keeps the
    kernels its checkpoint was trained with (docs/kernels.md), so the losses are bitwise equal."""
    ref, again = losses(runs["ref"]), losses(runs["again"])
    assert min(again) == 3  # resumed from the checkpoint at step 2
    assert {s: again[s] for s in (3, 4)} == {s: ref[s] for s in (3, 4)}
    from loong_core.kernels.resolve import is_available
    from loong_core.plugins import get_plugin_system

    if is_available(get_plugin_system().registry().get("kernel", "rms_norm:compile")):  # else auto is analytic
        logs = runs["again_logs"]
        assert any("rms_norm=analytic instead of compile" in log for log in logs), logs[0][-3000:]


def test_killing_one_node_ends_the_other_naming_the_lost_node(runs):
    assert runs["survivor"] != 0
    assert runs["survived_s"] < 60
    log = runs["survivor_log"]
    # On one machine either node may host the c10d store: losing its host ends the survivor's
    # agent (rendezvous lost), losing the other node ends the survivor's ranks (peer lost).
    assert ("error: lost contact with the rank at 127.0.0.1:" in log
            or "error: lost the rendezvous at 127.0.0.1:" in log), log[-4000:]
    assert "could not join" not in log
    assert "Relaunch every node with trainer.resume=auto" in log


def test_elastic_one_to_two_nodes_starts_with_one_when_the_second_never_comes(runs, tmp_path):
    """``--nnodes 1:2``: once node 0 is at the rendezvous, torchrun waits ``last_call_timeout``
    (LOONG_RDZV_LAST_CALL, torch's default 30 s) for more nodes, then trains with the one it has
    (DP2 here: the same global batch by gradient accumulation)."""
    from loong_core.testing import assert_loss_curve

    started = time.monotonic()
    result = run_train([*COMMON, "trainer.train_iters=2", f"trainer.run_dir={tmp_path / 'run'}"], nproc=2,
                       env={"LOONG_RDZV_LAST_CALL": "2"},
                       launch_args=["--nnodes", "1:2", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                                    "--rdzv-id", "elastic"])
    assert time.monotonic() - started < 120
    assert "x 2 ranks (gloo)" in result.stdout + result.stderr
    assert_loss_curve(losses(tmp_path / "run"), losses(runs["ref"]), range(1, 3), "elastic 1 of 2 nodes (DP2)")


def test_tp2_x_dp2_across_two_nodes_follows_the_one_node_dp4_curve(runs, tmp_path, loong_cache):
    """Tensor parallelism inside each node (ranks 2n, 2n+1), data parallelism across the nodes,
    each node with its own cache: the DP4 curve within the tensor-parallel tolerance (TP splits
    the reductions, so not to the last bit)."""
    from loong_core.testing import assert_loss_curve

    run_dir, endpoint = tmp_path / "tp2", f"127.0.0.1:{free_port()}"
    overrides = [*COMMON, "trainer.train_iters=3", "parallel.tensor_model_parallel_size=2",
                 "data.shared_cache=false", f"trainer.run_dir={run_dir}"]
    caches = [loong_cache, tmp_path / "node1-disk"]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda r: run_train(overrides, nproc=2, env={"LOONG_CACHE": str(caches[r])},
                                                    check=False, launch_args=node_args(r, endpoint)), (0, 1)))
    for result in results:
        assert result.returncode == 0, result.stderr[-4000:]
    # the banner comes from global rank 0, on whichever node the rendezvous gave it
    assert any("TP=2" in r.stdout + r.stderr for r in results)
    assert_loss_curve(losses(run_dir), losses(runs["ref"]), range(1, 4), "two nodes TP2 x DP2 vs one node DP4")
