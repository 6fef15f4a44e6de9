"""Is decoding video frames the bottleneck of training a policy on a LeRobot v3.0 dataset?

Builds, from the shipped Meta-World dataset (12 episodes, 766 frames, 64x64 PNG camera), a copy
whose camera is mp4 video (AV1, GOP 2: LeRobot's encoding) at 64x64 and at 224x224 (the frames
upscaled: the resolution of most hub datasets), then measures two things:

1. ``loader``: samples/s of the training loader alone (random frames, one observation step, the
   action chunk, collated into batches of ``--batch`` samples) for PNG and for video.
2. ``train``: ``loong train`` of a policy on each dataset for ``--steps`` steps, with
   ``data.prefetch`` on and off: the median ``step_time`` (the step alone), the median
   ``data_wait`` (the loop waiting for its batch) and the samples/s of both together.

Decoding is not the bottleneck when loader samples/s is well above training samples/s, and with
prefetching the loop waits ~0 s for its data. Prints a table.

Usage: python benchmarks/embodied_video.py [--policies pi05_small flow_policy] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "loong_embodied" / "tests" / "data" / "lerobot_metaworld_v3"
INDEX_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
CAMERA = "observation.image"


def copy_dataset(out: Path, side: int, video: bool) -> Path:
    """The shipped dataset with its camera at ``side`` x ``side`` pixels, as video or PNG."""
    from PIL import Image

    from loong_embodied.lerobot.dataset import LeRobotDataset
    from loong_embodied.lerobot.writer import LeRobotWriter

    source = LeRobotDataset(SHIPPED, float_images=False)
    features = {k: dict(v) for k, v in source.info.features.items() if k not in INDEX_COLUMNS}
    features[CAMERA] = {**features[CAMERA], "dtype": "video" if video else "image", "shape": [side, side, 3]}
    writer = LeRobotWriter(out, fps=int(source.info.fps), features=features, robot_type="sawyer")
    for position in range(source.num_episodes):
        for i in source.episode_frames(position):
            frame = source[int(i)]
            image = frame[CAMERA]
            if side != image.shape[0]:
                image = np.asarray(Image.fromarray(image).resize((side, side), Image.BICUBIC))
            writer.add_frame({**{k: frame[k] for k in features}, CAMERA: image, "task": frame["task"]})
        writer.save_episode()
    return writer.finalize()


def loader_rate(dataset: Path, batch: int, batches: int, chunk: int = 8) -> float:
    """Samples/s of the training split's loader (shuffled frames, collated batches)."""
    from loong_core.data.balancers import contiguous
    from loong_core.data.loader import GlobalBatchLoader
    from loong_embodied.data.config import LeRobotDataConfig
    from loong_embodied.data.module import LeRobotDataModule

    module = LeRobotDataModule(LeRobotDataConfig(name="lerobot", path=str(dataset), chunk_size=chunk))
    module.setup()
    train, _ = module.build(batch * batches, 1, seed=0)
    loader = GlobalBatchLoader(train, batch, batch, 0, 1, contiguous)
    loader.micro_batches(0)  # open the files
    start = time.perf_counter()
    for i in range(1, batches):
        loader.micro_batches(i)
    return batch * (batches - 1) / (time.perf_counter() - start)


def train_rates(policy: str, dataset: Path, steps: int, batch: int, prefetch: bool, run_dir: Path) -> dict:
    """Median step time, data wait and samples/s of a ``loong train`` run (steps 3.. of ``steps``).

    ``policy`` is ``EXPERIMENT:MODEL`` (``pi05_debug:pi05_small``).
    """
    experiment, model = policy.split(":")
    overrides = [f"experiment={experiment}", f"data.path={dataset}", f"model={model}", "data.chunk_size=8",
                 "data.n_obs_steps=1", f"trainer.train_iters={steps}", f"trainer.micro_batch_size={batch}",
                 f"trainer.global_batch_size={batch}", "trainer.log_interval=1", "trainer.eval_interval=0",
                 "trainer.save_at_end=false", "trainer.progress_bar=false", "trainer.tensorboard=false",
                 "trainer.straggler_factor=0", "device.num_threads=1", f"data.prefetch={str(prefetch).lower()}",
                 f"trainer.run_dir={run_dir}"]
    cmd = [sys.executable, "-m", "loong_core.cli.main", "train", *overrides]
    env = {**os.environ, "LOONG_PLUGINS": "embodied", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if r.get("split", "train") == "train" and r["step"] > 2]
    step = statistics.median(r["step_time"] for r in records)
    wait = statistics.median(r["data_wait"] for r in records)
    return {"step_s": step, "wait_s": wait, "samples_s": batch / (step + wait)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", nargs="+", default=["pi05_debug:pi05_small", "flow_policy_debug:flow_policy"],
                        help="EXPERIMENT:MODEL pairs trained on the video datasets")
    parser.add_argument("--sides", nargs="+", type=int, default=[64, 224])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--loader-batches", type=int, default=12)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        print(f"| camera | loader samples/s ({args.batch}-sample batches) |")
        print("|---|---|")
        datasets = {}
        for side in args.sides:
            for video in (False, True):
                name = f"{side}px {'video' if video else 'png'}"
                datasets[name] = copy_dataset(tmp / name.replace(" ", "_"), side, video)
                print(f"| {name} | {loader_rate(datasets[name], args.batch, args.loader_batches):.0f} |", flush=True)
        print()
        print("| experiment:model | camera | prefetch | step s | data wait s | samples/s |")
        print("|---|---|---|---|---|---|")
        for policy in args.policies:
            for name, path in datasets.items():
                if "video" not in name:
                    continue
                for prefetch in (False, True):
                    run = tmp / f"{policy}-{name}-{prefetch}".replace(" ", "_")
                    r = train_rates(policy, path, args.steps, args.batch, prefetch, run)
                    print(f"| {policy} | {name} | {'on' if prefetch else 'off'} | {r['step_s']:.3f} | "
                          f"{r['wait_s']:.4f} | {r['samples_s']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
