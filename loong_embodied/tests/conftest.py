"""Shared fixtures: the LeRobot-written Meta-World dataset and a small dataset written by loong."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

#: Test data shipped with the repository (``tests/data/README.md`` says where it came from);
#: ``$LOONG_SHARED_DATA`` points at another copy of the folder instead.
TEST_DATA = Path(os.environ.get("LOONG_SHARED_DATA", Path(__file__).resolve().parent / "data"))
METAWORLD_V3 = TEST_DATA / "lerobot_metaworld_v3"

FEATURES = {
    "observation.image": {"dtype": "image", "shape": [16, 16, 3], "names": ["height", "width", "channel"]},
    "observation.state": {"dtype": "float32", "shape": [5], "names": None},
    "action": {"dtype": "float32", "shape": [2], "names": None},
}
EPISODES = [(7, "reach"), (4, "push"), (5, "reach")]


@pytest.fixture(scope="session")
def lerobot_metaworld() -> Path:
    """The dataset LeRobot 0.4.4 wrote (12 Meta-World episodes, 4 MB), shipped in tests/data."""
    if not (METAWORLD_V3 / "meta" / "info.json").is_file():
        pytest.fail(f"{METAWORLD_V3} is missing: it ships with the repository (tests/data); restore "
                    "it from git or point LOONG_SHARED_DATA at a folder holding lerobot_metaworld_v3/")
    return METAWORLD_V3


def make_frames(seed: int = 0) -> list[list[dict]]:
    """Random frames of EPISODES (episode -> frames), deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    return [[{"observation.image": rng.integers(0, 256, (16, 16, 3), dtype=np.uint8),
              "observation.state": rng.normal(size=5).astype(np.float32),
              "action": rng.normal(size=2).astype(np.float32), "task": task} for _ in range(n)]
            for n, task in EPISODES]


def write_dataset(root: Path, episodes: list[list[dict]], features: dict = FEATURES, fps: int = 10) -> Path:
    """Write ``episodes`` with loong's LeRobot writer."""
    from loong_embodied.lerobot.writer import LeRobotWriter

    writer = LeRobotWriter(root, fps=fps, features=features, robot_type="test")
    for frames in episodes:
        for frame in frames:
            writer.add_frame(frame)
        writer.save_episode()
    return writer.finalize()


@pytest.fixture(scope="session")
def written(tmp_path_factory) -> tuple[Path, list[list[dict]]]:
    """A 3-episode, 16-frame dataset written by loong, and the frames that went in."""
    episodes = make_frames()
    return write_dataset(tmp_path_factory.mktemp("lerobot") / "ds", episodes), episodes
