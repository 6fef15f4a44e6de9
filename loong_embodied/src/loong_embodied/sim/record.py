"""Record Meta-World expert demonstrations into a LeRobot v3.0 dataset."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from loong_embodied.lerobot.writer import LeRobotWriter
from loong_embodied.sim.metaworld_env import ACTION_DIM, FPS, STATE_DIM, MetaWorldTask, instruction

logger = logging.getLogger(__name__)

IMAGE_KEY = "observation.image"


@dataclass
class RecordSummary:
    """What :func:`record_metaworld` wrote.

    Attributes:
        path: Dataset folder.
        episodes: Episodes saved.
        frames: Frames saved.
        failed: Expert attempts that did not succeed (discarded with ``only_success``).
        seconds: Wall time.
        per_task: Task -> episodes saved.
    """

    path: str
    episodes: int = 0
    frames: int = 0
    failed: int = 0
    seconds: float = 0.0
    per_task: dict = field(default_factory=dict)

    @property
    def frames_per_second(self) -> float:
        """Recorded frames per wall-clock second (simulation, rendering and encoding)."""
        return self.frames / self.seconds if self.seconds else 0.0


def record_metaworld(out_dir: str | Path, tasks: list[str], episodes: int, image_size: int = 64,
                     camera: str | None = "corner", seed: int = 0, max_steps: int | None = None,
                     only_success: bool = True, extra_steps: int = 0, max_attempts: int = 3,
                     video: bool = False) -> RecordSummary:
    """Roll out the scripted expert of each task and write every step as a frame.

    A frame is the camera image and 39-d state before the step, the 4-d expert action, and the
    instruction (``"push"``). An episode ends ``extra_steps`` steps after the first success, or
    at the task's step limit (or ``max_steps``).

    Args:
        out_dir: New dataset folder.
        tasks: Meta-World task names (``reach-v3``, ``push-v3``...).
        episodes: Episodes per task.
        image_size: Square image side; ignored when ``camera`` is None (state only).
        camera: Camera to record, or None for state-only datasets.
        seed: Base seed; episode ``k`` uses variation ``k`` and seed ``seed + k``.
        max_steps: Cap on steps per episode (None: the task's own limit, 500).
        only_success: Discard episodes in which the expert failed and try the next seed.
        extra_steps: Steps recorded after success (the policy learns to hold still).
        max_attempts: Attempts per saved episode before giving up on a task.
        video: Store the camera as an mp4 video feature (one file per episode, as LeRobot's hub
            datasets do; needs PyAV) instead of PNG images embedded in the parquet files.

    Returns:
        A :class:`RecordSummary`.
    """
    features = {
        "observation.state": {"dtype": "float32", "shape": [STATE_DIM], "names": None},
        "action": {"dtype": "float32", "shape": [ACTION_DIM], "names": None},
    }
    if camera:
        features = {IMAGE_KEY: {"dtype": "video" if video else "image", "shape": [image_size, image_size, 3],
                                "names": ["height", "width", "channel"]}, **features}
    writer = LeRobotWriter(out_dir, fps=FPS, features=features, robot_type="sawyer")
    summary = RecordSummary(path=str(out_dir))
    start = time.perf_counter()
    for task in tasks:
        env = MetaWorldTask(task, camera=camera, image_size=image_size, seed=seed)
        text, saved, attempt = instruction(task), 0, 0
        try:
            while saved < episodes:
                if attempt >= episodes * max_attempts:
                    raise RuntimeError(f"the '{task}' expert failed {summary.failed} times; giving up")
                frames, success = _rollout(env, attempt, seed + attempt, max_steps, extra_steps)
                attempt += 1
                if not success and only_success:
                    summary.failed += 1
                    logger.warning("%s: expert failed at seed %d, episode discarded", task, seed + attempt - 1)
                    continue
                for frame in frames:
                    writer.add_frame({**frame, "task": text})
                writer.save_episode()
                saved += 1
                summary.frames += len(frames)
                logger.info("%s: episode %d/%d, %d frames, success=%s", task, saved, episodes, len(frames), success)
        finally:
            env.close()
        summary.per_task[task] = saved
        summary.episodes += saved
    writer.finalize()
    summary.seconds = time.perf_counter() - start
    return summary


def _rollout(env: MetaWorldTask, variation: int, seed: int, max_steps: int | None,
             extra_steps: int) -> tuple[list[dict], bool]:
    state = env.reset(variation, seed)
    limit = min(env.max_steps, max_steps) if max_steps else env.max_steps
    frames, success, after = [], False, 0
    for _ in range(limit):
        action = env.expert_action(state)
        frame = {"observation.state": state, "action": action}
        if env.camera:
            frame[IMAGE_KEY] = env.render()
        frames.append(frame)
        state, _, done, truncated = env.step(action)
        success = success or done
        if success:
            after += 1
            if after > extra_steps:
                break
        if truncated:
            break
    return frames, success
