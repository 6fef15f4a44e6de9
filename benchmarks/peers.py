"""loong against the stack a user would otherwise train with, one table per modality.

Modalities (``--modality``; the arms of each are described in its module):

* ``dense`` (``peers_dense.py``): the default Llama shape, ``loong train`` vs transformers'
  ``LlamaForCausalLM`` (+ the bare megatron-core loop): ``benchmarks/throughput.py``'s arms;
* ``moe`` (``peers_moe.py``): a small Qwen3-MoE shape (32 experts, top-4), ``loong train`` at EP1
  (and EP2 on two ranks) vs transformers' ``Qwen3MoeForCausalLM`` (grouped_mm experts; eager for
  reference);
* ``dit`` (``peers_dit.py``): a small Wan transformer, ``loong train experiment=wan_debug`` vs a
  plain diffusers ``WanTransformer3DModel`` flow-matching loop;
* ``vlm`` (``peers_vlm.py``): a small Qwen2.5-VL on records with images of mixed sizes, ``loong
  train`` (packed) vs transformers' ``Qwen2_5_VLForConditionalGeneration`` (its processor, padded
  batch);
* ``vla`` (``embodied_peers.py``): loong's ``groot`` and ``xvla`` action heads vs LeRobot 0.4.4's
  (GR00T N1.5's ``FlowmatchingActionHead``; ``XVLAPolicy.forward`` with its Florence-2 encoding
  replaced by the same tokens), LeRobot in its own venv; that module's docstring says what each arm
  runs.

Every arm runs in a fresh process; arms are interleaved round by round (a busy moment of a shared
machine hits every arm alike); the first ``--warmup`` steps of every process are dropped; the table
gives the median and the fastest step of each arm and loong's speed-up over it (arm's time /
loong's time: above 1 means loong is faster). Same shape, data, batch, optimizer (torch's fused
AdamW), precision and threads (all cores) in every arm; each row states its settings. The default
arms are fp32; on a CPU with a bf16 matrix unit (where loong's ``parallel.mixed_precision=auto``
trains in bf16) each side's bf16 arm runs too (``loong_bf16`` and the peer under bf16 autocast, as
its ``Trainer(bf16=True)`` / ``Accelerator(mixed_precision="bf16")`` does), compared with each other.

Usage: python benchmarks/peers.py [--modality dense moe dit vlm vla] [--rounds 3] [--steps 8] [--warmup 2]
       [--arms loong,transformers] [--smoke]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
from pathlib import Path

import peers_harness

MODALITIES = {"dense": "peers_dense", "moe": "peers_moe", "dit": "peers_dit", "vlm": "peers_vlm",
              "vla": "embodied_peers"}
DEFAULT_ARMS = {"dense": "loong,loong_auto,transformers",
                "moe": "loong,loong_sequential,loong_auto,loong_ep2,loong_dense_active,transformers,transformers_eager",
                "dit": "loong,loong_auto,diffusers",
                "vlm": "loong,transformers"}
# Where the CPU has a bf16 matrix unit (loong's auto precision is bf16 there), each side's bf16 run too.
BF16_ARMS = {"dense": "loong_bf16,transformers_bf16", "moe": "loong_bf16,transformers_bf16",
             "dit": "loong_bf16,diffusers_bf16", "vlm": "loong_bf16,transformers_bf16"}


def default_arms(name: str) -> str:
    """The arms of ``name`` run without ``--arms``: fp32 ones, plus bf16 ones on a CPU with a bf16 unit."""
    from loong_core.devices.cpu_peak import native_bf16_unit

    return DEFAULT_ARMS[name] + ("," + BF16_ARMS[name] if native_bf16_unit() else "")


def _modality(name: str):
    return importlib.import_module(MODALITIES[name])


def _measure(name: str, args) -> None:
    module = _modality(name)
    if name == "vla":   # two policies, a table each, LeRobot's arm in its venv: the module runs itself
        print("\n".join(module.measure(list(module.SHAPES), args.rounds, args.steps, args.warmup, os.cpu_count(),
                                       args.smoke)))
        return
    shape_name = "smoke" if args.smoke else "default"
    shape = module.SHAPES[shape_name]
    arms = [a for a in (args.arms or default_arms(name)).split(",") if a]
    unknown = [a for a in arms if a not in module.ARMS]
    if unknown:
        raise SystemExit(f"Unknown arm(s) {unknown} for {name}; choose from {sorted(module.ARMS)}.")
    extra = ["--smoke"] if args.smoke else []
    times, notes = peers_harness.interleave(
        lambda arm: peers_harness.run_worker(__file__, name, arm, shape_name, args.steps, extra),
        arms, args.rounds, args.warmup)
    print(f"\n### {name}: {module.describe(shape)}")
    print(f"{args.rounds} rounds x {args.steps - args.warmup} timed steps per arm (first {args.warmup} of each "
          f"process dropped); {os.cpu_count()} cores; load average {os.getloadavg()[1]:.1f} (5 min)\n")
    print("\n".join(peers_harness.table({a: module.ARMS[a] for a in arms}, times, notes, module.units(shape),
                                        module.UNIT)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modality", nargs="+", default=list(MODALITIES), choices=list(MODALITIES))
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (one process per arm each)")
    parser.add_argument("--steps", type=int, default=8, help="steps per process")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each process dropped")
    parser.add_argument("--arms", default=None,
                        help="comma-separated arms (one modality at a time); default per modality: "
                             + "; ".join(f"{m}: {a}" for m, a in DEFAULT_ARMS.items()))
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes, 1 round x 3 steps (checks that every arm runs, measures nothing)")
    parser.add_argument("--shape", default="default", help=argparse.SUPPRESS)
    parser.add_argument("--worker", nargs=2, metavar=("MODALITY", "ARM"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        name, arm = args.worker
        module = _modality(name)
        Path(args.out).write_text(json.dumps(module.run(arm, module.SHAPES[args.shape], args.steps)))
        return
    if args.smoke:
        args.rounds, args.steps, args.warmup = 1, 3, 1
    for name in args.modality:
        _measure(name, args)


if __name__ == "__main__":
    main()
