"""Closed-loop rollouts of a trained policy in Meta-World: success rate per task."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

GIF_SIZE = 128


@dataclass
class TaskResult:
    """Outcome of the episodes of one task.

    Attributes:
        task: Meta-World task name.
        episodes: Episodes run.
        successes: Episodes in which the task succeeded before the step limit.
        steps: Steps of each episode (up to the first success).
    """

    task: str
    episodes: int = 0
    successes: int = 0
    steps: list[int] = field(default_factory=list)

    @property
    def success_rate(self) -> float:
        """Successes / episodes (0 without episodes)."""
        return self.successes / self.episodes if self.episodes else 0.0

    def as_dict(self) -> dict:
        """JSON-ready summary."""
        return {"task": self.task, "episodes": self.episodes, "successes": self.successes,
                "success_rate": round(self.success_rate, 4),
                "mean_steps": round(float(np.mean(self.steps)), 1) if self.steps else 0.0}


def rollout_metaworld(policy, tasks: list[str], episodes: int, seed: int = 1000, max_steps: int | None = None,
                      gif: str | Path | None = None, camera: str = "corner") -> list[TaskResult]:
    """Run ``episodes`` closed-loop episodes of each task and count successes.

    Episode ``k`` of a task uses variation ``k`` of ``metaworld.MT1(task, seed=seed)``: with a seed
    other than the one the demonstrations were recorded with, object and goal positions are ones
    the policy has not seen.

    Args:
        policy: A :class:`~loong_embodied.eval.policy.LoadedPolicy`.
        tasks: Meta-World task names.
        episodes: Episodes per task.
        seed: Seed of the task variations.
        max_steps: Step limit per episode (None: the task's own, 500).
        gif: Save the first episode of the first task as a GIF here.
        camera: Camera for the GIF and for policies that read images.

    Returns:
        One :class:`TaskResult` per task.
    """
    from loong_core.step_progress import StepProgress
    from loong_embodied.sim.metaworld_env import MetaWorldTask, instruction

    image_size = policy.config.image_size[1] if policy.config.image_keys and policy.config.image_size else None
    results = []
    done = 0
    with StepProgress(len(tasks) * episodes, "rollout episodes") as progress:
        for task in tasks:
            size = image_size or GIF_SIZE
            needs_camera = bool(image_size) or (gif is not None and not results)
            env = MetaWorldTask(task, camera=camera if needs_camera else None, image_size=size, seed=seed)
            result = TaskResult(task)
            try:
                for k in range(episodes):
                    record = gif is not None and not results and k == 0
                    success, steps, frames = _episode(env, policy, instruction(task), k, seed + k, max_steps,
                                                      read_images=bool(image_size), record=record)
                    result.episodes += 1
                    result.successes += int(success)
                    result.steps.append(steps)
                    logger.info("%s episode %d/%d: %s after %d steps", task, k + 1, episodes,
                                "success" if success else "failure", steps)
                    if record:
                        _save_gif(frames, gif)
                    done += 1
                    progress.update(done)
            finally:
                env.close()
            results.append(result)
    return results


def _episode(env, policy, text: str, variation: int, seed: int, max_steps: int | None, read_images: bool,
             record: bool) -> tuple[bool, int, list[np.ndarray]]:
    state = env.reset(variation, seed)
    policy.reset(text)
    limit = min(env.max_steps, max_steps) if max_steps else env.max_steps
    frames, steps = [], 0
    for steps in range(1, limit + 1):
        image = env.render() if (read_images or record) else None
        if record:
            frames.append(image)
        action = np.clip(policy.act(state, image if read_images else None), -1.0, 1.0)
        state, _, success, truncated = env.step(action)
        if success or truncated:
            if record:
                frames.append(env.render())
            return success, steps, frames
    return False, steps, frames


def _save_gif(frames: list[np.ndarray], path: str | Path) -> None:
    try:
        import imageio.v2 as imageio
    except ImportError:
        from loong_core.errors import MissingDependencyError

        raise MissingDependencyError("imageio", "loong-embodied[sim]", "GIFs of rollouts") from None
    start = time.perf_counter()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    imageio.mimsave(str(path), frames, duration=1000 / 30, loop=0)
    logger.info("wrote %s (%d frames, %.1fs)", path, len(frames), time.perf_counter() - start)


def format_table(results: list[TaskResult]) -> str:
    """A plain-text table: task, episodes, successes, success rate, mean steps; then the mean rate."""
    rows = [("task", "episodes", "successes", "success", "mean steps")]
    for r in results:
        d = r.as_dict()
        rows.append((r.task, str(r.episodes), str(r.successes), f"{100 * r.success_rate:.0f}%", str(d["mean_steps"])))
    mean = float(np.mean([r.success_rate for r in results])) if results else 0.0
    rows.append(("mean", "", "", f"{100 * mean:.0f}%", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)
