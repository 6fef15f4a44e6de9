"""Shared fixtures: the LeRobot-written Meta-World dataset and a small dataset written by loong."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from loong_core.testing import keep_cpu_precision_fp32

keep_cpu_precision_fp32()

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


def _reference_venv_tools():
    """``tools/build_lerobot_venv.py`` as a module (None outside a repository checkout)."""
    path = Path(__file__).resolve().parents[2] / "tools" / "build_lerobot_venv.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("_loong_build_lerobot_venv", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Located at import, before any fixture points $LOONG_CACHE at a session folder.
_VENV_TOOLS = _reference_venv_tools()
LEROBOT_VENV = _VENV_TOOLS.venv_dir() if _VENV_TOOLS else None
LEROBOT_DRIVERS = Path(__file__).resolve().parent / "lerobot_ref"


class LeRobotReference:
    """Runs a driver of ``lerobot_ref/`` with the LeRobot venv's python, offline, in a subprocess."""

    def __init__(self, venv: Path):
        self.python = _VENV_TOOLS.venv_python(venv)
        self.versions = _VENV_TOOLS.read_marker(venv)["versions"]

    def run(self, driver: str, out: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """``python lerobot_ref/<driver>.py OUT ARGS...``; fails the test with its stderr on a non-zero exit."""
        env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "LOONG_"))}
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(out / "hf-home"),
                   HF_LEROBOT_HOME=str(out / "lerobot-home"), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
                   WANDB_MODE="disabled")
        proc = subprocess.run([str(self.python), str(LEROBOT_DRIVERS / f"{driver}.py"), str(out), *args],
                              capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode:
            pytest.fail(f"LeRobot driver {driver} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        return proc

    def run_json(self, driver: str, out: Path, *args: str) -> dict:
        """:meth:`run` for a driver that prints one JSON object as its last line."""
        return json.loads(self.run(driver, out, *args).stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def lerobot_reference() -> LeRobotReference:
    """The LeRobot 0.4.4 reference venv; the test is skipped, saying how to build it, when it is absent."""
    if _VENV_TOOLS is None:
        pytest.skip("LeRobot reference venv: tools/build_lerobot_venv.py is not here (not a repository checkout)")
    if not _VENV_TOOLS.is_built(LEROBOT_VENV):
        pytest.skip(f"LeRobot reference venv absent ({LEROBOT_VENV}): run python tools/build_lerobot_venv.py "
                    f"(or point ${_VENV_TOOLS.VENV_ENV} at one)")
    return LeRobotReference(LEROBOT_VENV)


@pytest.fixture
def one_torch_thread():
    """Tiny policies in-process: one torch thread (extra threads only spin on a shared CPU; 25 steps
    of a tiny pi05 took 0.5 s instead of 30 s)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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
