"""A trained policy loaded from a loong run for closed-loop control (one process, no process group).

The run directory's ``config.yaml`` gives the model (any registered policy whose module has
``sample(batch, generator)``: ``flow_policy``, ``pi05``, ``groot``, ``xvla``, ``wam``), its config (with the shapes the
data set) and the dataset it trained on; the dataset's ``meta/stats.json`` and task list give the normalisation and
the task indices; the weights come from a DCP checkpoint (``checkpoints/iter_N``) loaded into a
freshly built model, whatever the data-parallel layout it was saved with.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections import deque
from dataclasses import fields
from pathlib import Path

import numpy as np

from loong_core.errors import ConfigError

logger = logging.getLogger(__name__)


def resolve_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """``(run_dir, checkpoint_dir)`` of a run directory (its newest checkpoint) or a checkpoint directory.

    Raises:
        ConfigError: Neither a run directory with a complete checkpoint nor a checkpoint inside a run.
    """
    from loong_core.checkpoint import store

    path = Path(path).expanduser()
    if (path / "config.yaml").is_file():
        latest = store.find_latest(path / "checkpoints")
        if latest is None:
            raise ConfigError(f"{path} has no complete checkpoint under checkpoints/; train longer or "
                              "pass trainer.save_at_end=true")
        return path, latest
    if store.is_complete(path) and (path.parent.parent / "config.yaml").is_file():
        return path.parent.parent, path
    raise ConfigError(f"--checkpoint {path}: expected a run directory (with config.yaml and checkpoints/) "
                      "or one of its checkpoints (runs/NAME/STAMP/checkpoints/iter_0000100)")


class LoadedPolicy:
    """A trained policy with its normalisation, observation history, instruction and action-chunk queue.

    Args:
        checkpoint: Run directory or checkpoint directory.
        action_steps: Actions executed from each predicted chunk before re-planning (None: half
            the chunk).
        seed: Seed of the sampling noise.
        num_threads: CPU threads; None takes the run's ``device.num_threads`` as training did,
            else 1 (batch-1 inference: more threads only spin and slow a shared CPU).
    """

    def __init__(self, checkpoint: str | Path, action_steps: int | None = None, seed: int = 0,
                 num_threads: int | None = None):
        import torch
        import yaml

        from loong_core.checkpoint import store
        from loong_core.config.validate import build_dataclass
        from loong_core.engines.torch_native.checkpointing import load_model_only
        from loong_embodied.data.config import LeRobotDataConfig
        from loong_embodied.data.module import LeRobotDataModule

        self.run_dir, self.checkpoint = resolve_checkpoint(checkpoint)
        store.verify_checkpoint(self.checkpoint)  # every file's size and checksum
        raw = yaml.safe_load((self.run_dir / "config.yaml").read_text())
        model_raw, data_raw = raw["model"], raw["data"]
        self.config, self.model = build_policy(model_raw, self.run_dir)
        dataset = os.path.expandvars(os.path.expanduser(data_raw.get("path") or ""))
        if not (Path(dataset) / "meta" / "info.json").is_file():
            raise ConfigError(f"the dataset this run trained on ({dataset or 'data.path unset'}) is missing: "
                              "its meta/stats.json holds the normalisation the policy needs")
        # The training run's data module: its normalisation (and state-relative actions) exactly.
        names = {f.name for f in fields(LeRobotDataConfig)}
        data = LeRobotDataModule(build_dataclass(LeRobotDataConfig, {k: v for k, v in data_raw.items()
                                                                      if k in names}, "data"))
        data.setup()
        self.tasks = data.frames.tasks
        self.normalizer, self.relative = data.frames.normalizer, data.frames.relative
        self.state_key, self.action_key = data.config.state_key, data.config.action_key
        threads = num_threads or (raw.get("device") or {}).get("num_threads") or 1
        if threads < 1:
            raise ConfigError(f"--num-threads must be at least 1, got {threads}")
        torch.set_num_threads(int(threads))
        with warnings.catch_warnings():   # DCP notes that it loads in a single process: intended here
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
            load_model_only(self.model, str(self.checkpoint))
        self.model.eval()
        self.torch = torch
        self.generator = torch.Generator().manual_seed(seed)
        chunk = self.config.chunk_size
        self.action_steps = max(1, min(chunk, action_steps or max(chunk // 2, 1)))
        logger.info("policy %s: chunk %d, executing %d actions per chunk, tasks %s, %d CPU thread(s)",
                    self.checkpoint, chunk, self.action_steps, self.tasks, torch.get_num_threads())
        self.reset("")

    def task_index(self, instruction: str) -> int:
        """Index of a task instruction (``"push"``) in the training dataset's task list."""
        if instruction not in self.tasks:
            raise ConfigError(f"task '{instruction}' was not in the training data; trained on: "
                              f"{', '.join(self.tasks)}")
        return self.tasks.index(instruction)

    def reset(self, instruction: str) -> None:
        """Start an episode of the task with this instruction (empty: none yet)."""
        self.task = self.task_index(instruction) if instruction else 0
        self.instruction = instruction or (self.tasks[0] if self.tasks else "")
        self.states: deque = deque(maxlen=self.config.n_obs_steps)
        self.queue: deque = deque()

    def act(self, state: np.ndarray, image: np.ndarray | None = None) -> np.ndarray:
        """The next action (un-normalised) for the current state and camera image ``[H, W, 3]``."""
        self.raw_state = np.asarray(state, dtype=np.float32)
        state = self.normalizer.normalize(self.state_key, self.raw_state)
        if not self.states:
            self.states.extend([state] * self.config.n_obs_steps)  # history padded with the first frame
        self.states.append(state)
        if not self.queue:
            chunk = self._predict(image)
            self.queue.extend(chunk[: self.action_steps])
        return self.queue.popleft()

    def _predict(self, image: np.ndarray | None) -> np.ndarray:
        torch, c = self.torch, self.config
        batch = {"observation.state": torch.from_numpy(np.stack(self.states))[None],
                 "task_index": torch.tensor([self.task]), "task": [self.instruction]}
        for key in c.image_keys:
            if image is None:
                raise ConfigError(f"the policy reads camera '{key}' but the environment renders no image")
            batch[key] = torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))[None].float() / 255.0
        with torch.no_grad():
            chunk = self.model.sample(batch, generator=self.generator)[0].numpy()
        chunk = self.normalizer.unnormalize(self.action_key, chunk)
        return chunk if self.relative is None else self.relative.to_absolute(chunk, self.raw_state)


def build_policy(model_raw: dict, run_dir: Path):
    """``(config, model)``: the registered model ``model_raw["name"]`` built from its saved config.

    Raises:
        ConfigError: The model is not registered or cannot sample actions.
    """
    from loong_core.plugins.manager import get_registry

    name = model_raw.get("name")
    registry = get_registry()
    if not registry.has("model", name):
        raise ConfigError(f"{run_dir} trained model '{name}', which no installed plugin registers")
    entry = registry.get("model", name)
    engines = tuple(entry.meta.get("engines") or ())
    if engines and "torch" not in engines:
        raise ConfigError(f"{run_dir} trained model '{name}' (engine {', '.join(engines)}), not a robot policy: "
                          "loong eval rollout needs a run of flow_policy, pi05, groot, xvla or wam")
    from loong_core.config.validate import build_dataclass

    config_cls = entry.load_meta("config")
    names = {f.name for f in fields(config_cls)}
    # Typed as training built it: nested config dataclasses (wam's objective) come back as dataclasses.
    config = build_dataclass(config_cls, {k: v for k, v in model_raw.items() if k in names}, "model")
    model = entry.load()(config).build_torch_model()
    if not hasattr(model, "sample"):
        raise ConfigError(f"{run_dir} trained model '{name}', which has no sample(batch) method; rollout needs "
                          "a policy (flow_policy, pi05, groot, xvla, wam)")
    return config, model
