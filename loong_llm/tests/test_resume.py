"""Exact resume after a crash, and checkpoints that load at another tensor-parallel size."""

from __future__ import annotations

import os

import pytest

from loong_core.testing import install_plugin, losses, run_train

CRASH_PLUGIN = '''
import os
from loong_core.hookspecs import hookimpl

@hookimpl
def loong_on_log_step(run, step, metrics):
    if step == int(os.environ.get("CRASH_AT_STEP", "-1")):
        os._exit(17)   # a hard crash: no cleanup, no final checkpoint
'''

STEPS = 8


@pytest.fixture(scope="module")
def crash_site(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    install_plugin(site, "loong-test-crash", "crash", {"loong_test_crash": CRASH_PLUGIN})
    return site


def _env(site, **extra):
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, **extra}


def _common(tiny):
    return [*tiny, f"trainer.train_iters={STEPS}", "trainer.save_interval=4"]


def test_resume_after_crash_reproduces_losses_bit_for_bit(tiny, tmp_path, crash_site, reference_run):
    # the uninterrupted run: the session's 8-step tiny run (saving every 2 steps, not 4, changes
    # no loss: the crash-safety tests compare their resumed runs with it the same way)
    reference = losses(reference_run)

    # the crashed run loads each batch in the loop (data.prefetch=false), the reference and the
    # resumed run load the next batch during the step: steps 1-4 come from the crashed run
    crashed = tmp_path / "crashed"
    proc = run_train([*_common(tiny), f"trainer.run_dir={crashed}", "data.prefetch=false"],
                     env=_env(crash_site, CRASH_AT_STEP="6"), check=False)
    assert proc.returncode != 0
    checkpoints = sorted(p.name for p in (crashed / "checkpoints").iterdir())
    assert checkpoints == ["iter_0000004"]

    run_train([*_common(tiny), f"trainer.run_dir={crashed}", "trainer.resume=auto"])
    resumed = losses(crashed)  # later records of a step overwrite the crashed run's
    assert [resumed[s] for s in range(1, STEPS + 1)] == [reference[s] for s in range(1, STEPS + 1)]
    assert (crashed / "checkpoints" / "iter_0000008" / "loong_complete.json").is_file()


@pytest.mark.multirank
def test_tp2_checkpoint_loads_at_tp1_and_back(tiny, tmp_path):
    tp2 = tmp_path / "tp2"
    run_train([*_common(tiny), "parallel=tp2", f"trainer.run_dir={tp2}"], nproc=2)
    tp2_losses = losses(tp2)

    tp1 = tmp_path / "tp1_from_tp2"
    run_train([*_common(tiny), f"trainer.run_dir={tp1}",
               f"trainer.resume={tp2 / 'checkpoints' / 'iter_0000004'}"])
    tp1_losses = losses(tp1)
    assert sorted(tp1_losses) == [5, 6, 7, 8]
    for step in range(5, STEPS + 1):
        assert tp1_losses[step] == pytest.approx(tp2_losses[step], abs=2e-5)

    back = tmp_path / "tp2_from_tp1"
    run_train([*_common(tiny), "parallel=tp2", f"trainer.run_dir={back}",
               f"trainer.resume={tp1 / 'checkpoints' / 'iter_0000008'}",
               "trainer.train_iters=10"], nproc=2)
    assert sorted(losses(back)) == [9, 10]


def test_init_from_takes_a_run_directory_and_refuses_other_shapes(tiny, tmp_path, reference_run):
    source = reference_run  # a run directory of the tiny model (read, not changed)
    fresh = tmp_path / "fresh"
    run_train([*tiny, "trainer.train_iters=1", f"trainer.run_dir={fresh}", f"trainer.init_from={source}"])
    assert sorted(losses(fresh)) == [1]

    # Another vocabulary gives a smaller embedding; dist_checkpointing alone would load a slice.
    other = run_train([*tiny, "trainer.train_iters=1", "data.vocab_size=384", f"trainer.run_dir={tmp_path / 'x'}",
                       f"trainer.init_from={source}"], check=False)
    assert other.returncode != 0
    assert "embedding.word_embeddings.weight: checkpoint [512, 64], model [384, 64]" in other.stderr + other.stdout
