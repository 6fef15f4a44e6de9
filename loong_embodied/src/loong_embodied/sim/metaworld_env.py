"""Meta-World tasks with camera rendering on the CPU (MuJoCo through EGL or OSMesa).

``metaworld`` and ``mujoco`` are optional (``pip install 'loong-embodied[sim]'``). ``MUJOCO_GL``
must be chosen before MuJoCo is first imported: :func:`make_env` sets it to ``egl`` unless the
environment already names one (``MUJOCO_GL=osmesa`` where EGL is missing).
"""

from __future__ import annotations

import logging
import os

import numpy as np

from loong_core.errors import ConfigError, MissingDependencyError

logger = logging.getLogger(__name__)

STATE_DIM, ACTION_DIM = 39, 4
# Meta-World steps the simulation 5 x 2.5 ms per action: 80 control steps per second.
FPS = 80


def _metaworld():
    os.environ.setdefault("MUJOCO_GL", "egl")
    try:
        import metaworld
        import metaworld.policies
    except ImportError:
        raise MissingDependencyError("metaworld", "loong-embodied[sim]", "Meta-World simulation") from None
    return metaworld


def task_names() -> list[str]:
    """Every Meta-World v3 task that has a scripted expert policy."""
    return sorted(_metaworld().policies.ENV_POLICY_MAP)


def instruction(task: str) -> str:
    """The language instruction of a task: ``"button-press-topdown-v3"`` -> ``"button press topdown"``."""
    name = task[: -len("-v3")] if task.endswith("-v3") else task
    return name.replace("-", " ")


class MetaWorldTask:
    """One Meta-World task with its scripted expert and an optional camera.

    Args:
        task: Task name (``reach-v3``...).
        camera: MuJoCo camera (``corner``, ``corner2``, ``topview``...); None renders nothing.
        image_size: Square image side in pixels.
        seed: Seed of the task variations (object and goal positions).
        flip: Flip images vertically (``auto``: for the ``corner*`` cameras, whose images come
            out upside down).
    """

    def __init__(self, task: str, camera: str | None = "corner", image_size: int = 64, seed: int = 0,
                 flip: bool | str = "auto"):
        metaworld = _metaworld()
        policies = metaworld.policies.ENV_POLICY_MAP
        if task not in policies:
            import difflib

            close = difflib.get_close_matches(task, list(policies), n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"Unknown Meta-World task '{task}'.{hint} Tasks: {', '.join(sorted(policies))}")
        self.task, self.camera = task, camera
        self.flip = camera is not None and (camera.startswith("corner") if flip == "auto" else bool(flip))
        self.benchmark = metaworld.MT1(task, seed=seed)
        kwargs = {"render_mode": "rgb_array", "camera_name": camera, "width": image_size,
                  "height": image_size} if camera else {}
        self.env = self.benchmark.train_classes[task](**kwargs)
        self.policy = policies[task]()
        self.max_steps = int(self.env.max_path_length)
        self._viewer_ready = False

    def reset(self, variation: int, seed: int) -> np.ndarray:
        """Start an episode in task variation ``variation``; returns the 39-d state."""
        tasks = self.benchmark.train_tasks
        self.env.set_task(tasks[variation % len(tasks)])
        obs, _ = self.env.reset(seed=seed)
        return np.asarray(obs, dtype=np.float32)

    def expert_action(self, state: np.ndarray) -> np.ndarray:
        """The scripted expert's action for ``state``, clipped to the action space [-1, 1]."""
        return np.clip(self.policy.get_action(state), -1.0, 1.0).astype(np.float32)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool]:
        """Apply an action; returns ``(state, reward, success, truncated)``."""
        obs, reward, _, truncated, info = self.env.step(action)
        return np.asarray(obs, dtype=np.float32), float(reward), bool(info.get("success", 0.0)), bool(truncated)

    def render(self) -> np.ndarray:
        """The camera image ``[H, W, 3]`` uint8 (shadows and reflections off: 2-3x faster on CPU)."""
        if not self._viewer_ready:
            self._configure_viewer()
        image = self.env.render()
        if image is None:
            raise RuntimeError(f"Meta-World returned no image for camera '{self.camera}'")
        return np.ascontiguousarray(image[::-1] if self.flip else image)

    def _configure_viewer(self) -> None:
        import mujoco

        try:
            self.env.render()
        except Exception as exc:  # noqa: BLE001 - GL back ends fail with many exception types
            raise RuntimeError(
                f"MuJoCo could not render with MUJOCO_GL={os.environ.get('MUJOCO_GL')}: {exc}. Fix: install "
                "EGL (apt-get install libegl1) or run with MUJOCO_GL=osmesa (apt-get install libosmesa6), "
                "or record without images (--state-only).") from exc
        viewer = self.env.mujoco_renderer._get_viewer("rgb_array")
        viewer.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        viewer.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        self._viewer_ready = True

    def close(self) -> None:
        """Free the simulator and its GL context."""
        self.env.close()
