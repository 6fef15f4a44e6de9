"""``loong data metaworld``: record Meta-World expert demonstrations as a LeRobot v3.0 dataset.

Light at import time (``loong --help`` stays fast): MuJoCo and Meta-World load when it runs.
"""

from __future__ import annotations

import json


def add_parser(subparsers) -> None:
    """Add the ``metaworld`` action to the shared ``loong data`` command (core passes its subparsers)."""
    p = subparsers.add_parser(
        "metaworld",
        help="record Meta-World expert demonstrations into a LeRobot v3.0 dataset",
        description="Roll out Meta-World's scripted expert policies (MuJoCo, rendered on the CPU) and "
        "write camera images, the 39-d state, the 4-d action and the task instruction of every step "
        "as a LeRobot v3.0 dataset. Train on it with data=lerobot data.path=OUT_DIR.",
    )
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p) -> None:
    """The options of ``loong data metaworld``."""
    p.add_argument("out_dir", metavar="OUT_DIR", help="new dataset folder")
    p.add_argument("--tasks", default="reach-v3,push-v3",
                   help="comma-separated Meta-World tasks (default reach-v3,push-v3)")
    p.add_argument("--episodes", type=int, default=10, help="episodes per task (default 10)")
    p.add_argument("--image-size", type=int, default=64, help="square image side in pixels (default 64)")
    p.add_argument("--camera", default="corner", help="MuJoCo camera (default corner; images flipped upright)")
    p.add_argument("--state-only", action="store_true", help="record no images (no rendering needed)")
    p.add_argument("--video", action="store_true",
                   help="store the camera as mp4 video (needs PyAV) instead of PNG images in the parquet files")
    p.add_argument("--seed", type=int, default=0, help="base seed of the task variations (default 0)")
    p.add_argument("--max-steps", type=int, default=None, help="cap on steps per episode (default: task limit)")
    p.add_argument("--extra-steps", type=int, default=0, help="steps kept after success (default 0)")
    p.add_argument("--keep-failures", action="store_true", help="keep episodes in which the expert failed")


def run(args, extra) -> int:
    """Record the dataset; prints a JSON summary (episodes, frames, frames/s)."""
    from loong_embodied.sim.record import record_metaworld

    summary = record_metaworld(
        args.out_dir, [t.strip() for t in args.tasks.split(",") if t.strip()], args.episodes,
        image_size=args.image_size, camera=None if args.state_only else args.camera, seed=args.seed,
        max_steps=args.max_steps, only_success=not args.keep_failures, extra_steps=args.extra_steps,
        video=args.video)
    print(json.dumps({"path": summary.path, "episodes": summary.episodes, "frames": summary.frames,
                      "failed_attempts": summary.failed, "per_task": summary.per_task,
                      "seconds": round(summary.seconds, 2),
                      "frames_per_second": round(summary.frames_per_second, 1)}, indent=2))
    return 0
