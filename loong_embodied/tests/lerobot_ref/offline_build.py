"""Driver run by the LeRobot venv's python: which LeRobot 0.4.4 VLA policies build offline from a config?

    python offline_build.py OUT_DIR

Builds ``pi05``, ``smolvla``, ``groot`` and ``xvla`` at reduced sizes with ``HF_HUB_OFFLINE=1`` (the
caller sets it, and an empty ``HF_HOME``), without pretrained weights, and prints one JSON object:
policy -> ``{"built": bool, "parameters": int}`` or ``{"built": false, "error": "Type: message"}``.
"""

from __future__ import annotations

import json
import sys

import torch
from lerobot.configs.types import FeatureType, PolicyFeature


def _features(config):
    config.input_features = {"observation.state": PolicyFeature(FeatureType.STATE, (5,)),
                             "observation.images.cam": PolicyFeature(FeatureType.VISUAL, (3, 32, 32))}
    config.output_features = {"action": PolicyFeature(FeatureType.ACTION, (2,))}
    return config


def pi05():
    from lerobot.policies.pi05.configuration_pi05 import PI05Config
    from lerobot.policies.pi05.modeling_pi05 import PI05Policy

    # The smallest variants it accepts; the Gemma widths are fixed by name ("gemma_300m" / "gemma_2b").
    return PI05Policy(_features(PI05Config(paligemma_variant="gemma_300m", action_expert_variant="gemma_300m",
                                           image_resolution=(32, 32), device="cpu")))


def smolvla():
    from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    return SmolVLAPolicy(_features(SmolVLAConfig(load_vlm_weights=False, num_vlm_layers=1, device="cpu")))


def groot():
    from lerobot.policies.groot.configuration_groot import GrootConfig
    from lerobot.policies.groot.modeling_groot import GrootPolicy

    return GrootPolicy(_features(GrootConfig(device="cpu")))


def xvla():
    from lerobot.policies.xvla.configuration_xvla import XVLAConfig
    from lerobot.policies.xvla.modeling_xvla import XVLAPolicy

    florence = {"vision_config": {"dim_embed": [16, 16, 16, 16], "num_heads": [1, 1, 1, 1], "num_groups": [1, 1, 1, 1],
                                  "depths": [1, 1, 1, 1], "projection_dim": 32, "window_size": 2},
                "text_config": {"d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
                                "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64},
                "projection_dim": 32}
    return XVLAPolicy(_features(XVLAConfig(florence_config=florence, hidden_size=32, depth=1, num_heads=2,
                                           chunk_size=4, n_action_steps=4, device="cpu")))


def main() -> None:
    torch.manual_seed(0)
    result = {}
    for name, build in (("pi05", pi05), ("smolvla", smolvla), ("groot", groot), ("xvla", xvla)):
        try:
            policy = build()
            result[name] = {"built": True, "parameters": sum(p.numel() for p in policy.parameters())}
        except Exception as exc:   # the point: record why it does not build
            result[name] = {"built": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        print(f"{name}: {result[name]}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
