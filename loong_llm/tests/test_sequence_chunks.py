"""``parallel.sequence_chunks=K`` trains like the unchunked run: same losses and gradient norms
(fp32, within 1e-5) for 3 steps of llama_debug from one seed: K=4 with full recompute on one rank
(4 layers), and K=2 without recompute under context parallelism (CP2, two gloo ranks) on packed
chat data (documents across chunk boundaries, assistant-only loss)."""

from __future__ import annotations

import pytest

from loong_core.testing import read_metrics, run_train

STEPS = 3
RECOMPUTE = ["parallel.recompute_granularity=full", "parallel.recompute_method=uniform",
             "parallel.recompute_num_layers=1"]


def _curve(run_dir) -> dict[int, tuple[float, float]]:
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in read_metrics(run_dir)}


def _assert_same(got, ref, label: str) -> None:
    assert sorted(got) == list(range(1, STEPS + 1)), (label, got)
    worst = max(max(abs(got[s][0] - ref[s][0]), abs(got[s][1] - ref[s][1]) / ref[s][1]) for s in ref)
    print(f"{label}: max |loss diff| or relative grad-norm diff over {STEPS} steps = {worst:.2e}")
    for step in ref:
        assert abs(got[step][0] - ref[step][0]) <= 1e-5, (label, step, got, ref)
        assert abs(got[step][1] - ref[step][1]) <= 1e-5 * ref[step][1], (label, step, got, ref)


def _unchunked(root, base: list[str]):
    common = [*base, f"trainer.train_iters={STEPS}", "trainer.save_at_end=false"]
    run_train([*common, f"trainer.run_dir={root / 'ref'}"])
    ref = _curve(root / "ref")
    assert ref[STEPS][0] < ref[1][0]  # it learns: a frozen model could not pass
    return common, ref, root


@pytest.fixture(scope="module")
def unchunked(tmp_path_factory, tiny):
    return _unchunked(tmp_path_factory.mktemp("sequence_chunks"), list(tiny))


def test_four_chunks_with_full_recompute_equal_unchunked(unchunked):
    common, ref, root = unchunked
    run_dir = root / "k4_rc"
    proc = run_train([*common, "parallel.sequence_chunks=4", *RECOMPUTE, f"trainer.run_dir={run_dir}"])
    assert "dist-opt=False sequence-chunks=4" in proc.stdout + proc.stderr  # the banner says so
    _assert_same(_curve(run_dir), ref, "K=4 + recompute")


@pytest.mark.multirank
def test_two_chunks_of_packed_documents_under_context_parallelism_equal_one_rank(tmp_path, tiny):
    """Without recompute (the one-rank test has it): each global chunk over CP2's layout."""
    base = [*tiny, "data=chatterbot", "model.num_layers=2"]
    common, ref, root = _unchunked(tmp_path, base)
    run_dir = root / "cp2_k2"
    run_train([*common, "parallel.context_parallel_size=2", "parallel.sequence_chunks=2",
               f"trainer.run_dir={run_dir}"], nproc=2)
    _assert_same(_curve(run_dir), ref, "packed, CP2 x K=2")


def test_sequence_length_that_does_not_split_is_a_config_error():
    from loong_core.config.compose import load_config
    from loong_core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"'data.seq_length' = 250 .* nearest valid length is 248"):
        load_config(["experiment=llama_debug", "data.seq_length=250", "parallel.sequence_chunks=4"])
    with pytest.raises(ConfigError, match="pipeline parallelism"):
        load_config(["experiment=llama_debug", "parallel=tp2_pp2", "parallel.sequence_chunks=2"])
