"""What every action-chunk policy provider shares on the torch engine."""

from __future__ import annotations

import abc
from typing import Any

from loong_core.engines.model_provider import ModelProvider


class ActionPolicyProvider(ModelProvider):
    """Torch-engine provider of a policy that predicts action chunks.

    Throughput is counted in samples (reported as tokens/s); FLOPs are not modelled, so MFU is not
    reported.
    """

    engines = ("torch",)
    reported_metrics = ("loss",)
    throughput_unit = "frames"

    def tokens_in(self, batch: dict) -> int:
        """Frames (observation -> action-chunk samples) in the micro batch (``frames/s``)."""
        return int(batch["action"].shape[0])

    def flops_per_token(self, seq_length: int) -> float:
        """Not modelled."""
        return 0.0


class FlowMatchingVLAProvider(ActionPolicyProvider, abc.ABC):
    """A VLA trained by flow matching over its action chunk; subclasses name the policy class and
    the flow-time distribution.

    Attributes:
        policy_class: The ``nn.Module`` built from the config.
    """

    policy_class: type

    @abc.abstractmethod
    def flow_time(self, u):
        """Flow time from uniform draws ``u`` (the policy's timestep distribution)."""

    def build_torch_model(self):
        return self.policy_class(self.config)

    def torch_forward_step(self, model: Any, batch: dict):
        from loong_embodied.policies.common import flow

        actions = flow.chunk_actions(batch)
        noise, t = flow.flow_draws(actions, batch.get("noise_seed"), self.flow_time)
        x_t, target = flow.interpolate(actions, noise, t)
        return flow.masked_flow_loss(model(batch, x_t, t), target, batch)
