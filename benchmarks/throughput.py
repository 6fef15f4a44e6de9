"""Training throughput of one Llama shape under loong and the peers a user would pick instead.

Arms, each a fresh process, interleaved round by round so that a busy moment of a shared machine
hits every arm alike:

* ``loong``: ``loong train experiment=llama_shakespeare`` (megatron engine), step times from its
  ``metrics.jsonl``;
* ``mcore``: a bare megatron-core loop written for this benchmark: ``GPTModel`` on the layer spec
  loong builds (megatron-core's local spec passed through the kernel seam's
  ``seam.spec.apply``: SDPA core attention, the seam's RoPE; kernels resolved as ``loong train``
  resolves them), megatron-core DDP, ``get_megatron_optimizer`` (Adam),
  ``get_forward_backward_func``, with the same CPU redirects (``loong_core.devices.mcore_cpu``)
  and the same loss (sum over tokens, ``calculate_per_token_loss``): what is left between this arm
  and ``loong`` is framework overhead;
* ``mcore_local``: the same loop on megatron-core's own local spec (``DotProductAttention``, which
  materialises the score matrix), for reference;
* ``transformers``: ``LlamaForCausalLM`` (SDPA attention) + ``torch.optim.AdamW`` + clipping;
* ``torchtitan``: its Llama 3 model + AdamW, when ``--torchtitan-python`` names an interpreter that
  has torchtitan (it needs packages loong does not; install it into a separate venv).

Every arm trains the same shape (default: the default experiment's, ~7M parameters, vocabulary
4096, sequence 256, batch 8) on random tokens with the same optimizer settings; the first
``--warmup`` steps of every process are dropped. MFU uses loong's FLOPs per token and the cpu
backend's derived peak. On a machine shared with other work the numbers are noisy; the ratios of
one run are what to read.

Kernels: ``--kernels torch`` (default) runs loong with ``kernels=torch`` and the bare loops with the
same choices (the torch references, SDPA attention), so the megatron arms compute the same ops as
each other and, like the transformers arm, compile nothing; ``compile`` / ``auto`` pass that
kernels option to ``loong train`` and resolve it the same way in the bare loops (``auto`` there
without a step count, so ``auto``'s step-dependent picks may differ: read the banner).

Optimizer: ``--optimizer fused`` (default) steps every arm with torch's fused AdamW kernel: what
each framework gives by default (loong's ``optim.implementation=auto``, transformers' Trainer
``adamw_torch_fused`` on torch >= 2.8, torchtitan's ``implementation="fused"``);
``--optimizer for-loop`` gives every arm torch's Python loop (what megatron-core without Apex /
TransformerEngine builds, and a bare ``torch.optim.AdamW`` on CPU).

Usage: python benchmarks/throughput.py [--size default|30m|125m] [--rounds 3] [--steps 8] [--kernels torch]
       [--optimizer fused]
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

SIZES = {  # hidden, layers, heads, kv heads, ffn, seq, micro batch
    "default": dict(hidden=256, layers=8, heads=8, groups=4, ffn=704, seq=256, batch=8),
    "30m": dict(hidden=512, layers=8, heads=8, groups=4, ffn=1408, seq=512, batch=4),
    "125m": dict(hidden=768, layers=12, heads=12, groups=4, ffn=2048, seq=1024, batch=2),
}
VOCAB = 4096
OPTIM = dict(lr=2.0e-3, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8, clip=1.0)
ARMS = ("loong", "mcore", "mcore_local", "transformers", "torchtitan")
KERNELS = "torch"  # the ``kernels`` config option of the megatron arms (``--kernels``)
OPTIMIZER = "fused"  # torch's AdamW implementation in every arm (``--optimizer``)
# loong's ``parallel.mixed_precision``; the transformers arm runs autocast when "bf16" (``benchmarks/peers.py``)
PRECISION = "fp32"


def _adamw(params):
    """The peers' ``torch.optim.AdamW`` in the :data:`OPTIMIZER` implementation."""
    import torch

    kind = {"fused": dict(fused=True), "for-loop": dict(foreach=False)}[OPTIMIZER]
    return torch.optim.AdamW(params, lr=OPTIM["lr"], betas=(OPTIM["beta1"], OPTIM["beta2"]),
                             eps=OPTIM["eps"], weight_decay=OPTIM["weight_decay"], **kind)


def _kernel_section():
    """The bare loops' kernel choices for :data:`KERNELS` (the ``kernels=<option>`` group's)."""
    from loong_core.config.schema import KernelsConfig
    from loong_core.kernels import OPS

    if KERNELS == "auto":
        return KernelsConfig()
    return {op: ("auto" if op == "attention" else KERNELS) for op in OPS}


def _batches(shape: dict, steps: int):
    import torch

    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        tokens = torch.randint(0, VOCAB, (shape["batch"], shape["seq"] + 1), generator=generator)
        yield tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def _timed_steps(step, shape: dict, steps: int) -> list[float]:
    times = []
    for tokens, labels in _batches(shape, steps):
        start = time.perf_counter()
        step(tokens, labels)
        times.append(time.perf_counter() - start)
    return times


# -- arms -------------------------------------------------------------------------------------
def arm_loong(shape: dict, steps: int) -> list[float]:
    from loong_core.testing import read_metrics, run_train

    with tempfile.TemporaryDirectory() as run_dir:
        run_train(["experiment=llama_shakespeare", f"model.hidden_size={shape['hidden']}",
                   f"model.num_layers={shape['layers']}", f"model.num_attention_heads={shape['heads']}",
                   f"model.num_query_groups={shape['groups']}", f"model.ffn_hidden_size={shape['ffn']}",
                   f"data.seq_length={shape['seq']}", f"trainer.micro_batch_size={shape['batch']}",
                   f"trainer.global_batch_size={shape['batch']}", f"trainer.train_iters={steps}",
                   "trainer.log_interval=1", "trainer.eval_interval=0", "trainer.eval_at_start=false",
                   "trainer.save_at_end=false", "trainer.progress_bar=false", "trainer.tensorboard=false",
                   f"kernels={KERNELS}", f"optim.implementation={OPTIMIZER}",
                   f"parallel.mixed_precision={PRECISION}",
                   f"trainer.run_dir={run_dir}"], env={"OMP_NUM_THREADS": str(os.cpu_count())})
        return [r["step_time"] for r in sorted(read_metrics(run_dir), key=lambda r: r["step"])]


def arm_mcore(shape: dict, steps: int) -> list[float]:
    """The bare loop on loong's layer spec (the seam's SDPA attention and RoPE)."""
    return _mcore_loop(shape, steps, seam=True)


def arm_mcore_local(shape: dict, steps: int) -> list[float]:
    """The bare loop on megatron-core's local spec (its own ``DotProductAttention``)."""
    return _mcore_loop(shape, steps, seam=False)


def _mcore_loop(shape: dict, steps: int, seam: bool) -> list[float]:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.transformer_config import TransformerConfig

    from loong_core import kernels
    from loong_core.devices import mcore_cpu
    from loong_core.engines import optimizer_implementation
    from loong_core.engines.megatron.seam import spec as seam_spec
    from loong_core.engines.megatron.seam.gpt import SeamGPTModel
    from loong_core.testing import free_port

    torch.set_num_threads(os.cpu_count())
    mcore_cpu.apply()
    kernels.configure(_kernel_section(), "cpu")  # as the loong arm's ``kernels=`` option
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    ps.initialize_model_parallel()
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    config = TransformerConfig(
        num_layers=shape["layers"], hidden_size=shape["hidden"], num_attention_heads=shape["heads"],
        num_query_groups=shape["groups"], ffn_hidden_size=shape["ffn"], normalization="RMSNorm",
        layernorm_epsilon=1e-5, gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True,
        params_dtype=torch.float32, pipeline_dtype=torch.float32, bias_activation_fusion=False,
        masked_softmax_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        calculate_per_token_loss=True, **(seam_spec.transformer_kwargs() if seam else {}))
    spec, model_class = get_gpt_layer_local_spec(normalization="RMSNorm"), GPTModel
    if seam:
        spec, model_class = seam_spec.apply(spec, config), SeamGPTModel
    model = model_class(config=config, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=1024,
                        share_embeddings_and_output_weights=True, position_embedding_type="rope")
    ddp = DistributedDataParallel(config=config, ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True),
                                  module=model)
    config.finalize_model_grads_func = finalize_model_grads
    optimizer = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", lr=OPTIM["lr"], weight_decay=OPTIM["weight_decay"], adam_beta1=OPTIM["beta1"],
        adam_beta2=OPTIM["beta2"], adam_eps=OPTIM["eps"], clip_grad=OPTIM["clip"]), [ddp])
    optimizer_implementation.apply(optimizer_implementation.torch_optimizers(optimizer), OPTIMIZER)
    positions = torch.arange(shape["seq"]).unsqueeze(0).expand(shape["batch"], -1)
    forward_backward = get_forward_backward_func()

    def step(tokens, labels):
        def forward_step(iterator, module):
            tokens_, labels_ = next(iterator)
            output = module(tokens_, positions, None, labels=labels_)

            def loss_func(per_token):
                loss = per_token.float().sum()
                count = torch.tensor(per_token.numel(), dtype=torch.int)
                return loss, count, {"loss": torch.stack([loss.detach(), count.float()])}
            return output, loss_func

        ddp.zero_grad_buffer()
        optimizer.zero_grad()
        forward_backward(forward_step_func=forward_step, data_iterator=iter([(tokens, labels)]), model=[ddp],
                         num_microbatches=1, seq_length=shape["seq"], micro_batch_size=shape["batch"],
                         forward_only=False)
        optimizer.step()

    try:
        return _timed_steps(step, shape, steps)
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()


def arm_transformers(shape: dict, steps: int) -> list[float]:
    import peers_harness
    import torch
    import transformers as tf

    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=shape["hidden"], intermediate_size=shape["ffn"],
                            num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                            num_key_value_heads=shape["groups"], max_position_embeddings=1024,
                            rms_norm_eps=1e-5, tie_word_embeddings=True, attn_implementation="sdpa")
    model = tf.LlamaForCausalLM(config).train()
    optimizer = _adamw(model.parameters())

    def step(tokens, labels):
        with peers_harness.peer_autocast(PRECISION):
            logits = model(input_ids=tokens).logits
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, VOCAB), labels.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIM["clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return _timed_steps(step, shape, steps)


def arm_torchtitan(shape: dict, steps: int) -> list[float]:
    """torchtitan's Llama 3 built from its own config builders at this shape (tied embeddings,
    flex attention: its language models accept only flex or varlen attention)."""
    import torch
    from torchtitan.models import llama3
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm

    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(0)
    dim = shape["hidden"]
    config = llama3.Llama3Model.Config(
        dim=dim, vocab_size=VOCAB, enable_weight_tying=True,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=dim,
                                        param_init=llama3._EMBEDDING_SKIP_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=llama3._NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=VOCAB, param_init=llama3._output_linear_init(dim)),
        layers=llama3._build_llama3_layers(
            n_layers=shape["layers"], dim=dim, n_heads=shape["heads"], n_kv_heads=shape["groups"],
            hidden_dim=shape["ffn"], rope=ComplexRoPE.Config(dim=dim // shape["heads"], max_seq_len=1024,
                                                             theta=10000.0), attn_backend="flex"))
    model = config.build()
    model.init_states()
    optimizer = _adamw(model.parameters())
    positions = torch.arange(shape["seq"]).unsqueeze(0).expand(shape["batch"], -1)
    masks = model.get_attention_masks(positions)

    def step(tokens, labels):
        logits = model(tokens, positions, masks)
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, VOCAB), labels.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIM["clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return _timed_steps(step, shape, steps)


# -- driver -----------------------------------------------------------------------------------
def _flops_per_token(shape: dict) -> float:
    """loong's count: 6 x matmul parameters + attention scores (``DecoderProvider.flops_per_token``)."""
    from loong_llm.families.common.config import DecoderConfig
    from loong_llm.families.common.provider import DecoderProvider

    cfg = DecoderConfig(name="llama", num_layers=shape["layers"], hidden_size=shape["hidden"],
                        num_attention_heads=shape["heads"], num_query_groups=shape["groups"],
                        ffn_hidden_size=shape["ffn"], vocab_size=VOCAB)
    return DecoderProvider(cfg).flops_per_token(shape["seq"])


def _run_arm(arm: str, size: str, steps: int, python: str) -> list[float]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [python, __file__, "--worker", arm, "--size", size, "--steps", str(steps), "--out", out.name,
               "--kernels", KERNELS, "--optimizer", OPTIMIZER]
        result = subprocess.run(cmd, capture_output=True, text=True,
                                env={**os.environ, "OMP_NUM_THREADS": str(os.cpu_count())})
        if result.returncode:
            last = [line for line in result.stderr.strip().splitlines() if line.strip()] or ["no output"]
            raise RuntimeError(f"{arm} failed: {last[-1][:160]}")
        return json.loads(Path(out.name).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="default")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (one process per arm each)")
    parser.add_argument("--steps", type=int, default=8, help="steps per process")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each process dropped")
    parser.add_argument("--arms", default="loong,mcore,mcore_local,transformers,torchtitan")
    parser.add_argument("--torchtitan-python", default=None,
                        help="python of a venv with torchtitan (default: this one, if it has it)")
    parser.add_argument("--kernels", choices=("torch", "compile", "auto"), default="torch",
                        help="kernels option of the megatron arms (default: the torch references)")
    parser.add_argument("--optimizer", choices=("fused", "for-loop"), default="fused",
                        help="torch's AdamW implementation in every arm (default: the fused kernel)")
    parser.add_argument("--worker", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = SIZES[args.size]
    global KERNELS, OPTIMIZER
    KERNELS, OPTIMIZER = args.kernels, args.optimizer
    if args.worker:
        Path(args.out).write_text(json.dumps(globals()[f"arm_{args.worker}"](shape, args.steps)))
        return

    arms = [a for a in args.arms.split(",") if a]
    pythons = {arm: sys.executable for arm in arms}
    notes = {}
    if "torchtitan" in arms:
        pythons["torchtitan"] = args.torchtitan_python or sys.executable
        check = subprocess.run([pythons["torchtitan"], "-c", "import torchtitan.models.llama3"],
                               capture_output=True, text=True)
        if check.returncode:
            notes["torchtitan"] = "not run: " + (check.stderr.strip().splitlines() or ["import failed"])[-1]
            arms.remove("torchtitan")
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    for _ in range(args.rounds):
        for arm in arms:
            try:
                times[arm] += _run_arm(arm, args.size, args.steps, pythons[arm])[args.warmup:]
            except RuntimeError as exc:
                notes[arm] = str(exc)
    import torch

    from loong_core.devices.cpu import CPUBackend

    torch.set_num_threads(os.cpu_count())
    peak = CPUBackend().peak_flops(torch.float32)
    flops = _flops_per_token(shape)
    tokens = shape["batch"] * shape["seq"]
    medians = {arm: statistics.median(t) for arm, t in times.items() if t}
    print(f"shape: hidden {shape['hidden']}, layers {shape['layers']}, heads {shape['heads']}/{shape['groups']}, "
          f"ffn {shape['ffn']}, vocab {VOCAB}, seq {shape['seq']}, batch {shape['batch']} "
          f"({tokens} tokens/step); {os.cpu_count()} threads; {args.rounds} rounds x "
          f"{args.steps - args.warmup} timed steps per arm; kernels={KERNELS}; AdamW {OPTIMIZER}; "
          f"peak {peak / 1e9:.0f} GFLOP/s (derived); "
          f"load average {os.getloadavg()[1]:.1f} (5 min)")
    # The fastest step is the least disturbed by other work on a shared machine: shown beside the
    # median, with its own ratio.
    fastest = {arm: min(t) for arm, t in times.items() if t}
    print(f"{'arm':<14}{'median s/step':>14}{'tokens/s':>10}{'vs loong':>10}{'MFU':>8}"
          f"{'min s/step':>12}{'vs loong':>10}")
    for arm in ARMS:
        if arm in medians:
            tps = tokens / medians[arm]
            ratio = (medians["loong"] / medians[arm]) if "loong" in medians else float("nan")
            best = (fastest["loong"] / fastest[arm]) if "loong" in fastest else float("nan")
            mfu = f"{100 * tps * flops / peak:.1f}%" if peak else "n/a"
            print(f"{arm:<14}{medians[arm]:>14.3f}{tps:>10.0f}{ratio:>9.2f}x{mfu:>8}"
                  f"{fastest[arm]:>12.3f}{best:>9.2f}x")
        elif arm in notes:
            print(f"{arm:<14}{notes[arm]}")


if __name__ == "__main__":
    main()
