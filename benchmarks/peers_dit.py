"""DiT arms of ``benchmarks/peers.py``: a small Wan transformer under loong and a plain diffusers loop.

* ``loong``: ``loong train experiment=wan_debug`` at the shape (torch engine, one rank, synthetic
  latents and text embeddings), step times from its ``metrics.jsonl``;
* ``loong_auto``: ``loong`` with its default ``kernels=auto`` (per-op picks; may compile);
* ``loong_bf16``: ``loong`` in bf16 mixed precision (autocast);
* ``diffusers``: diffusers' ``WanTransformer3DModel`` with the same arguments in a flow-matching
  loop of the kind diffusers' training examples write (written here with diffusers' own helpers):
  ``compute_density_for_timestep_sampling`` (logit-normal), the timestep and sigma of
  ``FlowMatchEulerDiscreteScheduler(shift=3)`` at the drawn index, ``x_t = (1 - sigma) x0 +
  sigma noise``, target ``noise - x0``, ``compute_loss_weighting_for_sd3`` weights, per-sample mean
  then batch mean in fp32, clipping, torch's fused AdamW.

Same latents shape, text embeddings (zero-padded prompts of 1..L tokens), batch, objective
(logit-normal timesteps, shift 3, 1000-step grid, unweighted velocity MSE), AdamW (lr 1e-3, weight
decay 0.01, betas (0.9, 0.95), eps 1e-8), clipping at 1.0, fp32 and threads in both.
"""

from __future__ import annotations

import os
import tempfile
import time

SHAPES = {
    "default": dict(heads=8, head_dim=32, ffn=1024, layers=4, channels=16, text_dim=256, freq_dim=64,
                    latent=[16, 4, 16, 16], text_len=32, batch=4),
    "smoke": dict(heads=2, head_dim=16, ffn=64, layers=2, channels=4, text_dim=32, freq_dim=32,
                  latent=[4, 3, 8, 8], text_len=8, batch=2),
}
UNIT = "samples"
SHIFT = 3.0
OPTIM = dict(lr=1.0e-3, weight_decay=0.01, betas=(0.9, 0.95), eps=1e-8, clip=1.0)
_THREADS = os.cpu_count()
_COMMON = f"AdamW fused, fp32, {_THREADS} threads"
ARMS = {
    "loong": f"`loong train` torch engine (parallel=ddp, 1 rank), kernels=torch, synthetic latents, {_COMMON}",
    "loong_auto": f"the same with kernels=auto (loong's default), {_THREADS} threads",
    "loong_bf16": "the same in bf16 mixed precision (parallel.mixed_precision=bf16: autocast compute, fp32 "
                  "weights, gradients and Adam state)",
    "diffusers": f"WanTransformer3DModel + own loop with diffusers.training_utils helpers, random latents, {_COMMON}",
    "diffusers_bf16": "the same in bf16 autocast (diffusers' examples: Accelerator(mixed_precision='bf16'); fp32 "
                      "trained weights, gradients and Adam state)",
}


def units(shape: dict) -> int:
    return shape["batch"]


def describe(shape: dict) -> str:
    c, f, h, w = shape["latent"]
    tokens = f * (h // 2) * (w // 2)
    return (f"Wan: {shape['layers']} blocks, {shape['heads']} heads x {shape['head_dim']}, FFN {shape['ffn']}, patch "
            f"(1, 2, 2), q/k RMSNorm, cross-attention norm; latents [{c}, {f}, {h}, {w}] ({tokens} tokens/sample), "
            f"text {shape['text_len']} x {shape['text_dim']}, batch {shape['batch']}; logit-normal timesteps, "
            f"shift {SHIFT}")


def model_kwargs(shape: dict) -> dict:
    """``WanTransformer3DModel`` arguments (loong's ``wan`` model config has the same names)."""
    return dict(patch_size=(1, 2, 2), num_attention_heads=shape["heads"], attention_head_dim=shape["head_dim"],
                in_channels=shape["channels"], out_channels=shape["channels"], text_dim=shape["text_dim"],
                freq_dim=shape["freq_dim"], ffn_dim=shape["ffn"], num_layers=shape["layers"], cross_attn_norm=True,
                qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=64)


def run(arm: str, shape: dict, steps: int) -> list[float]:
    if arm.startswith("loong"):
        return _loong(shape, steps, "auto" if arm == "loong_auto" else "torch",
                      "bf16" if arm == "loong_bf16" else "fp32")
    return _diffusers(shape, steps, "bf16" if arm == "diffusers_bf16" else "fp32")


def _loong(shape: dict, steps: int, kernels: str, precision: str = "fp32") -> list[float]:
    from loong_core.testing import read_metrics, run_train

    kwargs = model_kwargs(shape)
    model = [f"model.{key}={value}" for key, value in kwargs.items() if key != "patch_size"]
    latent = ",".join(str(n) for n in shape["latent"])
    with tempfile.TemporaryDirectory() as run_dir:
        run_train(["experiment=wan_debug", *model, "model.objective.timestep_sampling=logit_normal",
                   f"model.objective.shift={SHIFT}", f"data.latent_shape=[{latent}]",
                   f"data.text_length={shape['text_len']}", f"data.text_dim={shape['text_dim']}",
                   f"trainer.micro_batch_size={shape['batch']}", f"trainer.global_batch_size={shape['batch']}",
                   f"trainer.train_iters={steps}", f"optim.lr={OPTIM['lr']}", f"optim.min_lr={OPTIM['lr']}",
                   "optim.lr_warmup_iters=0", f"optim.weight_decay={OPTIM['weight_decay']}",
                   f"optim.clip_grad={OPTIM['clip']}", "optim.implementation=fused", f"kernels={kernels}",
                   f"parallel.mixed_precision={precision}", "trainer.log_interval=1", "trainer.eval_interval=0",
                   "trainer.eval_at_start=false", "trainer.save_at_end=false", "trainer.progress_bar=false",
                   "trainer.tensorboard=false", f"trainer.run_dir={run_dir}"],
                  env={"OMP_NUM_THREADS": str(_THREADS)}, timeout=900)
        return [r["step_time"] for r in sorted(read_metrics(run_dir), key=lambda r: r["step"])]


def _batches(shape: dict, steps: int):
    import torch

    generator = torch.Generator().manual_seed(0)
    b, length = shape["batch"], shape["text_len"]
    for _ in range(steps):
        latents = torch.randn(b, *shape["latent"], generator=generator)
        text = torch.randn(b, length, shape["text_dim"], generator=generator)
        kept = torch.randint(1, length + 1, (b, 1), generator=generator)
        yield latents, text * (torch.arange(length) < kept).unsqueeze(-1)  # zero-padded prompts


def _diffusers(shape: dict, steps: int, precision: str) -> list[float]:
    import peers_harness
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, WanTransformer3DModel
    from diffusers.training_utils import compute_density_for_timestep_sampling, compute_loss_weighting_for_sd3

    torch.set_num_threads(_THREADS)
    torch.manual_seed(0)
    transformer = WanTransformer3DModel(**model_kwargs(shape)).train()
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=SHIFT)
    optimizer = torch.optim.AdamW(transformer.parameters(), lr=OPTIM["lr"], betas=OPTIM["betas"], eps=OPTIM["eps"],
                                  weight_decay=OPTIM["weight_decay"], fused=True)
    all_sigmas, all_timesteps = scheduler.sigmas, scheduler.timesteps
    times = []
    for latents, text in list(_batches(shape, steps)):
        start = time.perf_counter()
        b = latents.shape[0]
        noise = torch.randn_like(latents)
        u = compute_density_for_timestep_sampling("logit_normal", b, logit_mean=0.0, logit_std=1.0)
        index = (u * scheduler.config.num_train_timesteps).long()
        timesteps = all_timesteps[index]
        sigmas = all_sigmas[index].view(b, 1, 1, 1, 1)
        noisy = (1.0 - sigmas) * latents + sigmas * noise
        with peers_harness.peer_autocast(precision):
            prediction = transformer(hidden_states=noisy, timestep=timesteps, encoder_hidden_states=text,
                                     return_dict=False)[0]
        weighting = compute_loss_weighting_for_sd3("logit_normal", sigmas)
        error = weighting.float() * (prediction.float() - (noise - latents).float()) ** 2
        loss = error.reshape(b, -1).mean(dim=1).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(transformer.parameters(), OPTIM["clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return times
