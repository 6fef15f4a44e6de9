"""Redirects that let megatron-core run on CPU with gloo; applied only by the ``cpu`` backend.

megatron-core calls a few ``torch.cuda`` entry points unconditionally (RNG, current device,
streams, tensor factories with ``device="cuda"``) and has small gaps when neither
TransformerEngine nor Apex is installed. Each patch below is named, documented and idempotent;
``shared/design/MCORE_ON_CPU.md`` records what each one fixes. Checked with megatron-core 0.16.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import torch

logger = logging.getLogger(__name__)

_APPLIED: set[str] = set()
PATCHES: dict[str, object] = {}


def _patch(fn):
    PATCHES[fn.__name__] = fn
    return fn


def _is_cuda_device(device) -> bool:
    if device is None:
        return False
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)


@_patch
def cuda_rng_and_device():
    """Current device, seeding and RNG state of "CUDA" resolve to the CPU device and generator."""

    class _Generators(list):
        def __getitem__(self, index):
            return torch.default_generator

        def __len__(self):
            return 1

    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.manual_seed = torch.manual_seed
    torch.cuda.get_rng_state = lambda device=None: torch.get_rng_state()
    torch.cuda.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
    torch.cuda.random.get_rng_state = torch.cuda.get_rng_state
    torch.cuda.default_generators = _Generators()


@_patch
def rng_lazy_call():
    """Run RNG-restore callbacks now: on a CPU build ``_lazy_call`` only queues them forever."""
    import megatron.core.tensor_parallel.random as mrandom

    mrandom._lazy_call = lambda callback, **kwargs: callback()


@_patch
def causal_mask():
    """The default causal mask is built on CPU instead of ``device="cuda"``."""
    import megatron.core.fusions.fused_softmax as fused_softmax

    @functools.lru_cache(maxsize=8)
    def _mask(sq):
        return torch.triu(torch.ones(sq, sq), diagonal=1).bool()

    fused_softmax.get_default_causal_mask = _mask


_FACTORIES = ("tensor", "zeros", "ones", "empty", "empty_like", "zeros_like", "ones_like", "full",
              "arange", "randn", "rand", "randint", "as_tensor")


@_patch
def cuda_factories():
    """Tensor factories called with a CUDA device allocate on CPU, and ``pin_memory=True``
    (megatron-core stages index tensors in pinned memory before ``.cuda()``, for example the
    context-parallel RoPE slice) is dropped: a CPU-only process has no pinned allocator.

    torch's device context managers (``with torch.device("meta")``, used by transformers'
    ``from_pretrained``) recognise factories by identity through a cached set built on first use;
    it is built here, before the wrappers replace the originals, or ``torch.tensor`` would escape
    the meta context and transformers would skip initialising non-persistent buffers (RoPE
    ``inv_freq`` came out as uninitialised memory).
    """
    from torch.utils._device import _device_constructors

    _device_constructors()
    for name in _FACTORIES:
        original = getattr(torch, name)
        if getattr(original, "_loong_cpu", False):
            continue

        def make(original):
            @functools.wraps(original)
            def factory(*args, **kwargs):
                if _is_cuda_device(kwargs.get("device")):
                    kwargs["device"] = "cpu"
                if kwargs.get("pin_memory"):  # staging for a .cuda() copy; no pinned allocator here
                    kwargs["pin_memory"] = False
                return original(*args, **kwargs)

            factory._loong_cpu = True
            return factory

        setattr(torch, name, make(original))


@_patch
def tensor_cuda():
    """``Tensor.cuda()`` keeps the tensor on CPU."""
    torch.Tensor.cuda = lambda self, *args, **kwargs: self


@_patch
def tensor_type():
    """``Tensor.type()`` reports ``torch.cuda.*`` so optimizer/clip dispatch takes its CUDA path."""
    original = torch.Tensor.type
    if getattr(original, "_loong_cpu", False):
        return

    def type_(self, dtype=None, non_blocking=False, **kwargs):
        if dtype is None:
            name = original(self)
            return name if name.startswith("torch.cuda.") else name.replace("torch.", "torch.cuda.", 1)
        return original(self, dtype, non_blocking, **kwargs)

    type_._loong_cpu = True
    torch.Tensor.type = type_


@_patch
def cuda_streams():
    """Streams, events and synchronize are no-ops (schedules and MoE dispatchers use them)."""

    class _Event:
        def __init__(self, *args, **kwargs):
            pass

        def record(self, *args, **kwargs):
            pass

        def wait(self, *args, **kwargs):
            pass

        def synchronize(self):
            pass

        def query(self):
            return True

    class _Stream:
        def __init__(self, *args, **kwargs):
            pass

        def wait_stream(self, *args):
            pass

        def wait_event(self, *args):
            pass

        def record_event(self, event=None):
            return _Event()

        def synchronize(self):
            pass

        def query(self):
            return True

    default = _Stream()
    torch.cuda.Stream, torch.cuda.Event = _Stream, _Event
    torch.cuda.current_stream = lambda device=None: default
    torch.cuda.default_stream = lambda device=None: default
    torch.cuda.stream = lambda stream=None: contextlib.nullcontext()
    torch.cuda.synchronize = lambda *args, **kwargs: None


@_patch
def sequence_parallel_norm():
    """Torch norms accept sequence parallel; their grads are all-reduced over TP (as TE/Apex)."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    def new(cls, config, hidden_size, eps=1e-5, persist_layer_norm=False,
            zero_centered_gamma=False, normalization="LayerNorm"):
        norm_cls = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": torch.nn.RMSNorm}[config.normalization]
        module = norm_cls(normalized_shape=hidden_size, eps=eps)
        for param in module.parameters():
            param.sequence_parallel = bool(config.sequence_parallel)
        return module

    WrappedTorchNorm.__new__ = new


@_patch
def checkpoint_without_fp8():
    """``CheckpointWithoutOutput(fp8=False)`` must not take the FP8 (TransformerEngine) path."""
    from megatron.core.tensor_parallel.random import CheckpointWithoutOutput

    original = CheckpointWithoutOutput.__init__
    if getattr(original, "_loong_cpu", False):
        return

    def init(self, fp8=False):
        original(self, fp8)
        self.fp8 = bool(fp8)

    init._loong_cpu = True
    CheckpointWithoutOutput.__init__ = init


@_patch
def moe_without_te():
    """``te_general_gemm`` is left undefined by moe_utils when TransformerEngine is missing."""
    import megatron.core.transformer.moe.moe_utils as moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


@_patch
def moe_split_sizes():
    """All-to-all split sizes become lists on CPU too (gloo rejects tensors)."""
    import megatron.core.transformer.moe.token_dispatcher as dispatcher

    original = dispatcher.maybe_move_tensor_to_cpu
    if getattr(original, "_loong_cpu", False):
        return

    def move(tensor, as_numpy=False, record_stream=False):
        if torch.is_tensor(tensor) and not tensor.is_cuda and as_numpy:
            return tensor.numpy()
        return original(tensor, as_numpy=as_numpy, record_stream=record_stream)

    move._loong_cpu = True
    dispatcher.maybe_move_tensor_to_cpu = move


@_patch
def gloo_uneven_collectives():
    """Uneven all-gather / reduce-scatter (MoE with TP>1) emulated with even collectives."""
    import megatron.core.tensor_parallel.mappings as mappings

    gather, reduce_scatter = mappings._gather_along_first_dim, mappings._reduce_scatter_along_first_dim
    if getattr(gather, "_loong_cpu", False):
        return

    def gather_uneven(input_, group, output_split_sizes=None, use_global_buffer=False):
        if output_split_sizes is None or group.size() == 1:
            return gather(input_, group, output_split_sizes, use_global_buffer)
        largest = max(output_split_sizes)
        x = input_.contiguous()
        if x.shape[0] < largest:
            x = torch.cat([x, x.new_zeros((largest - x.shape[0],) + tuple(x.shape[1:]))])
        out = x.new_empty((largest * group.size(),) + tuple(x.shape[1:]))
        torch.distributed.all_gather_into_tensor(out, x, group=group)
        return torch.cat([out[i * largest: i * largest + n] for i, n in enumerate(output_split_sizes)])

    def reduce_scatter_uneven(input_, group, input_split_sizes=None, use_global_buffer=False):
        if input_split_sizes is None or group.size() == 1:
            return reduce_scatter(input_, group, input_split_sizes, use_global_buffer)
        x = input_.contiguous().clone()
        torch.distributed.all_reduce(x, group=group)
        start = sum(input_split_sizes[: group.rank()])
        return x[start: start + input_split_sizes[group.rank()]].contiguous()

    gather_uneven._loong_cpu = True
    mappings._gather_along_first_dim = gather_uneven
    mappings._reduce_scatter_along_first_dim = reduce_scatter_uneven


@_patch
def checkpoint_without_psutil():
    """The async checkpoint writer logs memory through psutil; tolerate its absence."""
    import megatron.core.dist_checkpointing.strategies.filesystem_async as fs_async

    if not getattr(fs_async, "HAVE_PSUTIL", True):
        fs_async._process_memory = lambda: 0


@_patch
def quiet_rng_warning():
    """On CPU the "CUDA" RNG is the CPU RNG; silence the warning every tracker fork logs."""
    logging.getLogger("megatron.core.tensor_parallel.random").setLevel(logging.ERROR)


def apply(names: list[str] | None = None) -> list[str]:
    """Apply the named patches (all by default) once per process; returns the ones applied now."""
    from loong_core.engines.megatron.deferred_compile import import_megatron_core

    import_megatron_core()  # before any patch imports it the ordinary way
    applied = []
    for name in names or list(PATCHES):
        if name in _APPLIED:
            continue
        PATCHES[name]()
        _APPLIED.add(name)
        applied.append(name)
    logger.debug("megatron-core CPU patches applied: %s", applied)
    return applied
