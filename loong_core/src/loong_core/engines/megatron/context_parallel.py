"""Context parallelism on the megatron engine: what a run must satisfy, and the batch of a rank.

The sequence of every sample is sharded over the ``parallel.context_parallel_size`` ranks of a
context-parallel group in megatron-core's load-balanced layout (``2 N`` chunks, rank ``r`` holds
chunks ``r`` and ``2N - 1 - r``); the core attention all-gathers K/V
(:mod:`loong_core.engines.megatron.seam.context_parallel`). The loss needs nothing more: with
``calculate_per_token_loss`` every rank returns the loss sum and token count of its own tokens,
megatron-core sums gradients and token counts over the data x context parallel group, and the
engine sums the reported loss over all ranks of the group.
"""

from __future__ import annotations

from loong_core.errors import ConfigError

# Keys of a decoder batch that carry the sequence (dim 1; dim 2 of a dense attention mask; a
# SegmentMask, the packed documents' ids, stays whole: the CP attention reads the ids of the whole
# sequence).
SEQUENCE_KEYS = ("tokens", "labels", "loss_mask", "position_ids", "attention_mask")


def sequence_multiple(parallel) -> int:
    """What the sequence length must be a multiple of: ``2 x CP`` chunks, each local sequence
    also divisible by TP under sequence parallelism."""
    multiple = 2 * parallel.context_parallel_size
    if parallel.sequence_parallel:
        multiple *= parallel.tensor_model_parallel_size
    return multiple


def check_seq_length(seq_length: int, parallel, key: str = "data.seq_length") -> None:
    """Raise a ConfigError naming the nearest valid length when ``seq_length`` cannot be split.

    Raises:
        ConfigError: ``seq_length`` is not a multiple of :func:`sequence_multiple`.
    """
    multiple = sequence_multiple(parallel)
    if parallel.context_parallel_size == 1 or seq_length % multiple == 0:
        return
    lower = max(multiple, seq_length // multiple * multiple)
    upper = lower + multiple if lower < seq_length else lower
    nearest = lower if seq_length - lower <= upper - seq_length else upper
    why = f"2 x parallel.context_parallel_size = 2 x {parallel.context_parallel_size}"
    if parallel.sequence_parallel:
        why += f" x parallel.tensor_model_parallel_size = {parallel.tensor_model_parallel_size}"
    raise ConfigError(
        f"'{key}' = {seq_length} must be a multiple of {why} ({multiple}) under context "
        f"parallelism (load-balanced chunks); the nearest valid length is {nearest}.")


def check_provider(provider, model_name: str) -> None:
    """Raise unless the model shards its batches over the context-parallel group."""
    if not getattr(provider, "supports_context_parallel", False):
        raise ConfigError(
            f"model '{model_name}' does not support parallel.context_parallel_size > 1 yet; "
            "set parallel.context_parallel_size=1.")


def slice_batch(batch: dict, keys: tuple[str, ...] = SEQUENCE_KEYS) -> dict:
    """This rank's share of a decoder batch (the other keys are kept as they are).

    Args:
        batch: The micro batch (``tokens`` ``[b, s]`` gives the sequence length).
        keys: The keys to slice: sequence on dim 1 (dim 2 of a dense ``attention_mask``; a
            :class:`~loong_core.kernels.segment_mask.SegmentMask` is kept whole). Models that
            need some of them at full length (a VLM places vision features by the full token
            ids; MRoPE positions are sliced by megatron-core's rotary embedding) leave them out.

    A no-op without context parallelism. Raises:
        ConfigError: a sequence length that does not split into ``2 x CP`` chunks.
    """
    from megatron.core import parallel_state as ps
    from megatron.core.utils import get_batch_on_this_cp_rank

    size = ps.get_context_parallel_world_size()
    if size == 1:
        return batch
    seq = int(batch["tokens"].shape[1])
    if seq % (2 * size):
        raise ConfigError(f"a batch of sequence length {seq} cannot be split into 2 x "
                          f"parallel.context_parallel_size = {2 * size} chunks; pad the sequences "
                          f"to a multiple of {2 * size}.")
    from loong_core.kernels.segment_mask import SegmentMask

    sharded = get_batch_on_this_cp_rank({k: batch.get(k) for k in keys
                                         if k in batch and not isinstance(batch[k], SegmentMask)})
    return {**batch, **sharded}


def local_sequence(tensor, seq_dim: int):
    """This rank's two load-balanced chunks (``r`` and ``2N - 1 - r``) of a full-length tensor.

    The same layout as :func:`slice_batch`, for tensors built inside the model at full length
    (a VLM's decoder input ``[s, b, h]`` after the vision features are placed, Qwen3-VL's
    deepstack additions). Differentiable: the gradient of the other chunks is zero on this rank,
    and megatron-core sums the gradients of replicated parameters over the CP group. A no-op
    without context parallelism.

    Args:
        tensor: The full-length tensor.
        seq_dim: Its sequence dimension (length a multiple of ``2 x CP``).
    """
    import torch
    from megatron.core import parallel_state as ps

    from loong_core.engines.megatron.seam.context_parallel import local_chunks

    size = ps.get_context_parallel_world_size()
    if size <= 1:  # 0: no process group (a model used outside training)
        return tensor
    shape = tensor.shape
    chunks = tensor.reshape(*shape[:seq_dim], 2 * size, shape[seq_dim] // (2 * size), *shape[seq_dim + 1:])
    index = torch.tensor(local_chunks(size, ps.get_context_parallel_rank()), device=tensor.device)
    local = chunks.index_select(seq_dim, index)
    return local.reshape(*shape[:seq_dim], -1, *shape[seq_dim + 1:])
