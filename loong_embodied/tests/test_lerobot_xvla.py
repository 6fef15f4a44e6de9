"""loong's ``xvla`` head against LeRobot 0.4.4's ``xvla`` policy, weight for weight.

LeRobot runs in its own venv (``tools/build_lerobot_venv.py``), through the driver
``lerobot_ref/xvla_policy.py``, which builds the whole ``XVLAPolicy`` offline at a reduced size;
its transformer's weights are moved into loong's policy with
:func:`~loong_embodied.policies.xvla.lerobot_adapter.head_from_lerobot`. The Florence-2 backbone
is not loong's (SigLIP + decoder), so both sides read the same random VLM and auxiliary view tokens
(LeRobot's ``forward_vlm`` is replaced by them); everything after it is compared: state and
action padding, per-sample domains, time embedding, soft prompts, transformer, the loss of the
``auto`` action space and the sampler.
"""

from __future__ import annotations

import json

import pytest
import torch

from loong_embodied.policies.common import flow
from loong_embodied.policies.xvla.config import XVLAConfig
from loong_embodied.policies.xvla.lerobot_adapter import head_from_lerobot
from loong_embodied.policies.xvla.model import XVLAProvider, pad_last

pytestmark = pytest.mark.lerobot

#: The reduced X-VLA both sides build (the driver reads the same dict); domains differ per sample.
SIZES = dict(seed=0, sample_seed=1, width=32, heads=2, layers=3, domains=3, soft_prompts=4, time_dim=16,
             max_seq_len=64, max_state_dim=8, max_action_dim=6, chunk=4, steps=4, state_dim=5, action_dim=3,
             batch=3, tokens=7, aux_tokens=5, domain_ids=[1, 0, 2])


@pytest.fixture(scope="module", params=[False, True], ids=["shared_projection", "hetero_projection"])
def reference(request, lerobot_reference, tmp_path_factory):
    """``(sizes, policy state dict, io tensors)`` written by LeRobot's ``XVLAPolicy`` in its venv."""
    from safetensors.torch import load_file

    sizes = {**SIZES, "hetero": request.param}
    out = tmp_path_factory.mktemp("lerobot_xvla")
    lerobot_reference.run("xvla_policy", out, json.dumps(sizes))
    return sizes, load_file(out / "policy.safetensors"), load_file(out / "io.safetensors")


@pytest.fixture(scope="module")
def loong_policy(reference):
    """loong's ``xvla`` at the same sizes with LeRobot's transformer weights (its backbone stays random)."""
    s, state, _ = reference
    config = XVLAConfig(name="xvla", state_dim=s["state_dim"], action_dim=s["action_dim"], chunk_size=s["chunk"],
                        image_size=[3, 16, 16], image_keys=["observation.image"], patch_size=8,
                        vision_hidden_size=16, vision_layers=1, vision_heads=2, vision_intermediate_size=32,
                        hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=32,
                        max_text_tokens=8, head_hidden_size=s["width"], head_layers=s["layers"],
                        head_heads=s["heads"], num_domains=s["domains"], soft_prompt_len=s["soft_prompts"],
                        time_embedding_dim=s["time_dim"], max_seq_len=s["max_seq_len"],
                        max_state_dim=s["max_state_dim"], max_action_dim=s["max_action_dim"],
                        hetero_projection=s["hetero"], num_inference_steps=s["steps"], dropout=0.0,
                        action_clip=None)
    provider = XVLAProvider(config)
    model = provider.build_torch_model()
    missing, unexpected = model.load_state_dict(head_from_lerobot(state), strict=False)
    assert not unexpected
    assert all(name.startswith(("vision.", "language.")) for name in missing), missing   # the whole head is set
    return provider, model


def _batch(io: dict) -> dict:
    return {"observation.state": io["state"], "domain_id": io["domain_id"]}


def test_every_head_weight_comes_from_lerobot_and_every_transformer_weight_has_a_place(reference, loong_policy):
    _, state, _ = reference
    _, model = loong_policy
    head = {k for k in model.state_dict() if not k.startswith(("vision.", "language."))}
    assert set(head_from_lerobot(state)) == head
    transformer = [k for k in state if k.startswith("model.transformer.")]
    assert sum(v.numel() for k, v in head_from_lerobot(state).items()) == sum(state[k].numel() for k in transformer)


def test_training_loss_matches_lerobot_on_the_same_batch_noise_and_time(reference, loong_policy):
    s, _, io = reference
    _, model = loong_policy
    model.train()
    expected_t = (io["u"] + torch.arange(s["batch"]) / s["batch"]) % (1 - 1e-5)   # X-VLA's stratified time
    torch.testing.assert_close(io["t"], expected_t, atol=0, rtol=0)
    actions = io["actions"]
    x_t, _ = flow.interpolate(pad_last(actions, s["max_action_dim"]), io["noise"], io["t"])
    pred = model.predict(_batch(io), x_t, io["t"], io["features"], io["aux"])
    loss_sum, count, _ = flow.masked_flow_loss(pred[..., : s["action_dim"]], actions, _batch(io))
    loss = float((loss_sum / count).detach())
    assert float(io["loss"]) > 0.1                        # a real loss, not a degenerate one
    assert abs(loss - float(io["loss"])) <= 1e-5 * max(1.0, float(io["loss"])), (loss, float(io["loss"]))


def test_predicted_action_chunk_matches_lerobot(reference, loong_policy):
    s, _, io = reference
    _, model = loong_policy
    model.eval()
    generator = torch.Generator().manual_seed(s["sample_seed"])
    assert torch.equal(torch.randn(io["initial_noise"].shape, generator=generator), io["initial_noise"])
    chunk = model.sample_with(_batch(io), io["features"], io["aux"],
                              generator=torch.Generator().manual_seed(s["sample_seed"]))
    assert chunk.shape == io["action_chunk"].shape == (s["batch"], s["chunk"], s["action_dim"])
    torch.testing.assert_close(chunk, io["action_chunk"], atol=1e-5, rtol=0)
