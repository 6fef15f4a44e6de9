"""loong's ``groot`` action head against LeRobot 0.4.4's GR00T head, weight for weight.

LeRobot runs in its own venv (``tools/build_lerobot_venv.py``), through the driver
``lerobot_ref/groot_head.py``; its weights are moved into loong's policy with
:func:`~loong_embodied.policies.groot.lerobot_adapter.head_from_lerobot`. Only the head is
compared: LeRobot's ``GrootPolicy`` cannot be built without downloading ``nvidia/GR00T-N1.5-3B``
(see ``docs/modalities/embodied.md``), so both heads read the same random backbone features.

Two layouts, each on a batch whose samples belong to different embodiments (GR00T's
per-embodiment state encoder, action encoder and decoder):

- ``n15``: LeRobot's ``FlowmatchingActionHead`` as it is (GR00T N1.5).
- ``n16``: GR00T N1.6's head, which LeRobot 0.4.4 does not ship, built from LeRobot's N1.5 head
  as Isaac-GR00T describes N1.6: no VL self-attention blocks, no future tokens, and the DiT's
  cross-attention blocks alternating between the text and the image tokens (the driver's
  ``alternate_text_and_images`` hands each LeRobot cross-attention block only its tokens).
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

#: The reduced GR00T heads both sides build (the driver reads the same dict).
N15 = dict(seed=0, sample_seed=1, width=32, heads=2, layers=4, vl_layers=2, vl_heads=2, backbone_width=48,
           action_dim=2, chunk=4, max_seq_len=16, state_dim=5, embodiments=3, embodiment_ids=[1, 0, 2, 1], steps=4,
           future_tokens=3, batch=4, tokens=7)
#: N1.6: the first 3 of the 7 backbone tokens are the image's; 6 DiT blocks: text, self, image, self, text, self.
N16 = {**N15, "vl_layers": 0, "future_tokens": 0, "layers": 6, "attend_text_every": 2, "image_tokens": 3}
LAYOUTS = {"n15": N15, "n16": N16}


def loong_config(s: dict, num_embodiments: int) -> GrootConfig:
    """loong's ``groot`` at the sizes of ``s`` (its tiny backbone stays random: it is not compared)."""
    return GrootConfig(name="groot", state_dim=s["state_dim"], action_dim=s["action_dim"], chunk_size=s["chunk"],
                       image_size=[3, 16, 16], image_keys=["observation.image"], patch_size=8,
                       vision_hidden_size=16, vision_layers=1, vision_heads=2, vision_intermediate_size=32,
                       hidden_size=s["backbone_width"], num_layers=1, num_heads=4, num_kv_heads=2, head_dim=12,
                       intermediate_size=32, head_hidden_size=s["width"], head_layers=s["layers"],
                       head_heads=s["heads"], vl_layers=s["vl_layers"], vl_heads=s["vl_heads"],
                       future_tokens=s["future_tokens"], num_inference_steps=s["steps"], action_clip=None,
                       num_embodiments=num_embodiments, attend_text_every=s.get("attend_text_every", 0))


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout(request, lerobot_reference, tmp_path_factory):
    """``(sizes, head state dict, io tensors)`` written by LeRobot's head in its venv."""
    from safetensors.torch import load_file

    s = LAYOUTS[request.param]
    out = tmp_path_factory.mktemp(f"lerobot_groot_{request.param}")
    lerobot_reference.run("groot_head", out, json.dumps(s))
    return s, load_file(out / "head.safetensors"), load_file(out / "io.safetensors")


def _policy(s: dict, state: dict, embodiments: list[int] | None = None):
    """loong's policy with LeRobot's head weights (all embodiments, or the ``embodiments`` chosen)."""
    count = s["embodiments"] if embodiments is None else len(embodiments)
    model = GrootProvider(loong_config(s, count)).build_torch_model()
    missing, unexpected = model.load_state_dict(head_from_lerobot(state, s["chunk"], embodiments), strict=False)
    assert not unexpected
    assert all(name.startswith(("vision.", "language.")) for name in missing), missing   # the whole head is set
    return model


def _condition(model, s: dict, io: dict):
    """The head's view of the fixed features: all valid, the first ``image_tokens`` are the image's."""
    features = io["features"]
    image = torch.zeros(features.shape[:2], dtype=torch.bool)
    image[:, :s.get("image_tokens", 0)] = True
    return model.condition(features, torch.ones(features.shape[:2], dtype=torch.bool), image)


def _loss(model, s: dict, io: dict, batch: dict) -> float:
    t = 1.0 - io["tau"]                                  # GR00T's time runs the other way
    x_t, target = flow.interpolate(io["actions"], io["noise"], t)
    pred = model.velocity(batch, x_t, t, *_condition(model, s, io))
    loss_sum, count, _ = flow.masked_flow_loss(pred, target, batch)
    return float(loss_sum / count)


def test_every_head_weight_comes_from_lerobot_and_every_lerobot_weight_has_a_place(layout):
    s, state, _ = layout
    model = _policy(s, state)
    head = {k for k in model.state_dict() if not k.startswith(("vision.", "language."))}
    assert set(head_from_lerobot(state, s["chunk"])) == head


def test_training_loss_matches_lerobot_on_a_batch_of_mixed_embodiments(layout):
    s, state, io = layout
    assert len(set(io["embodiment_id"].tolist())) == 3           # every embodiment's weights are exercised
    model = _policy(s, state).train()
    with torch.no_grad():
        loss = _loss(model, s, io, {"observation.state": io["state"], "embodiment_id": io["embodiment_id"]})
    assert float(io["loss"]) > 0.1                                # a real loss, not a degenerate one
    assert abs(loss - float(io["loss"])) <= 1e-5 * max(1.0, float(io["loss"])), (loss, float(io["loss"]))
    with torch.no_grad():                                         # the ids matter: all on embodiment 0 differs
        zeros = torch.zeros_like(io["embodiment_id"])
        same = _loss(model, s, io, {"observation.state": io["state"], "embodiment_id": zeros})
    assert abs(same - loss) > 1e-3


def test_predicted_action_chunk_matches_lerobot(layout):
    s, state, io = layout
    model = _policy(s, state).eval()
    generator = torch.Generator().manual_seed(s["sample_seed"])
    assert torch.equal(torch.randn(io["initial_noise"].shape, generator=generator), io["initial_noise"])
    chunk = model.sample_with({"observation.state": io["state"], "embodiment_id": io["embodiment_id"]},
                              *_condition(model, s, io), generator=torch.Generator().manual_seed(s["sample_seed"]))
    assert chunk.shape == io["action_chunk"].shape
    torch.testing.assert_close(chunk, io["action_chunk"], atol=1e-5, rtol=0)


def test_a_policy_for_one_robot_takes_that_embodiments_weights(layout):
    """``head_from_lerobot(..., embodiments=[2])``: a one-embodiment policy that computes what the
    three-embodiment one computes for embodiment 2."""
    s, state, io = layout
    full, single = _policy(s, state).eval(), _policy(s, state, embodiments=[2]).eval()
    ids = torch.full_like(io["embodiment_id"], 2)
    with torch.no_grad():
        expected = _loss(full, s, io, {"observation.state": io["state"], "embodiment_id": ids})
        got = _loss(single, s, io, {"observation.state": io["state"]})
    assert got == pytest.approx(expected, abs=1e-6)
