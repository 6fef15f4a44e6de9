"""Multi-token prediction (``model.mtp_num_layers``, DeepSeek-V3 / GLM-4.5): it trains, adds its
loss to the gradient without changing the LM loss, logs ``mtp_loss``, follows the one-rank curve
under TP2 with sequence parallelism and under EP2, is refused where loong has not verified it,
and is switched on from an HF directory only when the checkpoint stores MTP weights.

Logits and the MTP loss against transformers' modules, and the HF round trip of the MTP layers,
are in ``test_hf_parity.py`` and ``test_hf_convert.py``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from loong_core.config.compose import load_config
from loong_core.errors import ConfigError
from loong_core.testing import assert_loss_curve, losses, read_metrics, run_train
from loong_llm.hf.testing import write_hf_model

STEPS = 5
MTP = ("model.mtp_num_layers=1",)


def mtp_losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["mtp_loss"] for r in read_metrics(run_dir)}


def _ref_dir(common: list[str]) -> Path:
    """The reference run of a ``family_curve``: beside its ``init`` run."""
    init = next(o for o in common if o.startswith("trainer.init_from=")).split("=", 1)[1]
    return Path(init).parents[2] / "ref"


def test_mtp_trains_logs_its_loss_and_leaves_the_lm_loss_alone(family_curve):
    common, ref = family_curve("deepseek_v3", *MTP)
    _, plain = family_curve("deepseek_v3")
    mtp = mtp_losses(_ref_dir(common))
    assert sorted(mtp) == list(range(1, STEPS + 1))
    assert all(math.isfinite(v) and v > 0 for v in mtp.values())
    assert mtp[STEPS] < mtp[1] and ref[STEPS] < ref[1]  # both objectives learn
    # the same initial weights of the main model (MTP layers are initialised after them) give the
    # same first LM loss; from the first update on, the MTP gradient changes the curve
    assert ref[1] == pytest.approx(plain[1], abs=1e-6)
    assert any(abs(ref[s] - plain[s]) > 1e-6 for s in range(2, STEPS + 1))


@pytest.mark.multirank
@pytest.mark.parametrize("layout,overrides", [
    ("tp2_sp", ["parallel=tp2"]), ("ep2", ["parallel.expert_model_parallel_size=2"])])
def test_mtp_follows_the_one_rank_curve(family_curve, tmp_path, layout, overrides):
    common, ref = family_curve("glm4_moe", *MTP)
    ref_mtp = mtp_losses(_ref_dir(common))
    run_train([*common, *overrides, f"trainer.run_dir={tmp_path}"], nproc=2)
    assert_loss_curve(losses(tmp_path), ref, range(1, STEPS + 1), f"glm4_moe+mtp {layout}")
    assert_loss_curve(mtp_losses(tmp_path), ref_mtp, range(1, STEPS + 1), f"mtp_loss {layout}")


@pytest.mark.parametrize("override,names", [
    ("parallel.pipeline_model_parallel_size=2", "parallel.pipeline_model_parallel_size = 2"),
    ("parallel.context_parallel_size=2", "parallel.context_parallel_size = 2"),
    ("parallel.sequence_chunks=2", "parallel.sequence_chunks = 2"),
    ("parallel.engine=torch", "needs parallel.engine=megatron")])
def test_unverified_layouts_are_config_errors(override, names):
    with pytest.raises(ConfigError, match=r"'model.mtp_num_layers' = 1 .*" + names.replace(".", r"\.")):
        load_config(["experiment=deepseek_v3_debug", *MTP, override])


def test_mtp_from_hf_only_when_the_checkpoint_stores_its_layers(tmp_path):
    from loong_llm.families.common.hf_adapter import mtp_layers_from_hf
    from loong_llm.families.deepseek_v3.config import DeepSeekV3Config
    from loong_llm.hf.adapter import read_hf_config
    from loong_llm.hf.testing import add_mtp_layers

    src = write_hf_model("deepseek_v3", tmp_path / "plain")
    hf = read_hf_config(src)
    assert hf["num_nextn_predict_layers"] == 1  # listed, as published configs do, but not stored
    cfg = DeepSeekV3Config(name="deepseek_v3")
    assert mtp_layers_from_hf(cfg, hf, src) is None
    cfg.mtp_num_layers = 1
    with pytest.raises(ConfigError, match=r"'model.mtp_num_layers' = 1 but .* holds the weights "
                       r"of 0 MTP layer\(s\).*set model.mtp_num_layers=null"):
        mtp_layers_from_hf(cfg, hf, src)
    add_mtp_layers(src, 1)
    assert mtp_layers_from_hf(DeepSeekV3Config(name="deepseek_v3"), read_hf_config(src), src) == 1


def test_checkpoint_mtp_layers_are_left_out_under_an_unverified_layout(tmp_path, caplog):
    from loong_llm.families.deepseek_v3.config import DeepSeekV3Config
    from loong_llm.families.deepseek_v3.model import DeepSeekV3Provider
    from loong_llm.hf.testing import add_mtp_layers

    src = add_mtp_layers(write_hf_model("deepseek_v3", tmp_path / "src"), 1)
    on = DeepSeekV3Provider(DeepSeekV3Config(name="deepseek_v3", init_from_hf=str(src)))
    assert on.config.mtp_num_layers == 1 and "mtp_loss" in on.reported_metrics
    assert on.mtp_kwargs({"pipeline_model_parallel_size": 1})["mtp_num_layers"] == 1
    # a published checkpoint under PP (a config asking for MTP there is refused when it loads)
    off = DeepSeekV3Provider(DeepSeekV3Config(name="deepseek_v3", init_from_hf=str(src)))
    with caplog.at_level("WARNING"):
        assert off.mtp_kwargs({"pipeline_model_parallel_size": 2}) == {}
    assert "MTP layer(s)" in caplog.text and "parallel.pipeline_model_parallel_size = 2" in caplog.text
    assert off.config.mtp_num_layers is None and "mtp_loss" not in off.reported_metrics
