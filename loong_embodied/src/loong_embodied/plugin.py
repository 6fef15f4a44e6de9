"""The ``embodied`` plugin: registers names only; nothing heavy is imported here."""

from __future__ import annotations

from loong_core.hookspecs import hookimpl


@hookimpl
def loong_register_models(register):
    register("flow_policy", "loong_embodied.policies.flow.model:FlowPolicyProvider",
             config="loong_embodied.policies.flow.config:FlowPolicyConfig", engines=("torch",),
             description="image + state + task encoder with a flow-matching action-chunk head")
    register("pi05", "loong_embodied.policies.pi05.model:Pi05Provider",
             config="loong_embodied.policies.pi05.config:Pi05Config", engines=("torch",),
             description="Pi0.5-style VLA: SigLIP + decoder prefix (image, instruction, binned state) and an "
                         "action expert sharing attention layer by layer, flow matching over action chunks")
    register("groot", "loong_embodied.policies.groot.model:GrootProvider",
             config="loong_embodied.policies.groot.config:GrootConfig", engines=("torch",),
             description="GR00T-N1.5-style VLA: middle-layer VLM features (frozen by default) and a DiT "
                         "flow-matching action head laid out as LeRobot's GR00T N1.5")
    register("xvla", "loong_embodied.policies.xvla.model:XVLAProvider",
             config="loong_embodied.policies.xvla.config:XVLAConfig", engines=("torch",),
             description="X-VLA-style VLA: VLM tokens, per-domain soft prompts and action encoder/decoder, a "
                         "transformer predicting the action chunk, laid out as LeRobot's xvla")
    register("wam", "loong_embodied.policies.wam.provider:WAMProvider",
             config="loong_embodied.policies.wam.config:WAMConfig", engines=("torch",),
             description="world-action model: loong_diffusion's DiT denoises a future camera latent and the "
                         "action chunk jointly (flow matching); actions can be sampled without the future")


@hookimpl
def loong_register_datasets(register):
    register("lerobot", "loong_embodied.data.module:LeRobotDataModule",
             config="loong_embodied.data.config:LeRobotDataConfig",
             description="LeRobot-format robot dataset (v3.0 / v2.1) from a local folder: windows, "
                         "action chunks, normalisation from its stats")


@hookimpl
def loong_register_cli_commands(register):
    register("data metaworld", "loong_embodied.cli.data_cmd:add_parser",
             description="record Meta-World expert demonstrations into a LeRobot v3.0 dataset")
    register("eval rollout", "loong_embodied.cli.eval_cmd:add_parser",
             description="closed-loop success rate of a trained policy in Meta-World")


@hookimpl
def loong_config_search_path():
    return "pkg://loong_embodied.conf"
