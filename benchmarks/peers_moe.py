"""LLM MoE arms of ``benchmarks/peers.py``: a small Qwen3-MoE shape under loong and transformers.

* ``loong``: ``loong train experiment=qwen3_moe_debug`` at the shape (megatron engine, one rank,
  EP1), step times from its ``metrics.jsonl``;
* ``loong_ep2``: the same on two ranks with ``parallel.expert_model_parallel_size=2`` (each rank
  half the experts and, data-parallel, half the batch; one thread per rank, so the same two cores);
* ``loong_auto``: ``loong`` with its default ``kernels=auto`` (per-op picks; may compile);
* ``loong_bf16``: ``loong`` in bf16 mixed precision (``parallel.mixed_precision=bf16``);
* ``loong_sequential``: ``loong`` with ``model.moe_grouped_gemm=false``: megatron-core's
  ``SequentialMLP`` (one megatron ``MLP`` module per expert) instead of loong's grouped experts;
* ``loong_dense_active``: not a peer but the MoE's lower bound: ``loong train`` of a *dense*
  Qwen3 with the same active compute per token (one SwiGLU of width top-k x expert width in every
  layer, everything else equal: attention, norms, vocabulary, data, optimizer), so its step is
  what the MoE step would cost with no routing, no permutation and one large GEMM instead of one
  per expert. loong's speed-up over this arm (below 1) is how close the MoE runs to a dense model;
* ``transformers``: ``Qwen3MoeForCausalLM`` with its default experts implementation
  (``grouped_mm``: tokens sorted by expert, one grouped GEMM per projection), SDPA attention,
  torch's fused AdamW, clipping, the load-balancing loss (``output_router_logits=True``);
* ``transformers_eager``: the same with ``experts_implementation="eager"`` (a Python loop over the
  experts that received tokens), for reference.

Every arm: the same shape, random initialisation of its own, the Shakespeare tokens loong prepares
(the transformers arms read the prepared ``train.bin`` in order; loong samples it shuffled), the
auxiliary load-balancing loss at coefficient ``AUX``, AdamW (lr 2e-3, weight decay 0.1, betas
(0.9, 0.95), eps 1e-8), clipping at 1.0, fp32.
"""

from __future__ import annotations

import os
import tempfile
import time

SHAPES = {  # Qwen3-30B-A3B's proportions (expert width 3/8 of hidden), scaled down
    "default": dict(hidden=256, layers=4, heads=8, groups=4, head_dim=32, experts=32, topk=4, expert_ffn=128,
                    vocab=4096, seq=256, batch=8),
    "smoke": dict(hidden=64, layers=2, heads=4, groups=2, head_dim=16, experts=16, topk=2, expert_ffn=32,
                  vocab=512, seq=64, batch=2),
}
UNIT = "tokens"
AUX = 1.0e-3
OPTIM = dict(lr=2.0e-3, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, clip=1.0)
_THREADS = os.cpu_count()
_COMMON = f"AdamW fused, fp32, {_THREADS} threads, aux loss {AUX}"
ARMS = {
    "loong": f"`loong train` megatron engine, EP1, grouped experts (model.moe_grouped_gemm default), alltoall "
             f"dispatcher, kernels=torch, {_COMMON}",
    "loong_sequential": f"the same with model.moe_grouped_gemm=false (SequentialMLP experts), {_THREADS} threads",
    "loong_auto": f"the same with kernels=auto (loong's default), {_THREADS} threads",
    "loong_bf16": f"the same in bf16 mixed precision (parallel.mixed_precision=bf16: bf16 parameters and compute, "
                  f"fp32 main parameters, gradient reduction and optimizer state), {_THREADS} threads",
    "loong_ep2": f"`loong train` megatron engine, EP2 on 2 ranks x 1 thread (DP2: half the batch per rank), "
                 f"kernels=torch, AdamW fused, fp32, aux loss {AUX}",
    "loong_dense_active": f"not a peer: the MoE's lower bound, `loong train` of a dense Qwen3 whose SwiGLU is "
                          f"top-k x expert width wide (the MoE's active compute per token), kernels=torch, "
                          f"AdamW fused, fp32, {_THREADS} threads (no router, no aux loss)",
    "transformers": f"Qwen3MoeForCausalLM, experts_implementation=grouped_mm (its default), sdpa, {_COMMON}",
    "transformers_bf16": "the same in bf16 autocast (Trainer(bf16=True) on a CPU: fp32 weights, gradients and "
                         "Adam state)",
    "transformers_eager": f"Qwen3MoeForCausalLM, experts_implementation=eager, sdpa, {_COMMON}",
}


def units(shape: dict) -> int:
    return shape["batch"] * shape["seq"]


def describe(shape: dict) -> str:
    return (f"Qwen3-MoE: hidden {shape['hidden']}, {shape['layers']} layers (all MoE), heads "
            f"{shape['heads']}/{shape['groups']} x {shape['head_dim']}, q/k norm, {shape['experts']} experts "
            f"top-{shape['topk']} (softmax, renormalised), expert width {shape['expert_ffn']}, vocabulary "
            f"{shape['vocab']} (untied), seq {shape['seq']}, batch {shape['batch']} ({units(shape)} tokens/step)")


def run(arm: str, shape: dict, steps: int) -> list[float]:
    if arm.startswith("loong"):
        return _loong(shape, steps, ranks=2 if arm == "loong_ep2" else 1,
                      kernels="auto" if arm == "loong_auto" else "torch",
                      precision="bf16" if arm == "loong_bf16" else "fp32",
                      extra=["model.moe_grouped_gemm=false"] if arm == "loong_sequential" else [],
                      dense=arm == "loong_dense_active")
    return _transformers(shape, steps, "eager" if arm == "transformers_eager" else "grouped_mm",
                         "bf16" if arm == "transformers_bf16" else "fp32")


def _loong(shape: dict, steps: int, ranks: int, kernels: str, precision: str, extra: list[str],
           dense: bool = False) -> list[float]:
    from loong_core.testing import read_metrics, run_train

    if dense:  # the same active compute per token, without experts (``loong_dense_active``)
        model = ["model=qwen3_debug", f"model.ffn_hidden_size={shape['topk'] * shape['expert_ffn']}"]
    else:
        model = [f"model.ffn_hidden_size={shape['expert_ffn']}", f"model.num_experts={shape['experts']}",
                 f"model.moe_router_topk={shape['topk']}", f"model.moe_ffn_hidden_size={shape['expert_ffn']}",
                 f"model.moe_aux_loss_coeff={AUX}"]
    with tempfile.TemporaryDirectory() as run_dir:
        run_train(["experiment=qwen3_moe_debug", *model, f"model.hidden_size={shape['hidden']}",
                   f"model.num_layers={shape['layers']}", f"model.num_attention_heads={shape['heads']}",
                   f"model.num_query_groups={shape['groups']}", f"model.kv_channels={shape['head_dim']}",
                   "model.untie_embeddings_and_output_weights=true",
                   f"data.vocab_size={shape['vocab']}", f"data.seq_length={shape['seq']}",
                   f"trainer.micro_batch_size={shape['batch'] // ranks}",
                   f"trainer.global_batch_size={shape['batch']}", f"trainer.train_iters={steps}",
                   f"optim.lr={OPTIM['lr']}", f"optim.min_lr={OPTIM['lr']}", "optim.lr_warmup_iters=0",
                   f"optim.weight_decay={OPTIM['weight_decay']}", f"optim.clip_grad={OPTIM['clip']}",
                   "optim.implementation=fused", f"kernels={kernels}", f"parallel.mixed_precision={precision}",
                   f"parallel.expert_model_parallel_size={ranks}",
                   "trainer.log_interval=1", "trainer.eval_interval=0", "trainer.eval_at_start=false",
                   "trainer.save_at_end=false", "trainer.progress_bar=false", "trainer.tensorboard=false",
                   f"trainer.run_dir={run_dir}", *extra], nproc=ranks,
                  env={"OMP_NUM_THREADS": str(max(1, _THREADS // ranks))}, timeout=900)
        return [r["step_time"] for r in sorted(read_metrics(run_dir), key=lambda r: r["step"])]


def _shakespeare_tokens(shape: dict, steps: int):
    """``steps`` batches ``(tokens, labels)`` cut in order from loong's prepared ``train.bin``."""
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from loong_llm.data.config import TextDataConfig
    from loong_llm.data.text_data import TextDataModule

    data = TextDataModule(TextDataConfig(name="text", corpus="shakespeare", vocab_size=shape["vocab"],
                                         seq_length=shape["seq"], valid_fraction=0.05))
    data.prepare()
    documents = IndexedDataset(str(data.data_dir / "train"))
    stream = np.concatenate([documents[i] for i in range(len(documents))]).astype(np.int64)
    window, per_step = shape["seq"] + 1, shape["batch"] * (shape["seq"] + 1)
    for step in range(steps):
        start = (step * per_step) % (len(stream) - per_step)
        chunk = torch.from_numpy(stream[start:start + per_step]).view(shape["batch"], window)
        yield chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


def _transformers(shape: dict, steps: int, experts: str, precision: str) -> list[float]:
    import peers_harness
    import torch
    import transformers as tf

    torch.set_num_threads(_THREADS)
    torch.manual_seed(0)
    config = tf.Qwen3MoeConfig(
        vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=shape["expert_ffn"],
        num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"], num_key_value_heads=shape["groups"],
        head_dim=shape["head_dim"], max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, moe_intermediate_size=shape["expert_ffn"],
        num_experts=shape["experts"], num_experts_per_tok=shape["topk"], norm_topk_prob=True,
        output_router_logits=True, router_aux_loss_coef=AUX, attn_implementation="sdpa",
        experts_implementation=experts)
    model = tf.Qwen3MoeForCausalLM(config).train()
    assert model.config._experts_implementation == experts, model.config._experts_implementation
    optimizer = torch.optim.AdamW(model.parameters(), lr=OPTIM["lr"], betas=OPTIM["betas"], eps=OPTIM["eps"],
                                  weight_decay=OPTIM["weight_decay"], fused=True)
    times = []
    for tokens, labels in list(_shakespeare_tokens(shape, steps)):
        start = time.perf_counter()
        with peers_harness.peer_autocast(precision):
            out = model(input_ids=tokens, use_cache=False)
            loss = torch.nn.functional.cross_entropy(out.logits.float().view(-1, shape["vocab"]), labels.view(-1))
        (loss + AUX * out.aux_loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIM["clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return times
