"""Fixes for megatron-core's DistributedOptimizer on the plain ``torch.optim.Adam`` path.

Without Apex or TransformerEngine (so on CPU, and on GPUs without them) the distributed optimizer
wraps ``torch.optim.Adam``, and three of its checkpoint paths break exact resume (measured in
``shared/design/MCORE_ON_CPU.md``): saving an unstepped optimizer asserts, loading drops or resets
Adam's ``step``, and after loading all params share one ``step`` tensor. They apply on every
device, so they live with the engine, not the CPU backend. Each is a no-op when Apex/TE is used.
"""

from __future__ import annotations

import torch

_APPLIED = False


def _fresh_state_dict(dopt):
    original = dopt.DistributedOptimizer.state_dict

    def state_dict(self):
        if not dopt.HAVE_APEX_OR_TE and len(self.optimizer.state) == 0:
            inner = self.optimizer.state_dict()
            result = {"optimizer": {k: v for k, v in inner.items() if k != "state"}}
            for group in result["optimizer"]["param_groups"]:
                del group["params"]
                group["step"] = 0
            if self.grad_scaler:
                result["grad_scaler"] = self.grad_scaler.state_dict()
            return result
        return original(self)

    dopt.DistributedOptimizer.state_dict = state_dict


def _keep_step_on_load(dopt):
    original = dopt.DistributedOptimizer._set_main_param_and_optimizer_states

    def set_states(self, model_param, tensors):
        if not dopt.HAVE_APEX_OR_TE:
            group_index, index = self.model_param_group_index_map[model_param]
            param = self.optimizer.param_groups[group_index]["params"][index]
            state = self.optimizer.state.get(param, {})
            if "step" in state:
                tensors = {**tensors, "step": state["step"].clone()}
        return original(self, model_param, tensors)

    dopt.DistributedOptimizer._set_main_param_and_optimizer_states = set_states


def _unshare_step(dopt):
    original = dopt.DistributedOptimizer.load_state_dict

    def load_state_dict(self, state_dict):
        result = original(self, state_dict)
        for state in self.optimizer.state.values():
            if torch.is_tensor(state.get("step")):
                state["step"] = state["step"].clone()
        return result

    dopt.DistributedOptimizer.load_state_dict = load_state_dict


def apply() -> None:
    """Install the three fixes once per process."""
    global _APPLIED
    if _APPLIED:
        return
    from megatron.core.optimizer import distrib_optimizer as dopt

    _fresh_state_dict(dopt)
    _keep_step_on_load(dopt)
    _unshare_step(dopt)
    _APPLIED = True
