"""The shared rectified-flow path: endpoints, broadcasting, dtypes, and both modalities use it."""

import torch

from loong_core.flow_matching import interpolate


def test_interpolate_endpoints_and_velocity():
    x0, noise = torch.randn(3, 4, 5), torch.randn(3, 4, 5)
    x_t, target = interpolate(x0, noise, torch.tensor([0.0, 1.0, 0.25]))
    torch.testing.assert_close(x_t[0], x0[0], rtol=0, atol=0)
    torch.testing.assert_close(x_t[1], noise[1], rtol=0, atol=0)
    torch.testing.assert_close(x_t[2], 0.75 * x0[2] + 0.25 * noise[2])
    torch.testing.assert_close(target, noise - x0)
    # following the velocity from x_t back for time t lands on the data
    torch.testing.assert_close(x_t[2] - 0.25 * target[2], x0[2])


def test_interpolate_keeps_data_dtype_and_fp32_target():
    x0, noise = torch.randn(2, 3, 8, 8).bfloat16(), torch.randn(2, 3, 8, 8).bfloat16()
    x_t, target = interpolate(x0, noise, torch.tensor([0.5, 0.1]))
    assert x_t.dtype == torch.bfloat16 and target.dtype == torch.float32
    assert x_t.shape == x0.shape


def test_diffusion_and_embodied_share_it():
    from loong_diffusion import objective
    from loong_embodied.policies.common import flow

    assert objective.interpolate is interpolate and flow.interpolate is interpolate
