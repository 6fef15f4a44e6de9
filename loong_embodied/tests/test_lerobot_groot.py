"""loong's ``groot`` action head against LeRobot 0.4.4's GR00T N1.5 head, weight for weight.

LeRobot runs in its own venv (``tools/build_lerobot_venv.py``), through the driver
``lerobot_ref/groot_head.py``; its weights are moved into loong's policy with
:func:`~loong_embodied.policies.groot.lerobot_adapter.head_from_lerobot`. Only the head is
compared: LeRobot's ``GrootPolicy`` cannot be built without downloading ``nvidia/GR00T-N1.5-3B``
(see ``docs/modalities/embodied.md``), so both heads read the same random backbone features.
"""

from __future__ import annotations

import json

import pytest
import torch

from loong_embodied.policies.common import flow
from loong_embodied.policies.groot.config import GrootConfig
from loong_embodied.policies.groot.lerobot_adapter import head_from_lerobot
from loong_embodied.policies.groot.model import GrootProvider

pytestmark = pytest.mark.lerobot

#: The reduced GR00T head both sides build (the driver reads the same dict).
SIZES = dict(seed=0, sample_seed=1, width=32, heads=2, layers=4, vl_layers=2, vl_heads=2, backbone_width=48,
             action_dim=2, chunk=4, max_seq_len=16, state_dim=5, embodiments=3, embodiment=1, steps=4,
             future_tokens=3, batch=3, tokens=7)


@pytest.fixture(scope="module")
def reference(lerobot_reference, tmp_path_factory):
    """``(head state dict, io tensors)`` written by LeRobot's head in its venv."""
    from safetensors.torch import load_file

    out = tmp_path_factory.mktemp("lerobot_groot")
    lerobot_reference.run("groot_head", out, json.dumps(SIZES))
    return load_file(out / "head.safetensors"), load_file(out / "io.safetensors")


@pytest.fixture(scope="module")
def loong_policy(reference):
    """loong's ``groot`` at the same sizes with LeRobot's head weights (its backbone stays random)."""
    s = SIZES
    config = GrootConfig(name="groot", state_dim=s["state_dim"], action_dim=s["action_dim"], chunk_size=s["chunk"],
                         image_size=[3, 16, 16], image_keys=["observation.image"], patch_size=8,
                         vision_hidden_size=16, vision_layers=1, vision_heads=2, vision_intermediate_size=32,
                         hidden_size=s["backbone_width"], num_layers=1, num_heads=4, num_kv_heads=2, head_dim=12,
                         intermediate_size=32, head_hidden_size=s["width"], head_layers=s["layers"],
                         head_heads=s["heads"], vl_layers=s["vl_layers"], vl_heads=s["vl_heads"],
                         future_tokens=s["future_tokens"], num_inference_steps=s["steps"], action_clip=None)
    provider = GrootProvider(config)
    model = provider.build_torch_model()
    missing, unexpected = model.load_state_dict(head_from_lerobot(reference[0], s["chunk"], s["embodiment"]),
                                                strict=False)
    assert not unexpected
    assert all(name.startswith(("vision.", "language.")) for name in missing), missing   # the whole head is set
    return provider, model


def test_every_head_weight_comes_from_lerobot_and_every_lerobot_weight_has_a_place(reference, loong_policy):
    _, model = loong_policy
    mapped = head_from_lerobot(reference[0], SIZES["chunk"], SIZES["embodiment"])
    head = {k for k in model.state_dict() if not k.startswith(("vision.", "language."))}
    assert set(mapped) == head


def test_training_loss_matches_lerobot_on_the_same_batch_noise_and_time(reference, loong_policy):
    _, io = reference
    provider, model = loong_policy
    model.train()
    t = 1.0 - io["tau"]                                  # GR00T's time runs the other way
    x_t, target = flow.interpolate(io["actions"], io["noise"], t)
    batch = {"observation.state": io["state"]}
    pred = model.velocity(batch, x_t, t, *model.condition(io["features"], torch.ones(io["features"].shape[:2],
                                                                                    dtype=torch.bool)))
    loss_sum, count, _ = flow.masked_flow_loss(pred, target, batch)
    loss = (loss_sum / count).detach()
    assert float(io["loss"]) > 0.1                        # a real loss, not a degenerate one
    assert abs(float(loss) - float(io["loss"])) <= 1e-5 * max(1.0, float(io["loss"])), (float(loss), float(io["loss"]))


def test_predicted_action_chunk_matches_lerobot(reference, loong_policy):
    _, io = reference
    _, model = loong_policy
    model.eval()
    generator = torch.Generator().manual_seed(SIZES["sample_seed"])
    assert torch.equal(torch.randn(io["initial_noise"].shape, generator=generator), io["initial_noise"])
    features = model.condition(io["features"], torch.ones(io["features"].shape[:2], dtype=torch.bool))
    chunk = model.sample_with({"observation.state": io["state"]}, *features,
                              generator=torch.Generator().manual_seed(SIZES["sample_seed"]))
    assert chunk.shape == io["action_chunk"].shape
    torch.testing.assert_close(chunk, io["action_chunk"], atol=1e-5, rtol=0)
