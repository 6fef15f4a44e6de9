"""The ``diffusion`` plugin: registers names only; nothing heavy is imported here."""

from __future__ import annotations

from loong_core.hookspecs import hookimpl


@hookimpl
def loong_register_models(register):
    register("dit", "loong_diffusion.families.dit.model:DiTProvider",
             config="loong_diffusion.families.dit.config:DiTConfig", engines=("torch",),
             description="small class-conditional DiT (adaLN-Zero) trained with flow matching")
    register("wan", "loong_diffusion.families.wan.model:WanProvider",
             config="loong_diffusion.families.wan.config:WanConfig", engines=("torch",),
             description="Wan 2.1/2.2 video DiT (diffusers WanTransformer3DModel), flow matching")
    register("qwen_image", "loong_diffusion.families.qwen_image.model:QwenImageProvider",
             config="loong_diffusion.families.qwen_image.config:QwenImageConfig", engines=("torch",),
             description="Qwen-Image MMDiT (diffusers QwenImageTransformer2DModel), flow matching")


@hookimpl
def loong_register_datasets(register):
    register("digits", "loong_diffusion.data.digits:DigitsDataModule",
             config="loong_diffusion.data.config:DigitsDataConfig",
             description="scikit-learn's 8x8 handwritten digits, class-conditional images")
    register("synthetic_latents", "loong_diffusion.data.synthetic:SyntheticLatents",
             config="loong_diffusion.data.config:SyntheticLatentsConfig",
             description="deterministic random latents + text embeddings (debug runs, tests)")
    register("latent_cache", "loong_diffusion.data.latent_cache:LatentCache",
             config="loong_diffusion.data.config:LatentCacheConfig",
             description="latents + text embeddings cached by 'loong data encode-latents'")


@hookimpl
def loong_register_checkpoint_adapters(register):
    register("wan", "loong_diffusion.families.wan.adapter:WanAdapter",
             description="diffusers WanTransformer3DModel <-> loong DCP checkpoint")
    register("qwen_image", "loong_diffusion.families.qwen_image.adapter:QwenImageAdapter",
             description="diffusers QwenImageTransformer2DModel <-> loong DCP checkpoint")


@hookimpl
def loong_register_cli_commands(register):
    register("sample", "loong_diffusion.cli.sample_cmd:add_parser",
             description="generate an image grid / GIF from a diffusion checkpoint")
    register("data encode-latents", "loong_diffusion.cli.data_cmd:add_parser",
             description="encode images / videos and captions once into a latent cache")


@hookimpl
def loong_register_default_experiments(register):
    register("dit_digits", priority=5)


@hookimpl
def loong_config_search_path():
    return "pkg://loong_diffusion.conf"
