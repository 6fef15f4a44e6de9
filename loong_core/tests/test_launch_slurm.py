"""``loong launch slurm``: the sbatch script runs the same ``loong train`` on every node.

The script runs under bash with a fake Slurm first on PATH: ``srun`` starts one local task per
node with that node's ``SLURM_NODEID``, ``scontrol`` lists the allocation's hosts and records
``requeue``, ``scancel`` signals the tasks. The batch shell itself has ``SLURM_NODEID=0``, as
under Slurm, so a node rank expanded there instead of in each task shows up as two rank-0 nodes.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loong_core.cli.main import build_parser
from loong_core.cli.main import main as loong_main
from loong_core.testing import free_port, install_plugin, read_metrics

JOB_ID = "4242"
FAKE_SRUN = """#!/bin/bash
# fake srun: one task per node of the allocation, all on this machine
while [[ "$1" == -* ]]; do echo "$1" >> "$FAKE_SLURM/srun_options"; shift; done
pids=()
for ((node = 0; node < SLURM_NNODES; node++)); do
  SLURM_NODEID=$node SLURM_PROCID=$node SLURM_LOCALID=0 "$@" &
  pids+=($!)
  echo $! >> "$FAKE_SLURM/tasks"
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""
FAKE_SCONTROL = """#!/bin/bash
echo "scontrol $*" >> "$FAKE_SLURM/calls"
if [ "$1 $2" = "show hostnames" ]; then printf '%s\\n' $FAKE_HOSTS; fi
"""
FAKE_SCANCEL = """#!/bin/bash
echo "scancel $*" >> "$FAKE_SLURM/calls"
for pid in $(cat "$FAKE_SLURM/tasks"); do kill -s "${1#--signal=}" "$pid"; done
"""
# Stands in for loong: records its arguments, then (FAKE_WAIT) runs until SIGTERM.
FAKE_LOONG = """#!/bin/bash
trap 'echo "term $SLURM_NODEID" >> "$FAKE_SLURM/calls"; exit 0' TERM
printf '%s\\n' "$@" > "$FAKE_SLURM/argv.$SLURM_NODEID"
if [ -n "${FAKE_WAIT:-}" ]; then while :; do sleep 0.1; done; fi
"""
# Records its arguments, then runs the real loong.
RECORDING_LOONG = f"""#!/bin/bash
printf '%s\\n' "$@" > "$FAKE_SLURM/argv.$SLURM_NODEID"
exec {sys.executable} -m loong_core.cli.main "$@"
"""
TOY = ["experiment=toy", "trainer.micro_batch_size=1", "trainer.global_batch_size=4"]


def fake_slurm(tmp_path: Path, loong: str, hosts: str = "node0 node1") -> dict:
    """A fake Slurm (and ``loong``) first on PATH; the environment of the batch shell."""
    bin_dir, state = tmp_path / "bin", tmp_path / "slurm"
    bin_dir.mkdir()
    state.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL), ("scancel", FAKE_SCANCEL),
                       ("loong", loong)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "LOONG_RUNS"))}
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "FAKE_SLURM": str(state),
            "FAKE_HOSTS": hosts, "SLURM_JOB_ID": JOB_ID, "SLURM_NNODES": "2",
            "SLURM_JOB_NODELIST": "node[0-1]", "SLURM_NODEID": "0"}


def write_script(tmp_path: Path, argv: list[str]) -> Path:
    path = tmp_path / "job.sbatch"
    assert loong_main(["launch", "slurm", *argv, "-o", str(path)]) == 0
    return path


def node_args(state: Path, node: int):
    """The parsed ``loong train`` arguments node ``node`` ran with."""
    argv = (state / f"argv.{node}").read_text().splitlines()
    assert argv[0] == "train"
    return build_parser().parse_known_args(argv)[0]


def calls(state: Path) -> list[str]:
    return (state / "calls").read_text().splitlines()


def _kill(proc: subprocess.Popen) -> None:
    """End ``proc``'s session (the batch shell and every task) if it is still running."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_sbatch_lines_ask_for_the_nodes_one_task_each_and_requeue(toy_site, tmp_path):
    script = write_script(tmp_path, [*TOY, "--nnodes", "4", "--gpus-per-node", "8", "--time",
                                     "04:00:00", "--partition", "gpu", "--account", "proj",
                                     "--cpus-per-task", "32", "--sbatch-arg=--qos=high"])
    lines = [line.split(None, 1)[1] for line in script.read_text().splitlines()
             if line.startswith("#SBATCH")]
    assert lines == ["--job-name=loong-toy", "--nodes=4", "--ntasks-per-node=1", "--gpus-per-node=8",
                     "--cpus-per-task=32", "--time=04:00:00", "--partition=gpu", "--account=proj",
                     "--output=slurm-%x-%j.out", "--open-mode=append", "--signal=B:USR1@120",
                     "--requeue", "--qos=high"]


def test_every_node_runs_loong_train_with_its_rank_and_the_first_node_as_rendezvous(toy_site, tmp_path):
    script = write_script(tmp_path, [*TOY, "optim.lr=2e-3", "--nnodes", "2", "--nproc-per-node", "2",
                                     "--rdzv-port", "29555"])
    env = fake_slurm(tmp_path, FAKE_LOONG)
    done = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    state = Path(env["FAKE_SLURM"])
    nodes = [node_args(state, node) for node in (0, 1)]
    assert [a.node_rank for a in nodes] == [0, 1]
    for a in nodes:
        assert (a.nnodes, a.nproc_per_node, a.rdzv_endpoint, a.rdzv_id, a.max_restarts) == \
            ("2", 2, "node0:29555", JOB_ID, 0)
        assert a.overrides == [*TOY, "optim.lr=2e-3", "trainer.save_on_signal=true",
                               "trainer.resume=auto", f"trainer.run_dir=runs/toy/slurm-{JOB_ID}"]
    assert (state / "srun_options").read_text().split() == ["--ntasks-per-node=1", "--kill-on-bad-exit=1"]


def test_overrides_the_user_gave_are_kept_over_the_requeue_defaults(toy_site, tmp_path):
    script = write_script(tmp_path, [*TOY, "trainer.run_dir=/shared/run7", "trainer.resume=none",
                                     "--nnodes", "2"])
    env = fake_slurm(tmp_path, FAKE_LOONG)
    subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, check=True, timeout=60)
    overrides = node_args(Path(env["FAKE_SLURM"]), 1).overrides
    assert overrides == [*TOY, "trainer.run_dir=/shared/run7", "trainer.resume=none",
                         "trainer.save_on_signal=true"]


def test_usr1_before_the_time_limit_stops_every_node_then_requeues(toy_site, tmp_path):
    script = write_script(tmp_path, [*TOY, "--nnodes", "2"])
    env = {**fake_slurm(tmp_path, FAKE_LOONG), "FAKE_WAIT": "1"}
    state = Path(env["FAKE_SLURM"])
    batch = subprocess.Popen(["bash", str(script)], env=env, cwd=tmp_path, start_new_session=True)
    try:
        wait_for(lambda: all((state / f"argv.{n}").exists() for n in (0, 1)))
        batch.send_signal(signal.SIGUSR1)  # what #SBATCH --signal=B:USR1@120 sends
        assert batch.wait(timeout=30) == 0
    finally:
        _kill(batch)
    got = calls(state)
    assert got[:2] == ["scontrol show hostnames node[0-1]", f"scancel --signal=TERM {JOB_ID}"]
    assert sorted(got[2:4]) == ["term 0", "term 1"]  # both nodes stopped before the requeue
    assert got[4:] == [f"scontrol requeue {JOB_ID}"]


def test_sigterm_on_preemption_waits_for_the_checkpoint_and_leaves_the_requeue_to_slurm(toy_site, tmp_path):
    script = write_script(tmp_path, [*TOY, "--nnodes", "2"])
    env = {**fake_slurm(tmp_path, FAKE_LOONG), "FAKE_WAIT": "1"}
    state = Path(env["FAKE_SLURM"])
    batch = subprocess.Popen(["bash", str(script)], env=env, cwd=tmp_path, start_new_session=True)
    try:
        wait_for(lambda: all((state / f"argv.{n}").exists() for n in (0, 1)))
        batch.send_signal(signal.SIGTERM)  # Slurm signals the batch shell and every task
        for pid in (state / "tasks").read_text().split():
            os.kill(int(pid), signal.SIGTERM)
        assert batch.wait(timeout=30) == 0
    finally:
        _kill(batch)
    assert sorted(calls(state)[1:]) == ["term 0", "term 1"]  # no requeue, no scancel


@pytest.mark.parametrize(("flag", "message"), [
    (["--max-restarts", "2"], "--max-restarts 2 is refused by 'loong launch slurm': Slurm requeue "
                              "replaces torchrun restarts"),
    (["--node-rank", "1"], "--node-rank 1 is refused by 'loong launch slurm': each node's rank "
                           "comes from the scheduler"),
    (["--rdzv-endpoint", "head:29400"], "--rdzv-endpoint head:29400 is refused by 'loong launch "
                                        "slurm': the rendezvous is the job's first node"),
    (["--nnodes", "2:4"], "--nnodes 2:4 (elastic MIN:MAX) is refused by 'loong launch slurm'"),
])
def test_flags_the_script_sets_per_node_are_refused_naming_the_flag(toy_site, tmp_path, capsys, flag, message):
    assert loong_main(["launch", "slurm", *TOY, "--nnodes", "2", *flag, "-o", str(tmp_path / "j")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Fix: " in err
    assert not (tmp_path / "j").exists()


def test_a_layout_that_does_not_fit_all_nodes_fails_before_writing(toy_site, tmp_path, capsys):
    out = tmp_path / "j"
    assert loong_main(["launch", "slurm", "experiment=toy", "--nnodes", "2", "--nproc-per-node", "4",
                       "-o", str(out)]) == 2
    assert "data-parallel size = 8 ranks" in capsys.readouterr().err and not out.exists()


def test_submit_without_sbatch_on_path_says_where_to_run_it(toy_site, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch
    monkeypatch.chdir(tmp_path)
    assert loong_main(["launch", "slurm", *TOY, "--nnodes", "2", "--submit"]) == 2
    assert ("--submit needs 'sbatch', which is not on PATH. Run on a Slurm login node, or submit "
            "the written script there: sbatch loong-toy.sbatch") in capsys.readouterr().err
    assert (tmp_path / "loong-toy.sbatch").read_text().startswith("#!/bin/bash")


def test_submit_hands_the_script_to_sbatch(toy_site, tmp_path, monkeypatch, capsys):
    sbatch = tmp_path / "sbatch"
    sbatch.write_text(f'#!/bin/bash\necho "$@" > {tmp_path}/sbatch_args\necho "Submitted batch job 99"\n')
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert loong_main(["launch", "slurm", *TOY, "--nnodes", "2", "--submit", "-o",
                       str(tmp_path / "a.sbatch")]) == 0
    assert (tmp_path / "sbatch_args").read_text().split() == [str(tmp_path / "a.sbatch")]
    assert capsys.readouterr().out.strip() == "Submitted batch job 99"


SLOW_STEPS = '''
from loong_core.hookspecs import hookimpl

@hookimpl
def loong_on_log_step(run, step, metrics):
    import os, time
    time.sleep(float(os.environ.get("SLOW_STEP_S", "0")))
'''


def _toy_torch_plugin(site: Path) -> None:
    """The torch-engine toy of test_torch_engine.py, and a plugin that makes each step slow."""
    spec = importlib.util.spec_from_file_location("_toy_torch", Path(__file__).with_name("test_torch_engine.py"))
    toy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(toy)
    install_plugin(site, "loong-torch-toy", "torch_toy", {
        "loong_torch_toy.plugin": toy.PLUGIN, "loong_torch_toy.config": toy.CONFIG,
        "loong_torch_toy.model": toy.MODEL, "loong_torch_toy.data": toy.DATA})
    install_plugin(site, "loong-slow-steps", "slow_steps", {"loong_slow_steps.plugin": SLOW_STEPS})
    conf = site / "loong_torch_toy" / "conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "__init__.py").write_text("")
    (conf / "experiment" / "toy_torch.yaml").write_text(toy.EXPERIMENT)


def _steps_logged(run_dir: Path) -> int:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines() if (run_dir / "metrics.jsonl").exists() else []
    return sum('"split": "train"' in line for line in lines[:-1])  # the last line may be partial


@pytest.mark.multirank
def test_two_nodes_train_for_real_and_the_requeued_job_resumes(tmp_path):
    """The script trains toy_torch on two fake nodes (one gloo rank each); USR1 stops it with a
    checkpoint and a requeue; the requeued job (same id) continues to the last step."""
    site = tmp_path / "site"
    _toy_torch_plugin(site)
    env = {**fake_slurm(tmp_path, RECORDING_LOONG, hosts="localhost node1"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
           "LOONG_PLUGINS": "torch_toy,slow_steps", "OMP_NUM_THREADS": "1"}
    script = tmp_path / "job.sbatch"
    subprocess.run([sys.executable, "-m", "loong_core.cli.main", "launch", "slurm", "experiment=toy_torch",
                    "trainer.train_iters=12", "trainer.eval_interval=0", "--nnodes", "2",
                    "--rdzv-port", str(free_port()), "-o", str(script)], env=env, check=True, timeout=60)
    state, run_dir = Path(env["FAKE_SLURM"]), tmp_path / "runs" / "toy_torch" / f"slurm-{JOB_ID}"
    batch = subprocess.Popen(["bash", str(script)], env={**env, "SLOW_STEP_S": "0.2"}, cwd=tmp_path,
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _steps_logged(run_dir) >= 2, 120)
        batch.send_signal(signal.SIGUSR1)
        assert batch.wait(timeout=90) == 0
    finally:
        _kill(batch)
    stopped_at = read_metrics(run_dir)[-1]["step"]
    assert 2 <= stopped_at < 12 and calls(state)[-1] == f"scontrol requeue {JOB_ID}"
    assert [node_args(state, n).node_rank for n in (0, 1)] == [0, 1]
    (state / "tasks").unlink()
    requeued = subprocess.Popen(["bash", str(script)], env=env, cwd=tmp_path, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = requeued.communicate(timeout=120)
    finally:
        _kill(requeued)
    assert requeued.returncode == 0, err[-4000:]
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(1, 13))
