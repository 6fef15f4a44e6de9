"""Which of LeRobot 0.4.4's VLA policies build offline, from a config alone (no hub download)?

The answers the docs give ("Checked against LeRobot" in ``docs/modalities/embodied.md``), checked
in the reference venv by ``lerobot_ref/offline_build.py`` with ``HF_HUB_OFFLINE=1`` and an empty
Hugging Face cache: a new LeRobot or transformers that changes them fails here.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.lerobot


@pytest.fixture(scope="module")
def built(lerobot_reference, tmp_path_factory) -> dict:
    return lerobot_reference.run_json("offline_build", tmp_path_factory.mktemp("offline_build"))


def test_xvla_builds_offline_at_a_reduced_size_from_an_explicit_florence_config(built):
    assert built["xvla"]["built"] and built["xvla"]["parameters"] < 5_000_000, built["xvla"]


def test_pi05_needs_lerobots_transformers_fork_which_pypi_does_not_have(built):
    assert not built["pi05"]["built"]
    assert built["pi05"]["error"].startswith("ValueError: An incorrect transformer version is used")


@pytest.mark.parametrize("policy", ["smolvla", "groot"])
def test_smolvla_and_groot_read_the_hub_even_without_pretrained_weights(built, policy):
    assert not built[policy]["built"]
    assert any(word in built[policy]["error"] for word in ("huggingface.co", "HF_HUB_OFFLINE")), built[policy]
