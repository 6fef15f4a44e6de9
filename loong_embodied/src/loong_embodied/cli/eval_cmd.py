"""``loong eval rollout``: closed-loop success rate of a trained policy in Meta-World.

Light at import time (no torch, no MuJoCo): they load when the command runs.
"""

from __future__ import annotations

import json

ENVS = ("metaworld",)


def add_parser(subparsers) -> None:
    """Add the ``rollout`` action to the shared ``loong eval`` command (core passes its subparsers)."""
    p = subparsers.add_parser(
        "rollout",
        help="success rate of a trained policy in simulation",
        description="Load a policy from a loong run (config.yaml + checkpoints/iter_N), run it closed-loop "
        "in Meta-World on task variations drawn with --seed (use one other than the recording seed for "
        "unseen initial states), executing --action-steps actions of each predicted chunk before "
        "re-planning, and print the success rate per task.",
    )
    p.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="run directory (its newest checkpoint) or a checkpoint directory iter_N")
    p.add_argument("--env", default="metaworld", choices=ENVS, help="simulator (default metaworld)")
    p.add_argument("--tasks", default="reach-v3,push-v3", help="comma-separated tasks (default reach-v3,push-v3)")
    p.add_argument("--episodes", type=int, default=10, help="episodes per task (default 10)")
    p.add_argument("--seed", type=int, default=1000,
                   help="seed of the task variations and the sampling noise (default 1000; demonstrations "
                   "are recorded with 0)")
    p.add_argument("--action-steps", type=int, default=None,
                   help="actions executed per predicted chunk before re-planning (default: half the chunk)")
    p.add_argument("--max-steps", type=int, default=None, help="step limit per episode (default: the task's, 500)")
    p.add_argument("--gif", default=None, metavar="FILE", help="save the first episode as a GIF")
    p.add_argument("--num-threads", type=int, default=None,
                   help="CPU threads (default: the run's device.num_threads, else 1: batch-1 inference)")
    p.add_argument("--json", action="store_true", help="print a JSON object instead of the table")
    p.set_defaults(func=run)


def run(args, extra) -> int:
    """Load the policy, run the episodes, print the table (or JSON)."""
    import time

    from loong_core.errors import ConfigError
    from loong_embodied.eval.policy import LoadedPolicy
    from loong_embodied.eval.rollout import format_table, rollout_metaworld

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks or args.episodes < 1:
        raise ConfigError("--tasks needs at least one task and --episodes at least 1")
    start = time.perf_counter()
    policy = LoadedPolicy(args.checkpoint, action_steps=args.action_steps, seed=args.seed,
                          num_threads=args.num_threads)
    results = rollout_metaworld(policy, tasks, args.episodes, seed=args.seed, max_steps=args.max_steps,
                                gif=args.gif)
    seconds = time.perf_counter() - start
    if args.json:
        rates = [r.success_rate for r in results]
        print(json.dumps({"checkpoint": str(policy.checkpoint), "env": args.env, "seed": args.seed,
                          "action_steps": policy.action_steps, "tasks": [r.as_dict() for r in results],
                          "mean_success_rate": round(sum(rates) / len(rates), 4), "gif": args.gif,
                          "seconds": round(seconds, 1)}, indent=2))
    else:
        print(f"{policy.checkpoint} on {args.env}, seed {args.seed}, {policy.action_steps} actions per chunk")
        print(format_table(results))
        if args.gif:
            print(f"GIF: {args.gif}")
    return 0
