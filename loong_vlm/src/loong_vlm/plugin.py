"""The ``vlm`` plugin: registers names only; nothing heavy is imported here.

Components of a VLM are registered as models with a ``role`` in their metadata (``encoder``,
``projector``); the composer ``vlm`` checks the roles of the names its config picks. Foundations
are any registered decoder model (loong_llm's families have no role).
"""

from __future__ import annotations

from loong_core.hookspecs import hookimpl


@hookimpl
def loong_register_models(register):
    register("vlm", "loong_vlm.provider:VLMProvider", config="loong_vlm.config:VLMConfig",
             engines=("megatron",), role="composer",
             description="vision encoder + projector + any decoder foundation, features at image tokens")
    register("vit", "loong_vlm.encoders.vit:ViTEncoder", config="loong_vlm.config:ViTConfig",
             role="encoder", description="plain ViT (SigLIP / InternViT style) on megatron-core layers")
    register("vit_rope2d", "loong_vlm.encoders.rope2d_vit:Rope2DViTEncoder",
             config="loong_vlm.config:Rope2DViTConfig", role="encoder",
             description="Qwen2.5-VL-style ViT: 2D RoPE, RMSNorm, SwiGLU (no window attention yet)")
    register("mlp_projector", "loong_vlm.projectors:MLPProjector",
             config="loong_vlm.config:MLPProjectorConfig", role="projector",
             description="2-layer MLP (tensor parallel), optional spatial patch merging")


@hookimpl
def loong_register_datasets(register):
    register("digits_vqa", "loong_vlm.data.digits:DigitsVQADataModule",
             config="loong_vlm.data.config:DigitsVQAConfig",
             description="scikit-learn's handwritten digits asked 'Which digit is this?' (bundled, offline)")


@hookimpl
def loong_config_search_path():
    return "pkg://loong_vlm.conf"
