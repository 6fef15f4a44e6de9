"""Crash-safety suite (issue 14), with ``test_checkpoint_safety.py`` (planted payloads, damaged
shards, NaN runs): kill -9 of the launcher at random points and during saves on 1 rank and on
DP2 ends every process of the job within 10 s, and the resumed run reproduces the losses bit for
bit; SIGKILL of the group and SIGINT of the launcher end every process; SIGTERM with
``trainer.save_on_signal`` checkpoints and exits cleanly; ``--max-restarts`` recovers from killing
rank 0 and then rank 1 with the losses of an uninterrupted run. The same kill chains with
``trainer.async_save`` (megatron-core's forked writers) never leave a visible partial checkpoint,
resume bit for bit and leave no writer process behind (reaped: no zombie); a full disk under an
asynchronous write fails that save only.

Kill points are drawn from a seeded generator and printed (``-s``) so that a failure can be
replayed; timings are not asserted, only outcomes.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from loong_core.checkpoint import store
from loong_core.reaper import _process_table, descendants
from loong_core.testing import install_plugin, losses, run_train

pytestmark = pytest.mark.crash_safety

STEPS = 8

CRASH_ONCE_PLUGIN = '''
import os
from loong_core.hookspecs import hookimpl

@hookimpl
def loong_on_log_step(run, step, metrics):
    """CRASH_PLAN="rank:step,rank:step": the i-th entry kills that rank at that step, once
    (MARKER_DIR remembers which entries have fired across restarts)."""
    for i, entry in enumerate(filter(None, os.environ.get("CRASH_PLAN", "").split(","))):
        rank, at = map(int, entry.split(":"))
        marker = os.path.join(os.environ["MARKER_DIR"], f"crash{i}")
        if run.rank == rank and step == at and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(17)
'''


# Each rank notes the checkpoint writers it forked (children running its own command line) while
# they work, and at the end of training its children that are zombies or writers still running.
WRITER_WATCH_PLUGIN = '''
import glob
import json
import os
import threading
import time
from loong_core.hookspecs import hookimpl

SEEN = {"writers_seen": 0}


def _children():
    me, out = str(os.getpid()), []
    mine = open("/proc/self/cmdline", "rb").read()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            forked = open(f"/proc/{entry}/cmdline", "rb").read() == mine
        except OSError:
            continue
        if fields[1] == me:
            out.append((fields[0], forked))
    return out


def _live_writer():
    for listing in glob.glob("/proc/self/task/*/children"):
        try:
            pids = open(listing).read().split()
        except OSError:
            continue
        for pid in pids:
            try:
                stat = open(f"/proc/{pid}/stat").read()
            except OSError:
                continue
            if stat.rsplit(")", 1)[1].split()[0] != "Z" and "(loong-writer)" in stat:
                return stat
    return None


def _sample(rank):
    # every few ms, so a writer that lives between two log steps is seen too; the marker is
    # written at once, so runs killed later count as well
    while not (seen := _live_writer()):
        time.sleep(0.002)
    SEEN["writers_seen"] += 1
    open(os.path.join(os.environ["WATCH_DIR"], f"seen-rank{rank}-{os.getpid()}"), "w").write(seen)


@hookimpl
def loong_on_train_start(run):
    threading.Thread(target=_sample, args=(run.rank,), daemon=True).start()


@hookimpl
def loong_on_train_end(run, metrics):
    children = _children()
    SEEN.update(zombies=sum(state == "Z" for state, _ in children),
                writers_left=sum(forked and state != "Z" for state, forked in children))
    path = os.path.join(os.environ["WATCH_DIR"], f"rank{run.rank}-{os.getpid()}.json")
    open(path, "w").write(json.dumps(SEEN))
'''


class Run:
    """``loong train`` in its own session, output in files; the test kills it as it pleases."""

    def __init__(self, overrides: list[str], nproc: int, launch_args: list[str] = (), env: dict | None = None):
        self.out = tempfile.TemporaryFile("w+")
        cmd = [sys.executable, "-m", "loong_core.cli.main", "train", *overrides, "--nproc-per-node", str(nproc),
               *launch_args]
        self.proc = subprocess.Popen(cmd, stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})

    def family(self) -> dict[int, str]:
        """The launcher and all its descendants now, ``pid -> start time``."""
        table = _process_table()
        mine = {self.proc.pid: table[self.proc.pid][1]} if self.proc.pid in table else {}
        return {**mine, **descendants(self.proc.pid, table)}

    def wait(self, timeout: float = 600) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass

    def output(self) -> str:
        self.out.seek(0)
        return self.out.read()


def _alive(family: dict[int, str]) -> list[int]:
    table = _process_table()
    return [pid for pid, start in family.items() if pid in table and table[pid][1] == start
            and not _zombie(pid)]


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def _until(condition, timeout: float = 300, period: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(period)
    return False


def _checkpoints(run_dir: Path) -> list[Path]:
    root = run_dir / "checkpoints"
    return sorted(root.iterdir()) if root.is_dir() else []


def _partial(run_dir: Path) -> bool:
    return any(p.name.endswith(".partial") for p in _checkpoints(run_dir))


def _kill_point(run: Run, run_dir: Path, rng: random.Random, during_save: bool) -> str:
    """Wait for the drawn moment, kill -9 the launcher alone (as the OOM killer would); every
    process of the job must be gone within 10 s. Returns where the kill landed."""
    ended = run.proc.poll
    if during_save:  # the moment a .partial folder exists, plus 0-0.2 s
        _until(lambda: _partial(run_dir) or ended() is not None)
        time.sleep(rng.uniform(0.0, 0.2))
        where = "during save" if _partial(run_dir) else "after save"
    else:  # 1-2 checkpoints later, plus 0-0.5 s
        target = len(store.list_checkpoints(run_dir / "checkpoints")) + rng.randint(1, 2)
        _until(lambda: len(store.list_checkpoints(run_dir / "checkpoints")) >= target or ended() is not None)
        time.sleep(rng.uniform(0.0, 0.5))
        where = "random"
    if ended() is not None:  # the run finished before the drawn moment (poll() has reaped it)
        run.wait()
        return "after the end"
    family = run.family()
    os.kill(run.proc.pid, signal.SIGKILL)
    gone = _until(lambda: not _alive(family), timeout=10)
    left = _alive(family)
    run.wait()
    assert gone, f"kill -9 of the launcher {where}: still alive after 10 s: {left} of {family}"
    return where


def _kill_chain(tiny, run_dir: Path, nproc: int, points: int, seed: int, extra: list[str] = (),
                env: dict | None = None) -> list[str]:
    """Start, kill -9 the whole job at a drawn point, resume, ... ``points`` times; then finish."""
    rng = random.Random(seed)
    common = [*tiny, f"trainer.train_iters={STEPS}", "trainer.save_interval=1", f"trainer.run_dir={run_dir}",
              "trainer.resume=auto", *extra]
    notes = []
    for point in range(points):
        where = _kill_point(Run(common, nproc, env=env), run_dir, rng, during_save=point % 2 == 0)
        newest = store.find_latest(run_dir / "checkpoints")
        notes.append(f"kill {point + 1} ({where}): newest complete {newest.name if newest else None}")
    print(f"{nproc} rank(s), seed {seed}:", *notes, sep="\n  ")
    run_train(common, nproc=nproc, env=env)
    return notes


@pytest.fixture(scope="module")
def dp2_reference(tiny, tmp_path_factory):
    """An uninterrupted 8-step DP2 run (the losses every DP2 recovery must reproduce)."""
    run_dir = tmp_path_factory.mktemp("dp2") / "reference"
    run_train([*tiny, f"trainer.train_iters={STEPS}", f"trainer.run_dir={run_dir}"], nproc=2)
    return losses(run_dir)


def _assert_recovered(run_dir: Path, reference: dict) -> None:
    resumed = losses(run_dir)
    assert [resumed[s] for s in range(1, STEPS + 1)] == [reference[s] for s in range(1, STEPS + 1)]
    for path in store.list_checkpoints(run_dir / "checkpoints"):
        store.verify_checkpoint(path)  # every visible checkpoint is intact


def test_kill9_at_random_points_and_during_saves_on_one_rank(tiny, reference_run, tmp_path):
    run_dir = tmp_path / "run"
    notes = _kill_chain(tiny, run_dir, nproc=1, points=5, seed=14)
    assert sum("during save" in n for n in notes) >= 2
    _assert_recovered(run_dir, losses(reference_run))


@pytest.mark.multirank
def test_kill9_at_random_points_and_during_saves_on_dp2(tiny, dp2_reference, tmp_path):
    run_dir = tmp_path / "run"
    notes = _kill_chain(tiny, run_dir, nproc=2, points=3, seed=41)
    assert sum("during save" in n for n in notes) >= 1
    _assert_recovered(run_dir, dp2_reference)


@pytest.mark.multirank
def test_max_restarts_recovers_from_killing_rank0_then_rank1(tiny, dp2_reference, tmp_path):
    site = tmp_path / "site"
    install_plugin(site, "loong-test-crash-once", "crash_once", {"loong_test_crash_once": CRASH_ONCE_PLUGIN})
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
           "CRASH_PLAN": "0:3,1:6", "MARKER_DIR": str(tmp_path)}
    run_dir = tmp_path / "run"
    proc = run_train([*tiny, f"trainer.train_iters={STEPS}", "trainer.save_interval=2", f"trainer.run_dir={run_dir}"],
                     nproc=2, env=env, launch_args=["--max-restarts", "2"])
    assert (tmp_path / "crash0").exists() and (tmp_path / "crash1").exists()  # both ranks were killed
    assert proc.stderr.count("restart 1 of 2") == 1 and proc.stderr.count("restart 2 of 2") == 1
    _assert_recovered(run_dir, dp2_reference)


@pytest.mark.multirank
@pytest.mark.parametrize("nproc, target, sig", [(2, "group", signal.SIGKILL), (2, "launcher", signal.SIGINT)])
def test_killing_the_launcher_ends_every_process_within_10_s(tiny, tmp_path, nproc, target, sig):
    """(kill -9 of the launcher alone, 1 rank and DP2, is checked at every point of the kill chains)"""
    run_dir = tmp_path / "run"
    run = Run([*tiny, "trainer.train_iters=1000", "trainer.save_interval=1", f"trainer.run_dir={run_dir}"], nproc)
    assert _until(lambda: len(store.list_checkpoints(run_dir / "checkpoints")) >= 1), run.output()[-3000:]
    family = run.family()  # launcher, workers, reapers, resource tracker
    assert len(family) >= 2 + nproc, family
    if target == "group":
        os.killpg(run.proc.pid, sig)
    else:
        os.kill(run.proc.pid, sig)
    started = time.monotonic()
    gone = _until(lambda: not _alive(family), timeout=10)
    left = _alive(family)
    run.wait(timeout=30)
    assert gone, f"still alive after 10 s: {left} of {family}"
    print(f"{nproc} rank(s), {sig.name} to the {target}: {len(family)} processes gone in "
          f"{time.monotonic() - started:.1f} s")


@pytest.mark.multirank
def test_sigterm_with_save_on_signal_writes_a_checkpoint_and_exits_cleanly(tiny, tmp_path):
    run_dir = tmp_path / "run"
    run = Run([*tiny, "trainer.train_iters=1000", "trainer.save_interval=3", "trainer.save_on_signal=true",
               f"trainer.run_dir={run_dir}"], nproc=2)
    assert _until(lambda: len(store.list_checkpoints(run_dir / "checkpoints")) >= 1), run.output()[-3000:]
    family = run.family()
    os.kill(run.proc.pid, signal.SIGTERM)
    code = run.wait(timeout=60)
    output = run.output()
    assert code == 0, output[-3000:]
    stopped = int(output.split("SIGTERM: stopped after step ")[1].split(",")[0].split(";")[0])
    newest = store.find_latest(run_dir / "checkpoints")
    assert newest.name == f"iter_{stopped:07d}" and stopped < 1000
    store.verify_checkpoint(newest)
    assert _until(lambda: not _alive(family), timeout=10), _alive(family)


def _writer_watch(tmp_path: Path) -> dict:
    site = tmp_path / "site"
    install_plugin(site, "loong-test-writer-watch", "writer_watch", {"loong_test_writer_watch": WRITER_WATCH_PLUGIN})
    (tmp_path / "watch").mkdir()
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
            "WATCH_DIR": str(tmp_path / "watch")}


def _watched(tmp_path: Path) -> list[dict]:
    import json

    return [json.loads(p.read_text()) for p in sorted((tmp_path / "watch").glob("*.json"))]


def _writers_seen(tmp_path: Path) -> int:
    """How many processes of the chain (killed ones included) saw a forked writer at work."""
    return len(list((tmp_path / "watch").glob("seen-*")))


def test_kill9_during_async_saves_resumes_bit_exact_and_leaves_no_writer(tiny, reference_run, tmp_path):
    """trainer.async_save on one rank: the checkpoint stays a .partial folder while its forked writer
    works, so kills during the write (drawn as in the chains above) never leave a visible partial one."""
    run_dir = tmp_path / "run"
    notes = _kill_chain(tiny, run_dir, nproc=1, points=2, seed=28, extra=["trainer.async_save=true"],
                        env=_writer_watch(tmp_path))
    assert sum("during save" in n for n in notes) >= 1
    _assert_recovered(run_dir, losses(reference_run))
    finished = _watched(tmp_path)[-1]  # the run that finished (the killed ones never reached the end)
    assert finished["zombies"] == 0 and finished["writers_left"] == 0, finished
    assert _writers_seen(tmp_path), "no forked writer was ever seen: the saves were not async"


@pytest.mark.multirank
def test_async_saves_on_dp2_resume_bit_exact_after_kill9(tiny, dp2_reference, tmp_path):
    run_dir = tmp_path / "run"
    _kill_chain(tiny, run_dir, nproc=2, points=1, seed=82, extra=["trainer.async_save=true"],
                env=_writer_watch(tmp_path))
    _assert_recovered(run_dir, dp2_reference)
    watched = _watched(tmp_path)
    assert [(w["zombies"], w["writers_left"]) for w in watched] == [(0, 0), (0, 0)], watched  # both ranks
    assert _writers_seen(tmp_path), "no forked writer was ever seen: the saves were not async"


def test_a_full_disk_under_an_async_write_fails_that_save_and_training_goes_on(tiny, reference_run, tmp_path):
    from loong_core import testing_faults as faults
    from loong_core.checkpoint import space

    size = space.checkpoint_size(reference_run / "checkpoints" / "iter_0000002")
    run_dir = tmp_path / "run"
    with faults.small_filesystem(run_dir / "checkpoints", int(0.7 * size)) as disk:  # passes the free-space check
        proc = run_train([*tiny, "trainer.train_iters=4", "trainer.save_interval=2", "trainer.async_save=true",
                          f"trainer.run_dir={run_dir}"], check=False)
        log = proc.stdout + proc.stderr
        # found when the forked writer's results are gathered, steps later; logged like a synchronous failure
        assert "checkpoint of step 2 not saved (rank 0: [Errno 28] No space left on device" in log, log[-3000:]
        assert "there is no earlier checkpoint" in log and "Training continues" in log
        assert proc.returncode == 2 and "error: checkpoint of step 4 not saved" in proc.stderr  # the last save
        assert list(disk.iterdir()) == []  # no partial folder left
    ref = losses(reference_run)
    assert losses(run_dir) == {s: ref[s] for s in range(1, 5)}  # the failed write changed nothing in training
