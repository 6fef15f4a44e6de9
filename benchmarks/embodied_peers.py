"""Training speed of loong's VLA action heads against LeRobot 0.4.4's, side by side in one run.

For each policy both can build offline (see ``docs/modalities/embodied.md``, "Checked against
LeRobot"), at the same sizes, batch, fp32 and thread count:

* ``groot``: loong's ``groot`` head against LeRobot's ``FlowmatchingActionHead`` (GR00T N1.5),
  both reading the same random backbone features. LeRobot's ``GrootPolicy`` needs the hub's
  Eagle checkpoint, so the head is what both sides train; its ``vlln`` + self-attention blocks
  over the features are included on both.
* ``groot_mixed``: the same head serving 4 embodiments, each batch mixing them (ids drawn per
  sample): GR00T's per-embodiment state encoder, action encoder and decoder pick each sample's
  weights (LeRobot: a gathered weight per sample and a batched matmul; loong: one matmul per
  embodiment present).
* ``xvla``: loong's ``xvla`` head against LeRobot's whole ``XVLAPolicy.forward`` (input
  preparation, padding, time and noise draws, soft-prompted transformer, ``auto`` loss, its
  ``.item()`` logging) with its Florence-2 encoding (``forward_vlm``) returning the same random
  VLM and auxiliary view tokens loong's head reads (loong's SigLIP + decoder is not Florence-2).

The loong arm runs :meth:`torch_forward_step` of the policy's provider (the step ``loong train``
runs) with the policy's ``backbone()`` returning those features. The LeRobot arm runs in the
LeRobot venv (``tools/build_lerobot_venv.py``, ``$LOONG_LEROBOT_VENV``) offline, and builds its
side with the parity tests' drivers (``loong_embodied/tests/lerobot_ref``), so the weights are
the ones the parity tests compare. A timed step, in both: forward + loss + backward + AdamW step
(torch's fused AdamW over the head's trainable parameters, lr 1e-4, weight decay 0.01) + zero
grad, on one fixed batch. Harness as ``benchmarks/peers.py``: each arm in a fresh process, arms
interleaved round by round, the first ``--warmup`` steps of each process dropped, median and
fastest step per arm; loong's speed-up is the LeRobot step time over loong's (its samples/s over
LeRobot's).

``--precision bf16`` (``groot`` and ``groot_mixed``): LeRobot's GR00T default (``use_bf16=True``):
its ``GrootPolicy.forward`` runs the model under bf16 autocast and ``prepare_input`` hands the head
bf16 features, state and actions, with fp32 parameters; loong's arm runs its step under the
autocast its torch engine opens for ``parallel.mixed_precision=bf16`` and reads the same bf16
features (what its backbone returns under autocast). LeRobot's ``xvla`` bf16 is a different
scheme (``dtype="bfloat16"`` casts the weights), so its row stays fp32.

Usage: python benchmarks/embodied_peers.py [--policies groot groot_mixed xvla] [--rounds 3] [--steps 8]
       [--warmup 2] [--threads 2] [--precision fp32|bf16] [--smoke] [--profile POLICY]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import peers_harness

ROOT = Path(__file__).resolve().parents[1]
DRIVERS = ROOT / "loong_embodied" / "tests" / "lerobot_ref"
SHAPES = {
    "groot": {
        "default": dict(width=256, heads=4, layers=4, vl_layers=2, vl_heads=4, backbone_width=256, tokens=48,
                        future_tokens=8, state_dim=8, action_dim=7, chunk=16, max_seq_len=16, embodiments=1,
                        embodiment=0, steps=4, batch=32),
        "smoke": dict(width=32, heads=2, layers=2, vl_layers=1, vl_heads=2, backbone_width=32, tokens=6,
                      future_tokens=2, state_dim=5, action_dim=2, chunk=4, max_seq_len=4, embodiments=1,
                      embodiment=0, steps=2, batch=4),
    },
    "xvla": {   # VLM / auxiliary tokens are 32 wide: the drivers' small Florence-2 config
        "default": dict(width=256, heads=4, layers=3, domains=4, soft_prompts=16, time_dim=32, max_seq_len=128,
                        max_state_dim=16, max_action_dim=20, hetero=False, state_dim=8, action_dim=7, chunk=16,
                        tokens=24, aux_tokens=8, steps=4, batch=32),
        "smoke": dict(width=32, heads=2, layers=1, domains=2, soft_prompts=2, time_dim=16, max_seq_len=32,
                      max_state_dim=8, max_action_dim=6, hetero=False, state_dim=5, action_dim=3, chunk=4,
                      tokens=5, aux_tokens=3, steps=2, batch=4),
    },
}
# the same head serving several embodiments, each batch mixing them
SHAPES["groot_mixed"] = {"default": {**SHAPES["groot"]["default"], "embodiments": 4},
                         "smoke": {**SHAPES["groot"]["smoke"], "embodiments": 3}}
OPTIM = dict(lr=1e-4, weight_decay=0.01, fused=True)
PRECISION = "fp32"  # of both arms: "bf16" is LeRobot's GR00T default, bf16 autocast (``--precision``)
UNIT = "samples"
_LEROBOT_STEP = {"groot": "LeRobot 0.4.4 `FlowmatchingActionHead.forward` (loss inside)",
                 "groot_mixed": "LeRobot 0.4.4 `FlowmatchingActionHead.forward` (loss inside)",
                 "xvla": "LeRobot 0.4.4 `XVLAPolicy.forward` (whole training forward, loss and `.item()` logging "
                         "included; `forward_vlm` returns the fixed tokens)"}
_LOONG_STEP = "loong `provider.torch_forward_step` (the step `loong train` runs; `backbone()` returns the fixed "


def describe(policy: str, s: dict) -> str:
    """One line naming the sizes of ``policy``."""
    if policy.startswith("groot"):
        return (f"GR00T N1.5 head ({s['embodiments']} embodiment(s), per sample): DiT {s['layers']} blocks x "
                f"{s['width']} wide, {s['heads']} heads; "
                f"{s['vl_layers']} self-attention blocks over {s['tokens']} backbone tokens x {s['backbone_width']}; "
                f"{s['future_tokens']} future tokens, chunk {s['chunk']} x {s['action_dim']}, state {s['state_dim']}, "
                f"batch {s['batch']}")
    return (f"X-VLA soft-prompted transformer: {s['layers']} blocks x {s['width']} wide, {s['heads']} heads; "
            f"{s['tokens']} VLM + {s['aux_tokens']} auxiliary tokens x 32, {s['soft_prompts']} soft prompts, "
            f"{s['domains']} domains (per sample), chunk {s['chunk']} x {s['action_dim']} (padded to "
            f"{s['max_action_dim']}), batch {s['batch']}")


def _inputs(policy: str, s: dict) -> dict:
    """The fixed batch both arms train on (drawn with seed 0)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    b = s["batch"]
    io = {"state": torch.randn(b, 1, s["state_dim"], generator=generator),
          "actions": torch.rand(b, s["chunk"], s["action_dim"], generator=generator) * 2 - 1}
    if policy.startswith("groot"):
        io["features"] = torch.randn(b, s["tokens"], s["backbone_width"], generator=generator)
        io["embodiment_id"] = torch.randint(0, s["embodiments"], (b,), generator=generator)
    else:
        io["features"] = torch.randn(b, s["tokens"], 32, generator=generator)
        io["aux"] = torch.randn(b, s["aux_tokens"], 32, generator=generator)
        io["domain_id"] = torch.randint(0, s["domains"], (b,), generator=generator)
    return io


def _loong_policy(policy: str, s: dict):
    """``(provider, model, batch)``: loong's policy at the sizes of ``s`` (a tiny frozen backbone,
    never run: ``backbone()`` returns the fixed features)."""
    import torch

    common = dict(state_dim=s["state_dim"], action_dim=s["action_dim"], chunk_size=s["chunk"],
                  image_size=[3, 16, 16], image_keys=["observation.image"], patch_size=8, vision_hidden_size=16,
                  vision_layers=1, vision_heads=2, vision_intermediate_size=32, num_layers=1, num_heads=4,
                  num_kv_heads=2, intermediate_size=32, num_inference_steps=s["steps"], action_clip=None,
                  tune_backbone=False)
    io = _inputs(policy, s)
    batch = {"observation.state": io["state"], "action": io["actions"]}
    if policy.startswith("groot"):
        from loong_embodied.policies.groot.config import GrootConfig
        from loong_embodied.policies.groot.model import GrootProvider

        config = GrootConfig(name="groot", hidden_size=s["backbone_width"], head_dim=s["backbone_width"] // 4,
                             head_hidden_size=s["width"], head_layers=s["layers"], head_heads=s["heads"],
                             vl_layers=s["vl_layers"], vl_heads=s["vl_heads"], future_tokens=s["future_tokens"],
                             num_embodiments=s["embodiments"], **common)
        provider = GrootProvider(config)
        features = (io["features"], io["features"].new_ones(io["features"].shape[:2], dtype=bool), None)
        batch["embodiment_id"] = io["embodiment_id"]
    else:
        from loong_embodied.policies.xvla.config import XVLAConfig
        from loong_embodied.policies.xvla.model import XVLAProvider

        config = XVLAConfig(name="xvla", hidden_size=32, head_dim=8, max_text_tokens=8,
                            head_hidden_size=s["width"], head_layers=s["layers"], head_heads=s["heads"],
                            num_domains=s["domains"], soft_prompt_len=s["soft_prompts"],
                            time_embedding_dim=s["time_dim"], max_seq_len=s["max_seq_len"],
                            max_state_dim=s["max_state_dim"], max_action_dim=s["max_action_dim"],
                            hetero_projection=s["hetero"], dropout=0.0, **common)
        provider = XVLAProvider(config)
        features = (io["features"], io["aux"])
        batch["domain_id"] = io["domain_id"]
    if PRECISION == "bf16":  # what the backbone returns under the engine's autocast
        features = tuple(f.bfloat16() if torch.is_tensor(f) and f.is_floating_point() else f for f in features)
    model = provider.build_torch_model()
    model.backbone = lambda _batch: features
    return provider, model, batch


def _loong(policy: str, s: dict, steps: int) -> tuple[list[float], dict]:
    """loong's arm (in loong's python): step times and ``{"torch", "parameters"}``."""
    import torch

    torch.manual_seed(0)
    provider, model, batch = _loong_policy(policy, s)
    params = [p for p in model.parameters() if p.requires_grad]

    def loss():
        with peers_harness.peer_autocast(PRECISION):  # the torch engine's mixed precision
            loss_sum, count, _ = provider.torch_forward_step(model, batch)
        return loss_sum / count

    model.train()
    return _train(params, loss, steps), {"torch": torch.__version__, "parameters": _count(params)}


def _lerobot(policy: str, s: dict, steps: int) -> tuple[list[float], dict]:
    """LeRobot's arm (in its venv's python, built by the parity drivers): step times and
    ``{"torch", "lerobot", "parameters"}``."""
    import torch

    sys.path.insert(0, str(DRIVERS))
    from importlib.metadata import version

    torch.manual_seed(0)
    io = _inputs(policy, s)
    if policy.startswith("groot"):
        import groot_head

        module = groot_head.build(s)
        params = [p for p in module.parameters() if p.requires_grad]
        if PRECISION == "bf16":  # GrootPolicy's prepare_input casts the head's float inputs
            io = {k: v.bfloat16() if torch.is_floating_point(v) else v for k, v in io.items()}

        def loss():
            with peers_harness.peer_autocast(PRECISION):  # GrootPolicy.forward's autocast
                return module(*groot_head.head_inputs(io))["loss"]
    else:
        import xvla_policy

        module = xvla_policy.build(s)
        batch = xvla_policy.feed(module, io)
        params = [p for p in module.model.transformer.parameters() if p.requires_grad]

        def loss():
            return module(batch)[0]

    module.train()
    return _train(params, loss, steps), {"torch": torch.__version__, "lerobot": version("lerobot"),
                                         "parameters": _count(params)}


def _train(params: list, loss_fn, steps: int) -> list[float]:
    """Step times of ``steps`` steps: forward + loss, backward, AdamW step, zero grad."""
    import torch

    optimizer = torch.optim.AdamW(params, **OPTIM)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss_fn().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return times


def _count(params: list) -> int:
    """Elements of ``params``."""
    return sum(p.numel() for p in params)


def _lerobot_python() -> Path:
    """The LeRobot venv's python (``tools/build_lerobot_venv.py`` locates and checks it).

    Raises:
        RuntimeError: The venv is not built; the message says how to build it.
    """
    spec = importlib.util.spec_from_file_location("_build_lerobot_venv", ROOT / "tools" / "build_lerobot_venv.py")
    tools = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tools)
    venv = tools.venv_dir()
    if not tools.is_built(venv):
        raise RuntimeError(f"LeRobot venv absent ({venv}): run python tools/build_lerobot_venv.py "
                           f"(or point ${tools.VENV_ENV} at one)")
    return tools.venv_python(venv)


def _run_arm(policy: str, arm: str, *, shape: str, steps: int, threads: int, meta: dict) -> list[float]:
    """One arm in a fresh process (LeRobot's with its venv's python, offline); its step times."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if arm == "loong" or not k.startswith(("PYTHON", "LOONG_"))}
        env.update(OMP_NUM_THREADS=str(threads), CUDA_VISIBLE_DEVICES="")
        python = None
        if arm == "lerobot":
            python = str(_lerobot_python())
            env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=f"{tmp}/hf-home",
                       HF_LEROBOT_HOME=f"{tmp}/lerobot-home", WANDB_MODE="disabled")
        record = peers_harness.run_worker(str(Path(__file__).resolve()), policy, arm, shape, steps,
                                          ["--threads", str(threads), "--precision", PRECISION], python=python,
                                          env=env, cwd=tmp)
        meta[arm] = record["meta"]
        return record["times"]


def measure(policies: list[str], rounds: int, steps: int, warmup: int, threads: int, smoke: bool) -> list[str]:
    """Markdown: for each policy a header line, the settings and the table of its two arms."""
    shape = "smoke" if smoke else "default"
    lines = []
    for policy in policies:
        s, meta = SHAPES[policy][shape], {}
        times, notes = peers_harness.interleave(
            functools.partial(_run_arm, policy, shape=shape, steps=steps, threads=threads, meta=meta),
            ["loong", "lerobot"], rounds, warmup)
        fed = "features)" if policy.startswith("groot") else "VLM and auxiliary tokens)"
        common = (f"fused AdamW, {PRECISION}{' autocast' if PRECISION == 'bf16' else ''}, fp32 parameters, "
                  f"{threads} threads")
        arms = {arm: f"{step}, {common}, {meta[arm]['parameters']:,} trainable parameters, torch {meta[arm]['torch']}"
                if arm in meta else step
                for arm, step in (("loong", _LOONG_STEP + fed), ("lerobot", _LEROBOT_STEP[policy]))}
        lines += [f"\n### vla / {policy}: {describe(policy, s)}",
                  f"{rounds} rounds x {steps - warmup} timed steps per arm (first {warmup} of each process "
                  f"dropped); {threads} threads of {os.cpu_count()} cores; load average "
                  f"{os.getloadavg()[1]:.1f} (5 min)\n",
                  *peers_harness.table(arms, times, notes, s["batch"], UNIT)]
    return lines


def profile(policy: str, steps: int, threads: int) -> str:
    """torch.profiler's top operators (self CPU time) of the loong arm's training steps."""
    import torch

    torch.set_num_threads(threads)
    provider, model, batch = _loong_policy(policy, SHAPES[policy]["default"])
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], **OPTIM)

    def step():
        with peers_harness.peer_autocast(PRECISION):
            loss_sum, count, _ = provider.torch_forward_step(model.train(), batch)
        (loss_sum / count).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", nargs="+", choices=list(SHAPES),
                        help="default: all (fp32), the groot ones (bf16)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (one process per arm each)")
    parser.add_argument("--steps", type=int, default=8, help="steps per process")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each process dropped")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in every arm")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="both arms: fp32, or bf16 autocast (LeRobot's GR00T default; groot policies only)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, 1 round x 3 steps (checks that every arm runs, measures nothing)")
    parser.add_argument("--profile", choices=list(SHAPES), help="profile the loong arm of this policy instead")
    parser.add_argument("--shape", default="default", help=argparse.SUPPRESS)
    parser.add_argument("--worker", nargs=2, metavar=("POLICY", "ARM"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global PRECISION
    PRECISION = args.precision
    if args.policies is None:
        args.policies = [p for p in SHAPES if PRECISION == "fp32" or p.startswith("groot")]
    if PRECISION == "bf16" and "xvla" in args.policies + [args.profile]:
        parser.error("--precision bf16 compares the groot policies only (LeRobot's xvla bf16 casts its weights)")
    if args.worker:
        import torch

        torch.set_num_threads(args.threads)
        policy, arm = args.worker
        times, meta = (_loong if arm == "loong" else _lerobot)(policy, SHAPES[policy][args.shape], args.steps)
        Path(args.out).write_text(json.dumps({"times": times, "meta": meta}))
        return
    if args.profile:
        print(profile(args.profile, args.steps, args.threads))
        return
    if args.smoke:
        args.rounds, args.steps, args.warmup = 1, 3, 1
    print("\n".join(measure(args.policies, args.rounds, args.steps, args.warmup, args.threads, args.smoke)))


if __name__ == "__main__":
    main()
