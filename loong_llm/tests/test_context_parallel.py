"""Context parallelism with loong's own attention follows the one-rank loss curve (same weights,
same data): CP2 and CP2 x TP2 with the distributed optimizer (llama), CP2 x TP2 (SP) with expert
parallelism and the load-balancing loss (qwen3_moe), CP2 x TP2 (SP) with MLA (deepseek_v3); a CP2
checkpoint resumes at CP1; a sequence length that
does not split into 2 x CP chunks is a ConfigError."""

from __future__ import annotations

import pytest

from loong_core.testing import assert_loss_curve, losses, read_metrics, run_train

STEPS = 5
LOGGING = ["trainer.log_interval=1", "trainer.eval_interval=0", "trainer.progress_bar=false",
           "trainer.tensorboard=false"]
CP2 = "parallel.context_parallel_size=2"


def _run_cp(overrides: list[str], nproc: int, layout: str):
    """Train under context parallelism; the banner must show the layout (CP=2, and DP=1: the
    ranks split sequences, they are not data-parallel replicas)."""
    proc = run_train(overrides, nproc=nproc)
    assert layout in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]


def _reference(root, base: list[str], init: bool):
    """``(overrides, one-rank losses)``: from a saved initial checkpoint when ``init`` (layouts
    that change how weights are initialised: TP, EP), else from the same seed."""
    common = [*base, *LOGGING, f"trainer.train_iters={STEPS}", "optim.lr_decay_iters=20"]
    if init:
        run_train([*base, *LOGGING, f"trainer.run_dir={root / 'init'}", "trainer.train_iters=1"])
        common.append(f"trainer.init_from={root / 'init' / 'checkpoints' / 'iter_0000001'}")
    run_train([*common, f"trainer.run_dir={root / 'ref'}"])
    ref = losses(root / "ref")
    assert ref[STEPS] < ref[1]  # the model learns over these steps: a frozen one could not pass
    return common, ref


@pytest.fixture(scope="module")
def llama(tmp_path_factory, tiny_curve):
    """The session's one-rank tiny curve from a saved initial checkpoint (what ``_reference``
    with ``init=True`` runs), shared with the parallel-equivalence tests."""
    common, ref = tiny_curve
    assert f"trainer.train_iters={STEPS}" in common and all(o in common for o in LOGGING)
    assert ref[STEPS] < ref[1]  # the model learns over these steps: a frozen one could not pass
    return common, ref, tmp_path_factory.mktemp("cp_llama")


@pytest.mark.multirank
def test_llama_cp2_follows_one_rank_and_resumes_at_cp1(llama, tiny):
    common, ref, root = llama
    cp2 = root / "cp2"
    _run_cp([*common, CP2, "trainer.save_interval=3", f"trainer.run_dir={cp2}"], 2,
            "TP=1 PP=1 VPP=1 CP=2 EP=1 DP=1")
    assert_loss_curve(losses(cp2), ref, range(1, STEPS + 1), "cp2")

    # The CP2 checkpoint (weights, optimizer, data position) resumes on one rank.
    cp1 = root / "cp1_from_cp2"
    resume = [o for o in common if not o.startswith("trainer.init_from=")]
    run_train([*resume, f"trainer.run_dir={cp1}",
               f"trainer.resume={cp2 / 'checkpoints' / 'iter_0000003'}"])
    assert_loss_curve(losses(cp1), ref, range(4, STEPS + 1), "cp1 from cp2")


@pytest.mark.multirank
def test_llama_cp2_tp2_with_distributed_optimizer(llama):
    common, ref, root = llama
    run_dir = root / "cp2_tp2"
    _run_cp([*common, "parallel=tp2", CP2, "parallel.use_distributed_optimizer=true",
             f"trainer.run_dir={run_dir}"], 4, "TP=2 PP=1 VPP=1 CP=2 EP=1 DP=1 SP=True dist-opt=True")
    assert_loss_curve(losses(run_dir), ref, range(1, STEPS + 1), "cp2 x tp2 (sp, distopt)")


@pytest.mark.multirank
def test_moe_cp2_tp2_with_expert_parallel(tmp_path):
    # The router's tokens are split over CP and TP (SP): the load-balancing loss's gradient must
    # still be the one-rank one (without the provider's correction it drifted 7e-5 in 5 steps).
    common, ref = _reference(tmp_path, ["experiment=qwen3_moe_debug"], init=True)
    _run_cp([*common, "parallel=tp2", CP2, "parallel.expert_model_parallel_size=2",
             f"trainer.run_dir={tmp_path / 'cp2_tp2_ep2'}"], 4, "TP=2 PP=1 VPP=1 CP=2 EP=2 DP=1 SP=True")
    assert_loss_curve(losses(tmp_path / "cp2_tp2_ep2"), ref, range(1, STEPS + 1), "qwen3_moe cp2 x tp2 x ep2")


@pytest.mark.multirank
def test_mla_cp2_tp2(family_curve, tmp_path):
    common, ref = family_curve("deepseek_v3")  # shared with test_mtp
    assert ref[STEPS] < ref[1]
    _run_cp([*common, "parallel=tp2", CP2, f"trainer.run_dir={tmp_path / 'cp2_tp2'}"], 4,
            "TP=2 PP=1 VPP=1 CP=2 EP=1 DP=1 SP=True")
    assert_loss_curve(losses(tmp_path / "cp2_tp2"), ref, range(1, STEPS + 1), "deepseek_v3 (MLA) cp2 x tp2")


def test_seq_length_that_does_not_split_is_a_config_error(tiny, tmp_path):
    proc = run_train([*tiny, CP2, "data.seq_length=250", f"trainer.run_dir={tmp_path / 'x'}"],
                     nproc=2, check=False)
    assert proc.returncode != 0
    assert ("'data.seq_length' = 250 must be a multiple of 2 x parallel.context_parallel_size = "
            "2 x 2 (4)") in proc.stderr + proc.stdout
    assert "the nearest valid length is 248" in proc.stderr + proc.stdout


@pytest.mark.multirank
def test_packed_documents_cp2(tmp_path):
    # Packed conversations: block-diagonal causal masks whose document boundaries fall anywhere in
    # the chunks. One rank's packed curve equals its unpacked logits (test_packing), so this ties
    # CP2 packed training to unpacked attention.
    base = ["experiment=llama_debug", "data=chatterbot", "model.num_layers=2"]
    common, ref = _reference(tmp_path, base, init=False)
    _run_cp([*common, CP2, f"trainer.run_dir={tmp_path / 'cp2'}"], 2, "CP=2 EP=1 DP=1")
    assert_loss_curve(losses(tmp_path / "cp2"), ref, range(1, STEPS + 1), "packed llama cp2")
    # tokens/s (and MFU) count every token the model processed, not only the assistant tokens
    # that carry the loss: 8 sequences x 128 tokens per step, once per replica (not per CP rank).
    for run in ("ref", "cp2"):
        for record in read_metrics(tmp_path / run):
            assert record["tokens_per_sec"] * record["step_time"] == pytest.approx(8 * 128, rel=1e-9), (run, record)
