"""``optim.implementation``: torch's fused optimizer kernels where torch has them."""

from __future__ import annotations

import pytest
import torch

from loong_core.engines import optimizer_implementation as impl
from loong_core.errors import ConfigError


def _params(seed: int = 0, device: str = "cpu"):
    generator = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(shape, generator=generator).to(device)) for shape in ((7, 5), (5,))]
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator).to(device)
    return params


def _adamw(params, **kwargs):
    return torch.optim.AdamW([{"params": params[:1]}, {"params": params[1:], "weight_decay": 0.0}],
                             lr=1e-2, weight_decay=0.1, **kwargs)


@pytest.mark.parametrize("implementation, flags", [("auto", (True, False)), ("fused", (True, False)),
                                                    ("foreach", (None, True)), ("for-loop", (None, False))])
def test_each_choice_steps_as_torch_built_with_it(implementation, flags):
    ours_params, ref_params = _params(), _params()
    ours = _adamw(ours_params)
    chosen = impl.apply([ours, None], implementation)
    assert chosen == ("fused" if implementation == "auto" else implementation)
    for group in ours.param_groups:
        assert (group["fused"], group["foreach"]) == flags
    reference = _adamw(ref_params, fused=flags[0], foreach=flags[1])
    for _ in range(3):
        ours.step()
        reference.step()
    for a, b in zip(ours_params, ref_params):
        assert torch.equal(a, b)


def test_auto_keeps_torchs_default_where_the_device_has_no_fused_kernel():
    meta = _adamw([torch.nn.Parameter(torch.zeros(3, device="meta"))])
    assert impl.apply([meta], "auto") == "default"
    assert meta.param_groups[0]["fused"] is None
    cpu = _adamw(_params())
    assert impl.apply([cpu], "auto", auto_fused=False) == "default"  # the backend said no
    with pytest.raises(ConfigError, match="optim.implementation=fused.*meta"):
        impl.apply([meta], "fused")
    with pytest.raises(ConfigError, match="optim.implementation='fast'"):
        impl.apply([cpu], "fast")


def test_other_optimizers_are_left_alone_and_sgd_fuses_too():
    rmsprop = torch.optim.RMSprop(_params(), lr=0.1)
    sgd = torch.optim.SGD(_params(), lr=0.1, momentum=0.9)
    assert impl.apply([rmsprop, sgd], "auto") == "fused"
    assert rmsprop.param_groups[0]["foreach"] is None and not rmsprop.param_groups[0].get("fused")
    assert sgd.param_groups[0]["fused"] is True
    sgd.step()


def test_loaded_step_counts_are_placed_for_the_fused_kernel():
    params = _params()
    optimizer = _adamw(params)
    impl.apply([optimizer], "fused")
    optimizer.step()
    for p in params:  # as a checkpoint written by another implementation may hold them
        optimizer.state[p]["step"] = optimizer.state[p]["step"].double()
    impl.place_step_counts([optimizer])
    assert all(optimizer.state[p]["step"].dtype == torch.float32 for p in params)
    optimizer.step()
    assert all(float(optimizer.state[p]["step"]) == 2.0 for p in params)


def test_megatron_chain_is_unwrapped():
    class Wrapped:
        def __init__(self, inner):
            self.optimizer = inner

    class Chain:
        def __init__(self, parts):
            self.chained_optimizers = parts

    a, b = _adamw(_params()), _adamw(_params(1))
    assert impl.torch_optimizers(Chain([Wrapped(a), Wrapped(b)])) == [a, b]
    assert impl.torch_optimizers(Wrapped(a)) == [a]


def test_banner_names_the_implementation_auto_takes():
    from types import SimpleNamespace

    from loong_core.config.schema import OptimConfig
    from loong_core.devices.cpu import CPUBackend
    from loong_core.trainer.banner import _optimizer_line

    cfg = SimpleNamespace(optim=OptimConfig())
    device = CPUBackend()
    assert _optimizer_line(cfg, device).startswith("optimizer: adamw (fused, optim.implementation=auto)")
    device.fused_optimizers = False
    assert "(torch's default, optim.implementation=auto)" in _optimizer_line(cfg, device)
    cfg.optim.implementation = "for-loop"
    assert "(for-loop, optim.implementation=for-loop)" in _optimizer_line(cfg, device)
