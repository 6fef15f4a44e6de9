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
    register("qwen2_5_vl", "loong_vlm.qwen2_5_vl.provider:Qwen25VLProvider",
             config="loong_vlm.qwen2_5_vl.config:Qwen25VLConfig", engines=("megatron",), role="composer",
             description="Qwen2.5-VL: qwen2_5_vit + qwen2_5_merger + Qwen2.5 decoder with MRoPE (HF interop)")
    register("qwen2_5_vit", "loong_vlm.qwen2_5_vl.vision:Qwen25VisionEncoder",
             config="loong_vlm.qwen2_5_vl.config:Qwen25ViTConfig", role="encoder",
             description="Qwen2.5-VL ViT: dynamic resolution, 2D RoPE, window attention, RMSNorm, SwiGLU")
    register("qwen2_5_merger", "loong_vlm.qwen2_5_vl.merger:Qwen25PatchMerger",
             config="loong_vlm.qwen2_5_vl.config:Qwen25MergerConfig", role="projector",
             description="Qwen2.5-VL patch merger: RMSNorm (or LayerNorm: Kimi), 2x2 consecutive patches, MLP")
    register("qwen3_vl", "loong_vlm.qwen3_vl.model:Qwen3VLProvider",
             config="loong_vlm.qwen3_vl.config:Qwen3VLConfig", engines=("megatron",), role="composer",
             description="Qwen3-VL: qwen3_vit (merger + deepstack) + Qwen3 decoder with interleaved MRoPE (HF interop)")
    register("qwen3_vl_moe", "loong_vlm.qwen3_vl.model:Qwen3VLMoeProvider",
             config="loong_vlm.qwen3_vl.config:Qwen3VLMoeConfig", engines=("megatron",), role="composer",
             description="Qwen3-VL-MoE: qwen3_vit + Qwen3-MoE decoder (EP), interleaved MRoPE (HF interop)")
    register("internvl", "loong_vlm.internvl.provider:InternVLProvider",
             config="loong_vlm.internvl.config:InternVLConfig", engines=("megatron",), role="composer",
             description="InternVL 2.5/3/3.5: internvit tiles + pixel-shuffle MLP + any decoder (HF interop)")
    register("internvit", "loong_vlm.internvl.vision:InternViTEncoder",
             config="loong_vlm.internvl.config:InternViTConfig", role="encoder",
             description="InternViT: class token, absolute positions, layer scale, optional q/k RMSNorm")
    register("kimi_k25", "loong_vlm.kimi_k25.provider:KimiK25Provider",
             config="loong_vlm.kimi_k25.config:KimiK25Config", engines=("megatron",), role="composer",
             description="Kimi-K2.5: moonvit + LayerNorm patch merger + DeepSeek-V3 decoder (HF interop)")
    register("moonvit", "loong_vlm.encoders.moonvit:MoonViTEncoder",
             config="loong_vlm.kimi_k25.config:MoonViTConfig", role="encoder",
             description="MoonViT: native resolution, bicubic-resampled positions, frame sinusoids, clip attention")
    register("qwen3_vit", "loong_vlm.encoders.qwen3_vit:Qwen3ViTEncoder",
             config="loong_vlm.qwen3_vl.config:Qwen3ViTConfig", role="encoder",
             description="Qwen3-VL ViT: dynamic resolution, resampled learned positions, 2D RoPE, deepstack mergers")
    register("ernie4_5_vl", "loong_vlm.ernie4_5_vl.provider:Ernie45VLProvider",
             config="loong_vlm.ernie4_5_vl.config:Ernie45VLConfig", engines=("megatron",), role="composer",
             description="ERNIE-4.5-VL: ernie_vit + ernie_resampler + modality-isolated MoE decoder (HF interop)")
    register("ernie_vit", "loong_vlm.encoders.ernie_vit:ErnieViTEncoder",
             config="loong_vlm.ernie4_5_vl.config:ErnieViTConfig", role="encoder",
             description="ERNIE-4.5-VL ViT: dynamic resolution, bias-free patch embedding, 2D RoPE, quick_gelu")
    register("ernie_resampler", "loong_vlm.ernie4_5_vl.resampler:ErnieResampler",
             config="loong_vlm.ernie4_5_vl.config:ErnieResamplerConfig", role="projector",
             description="ERNIE-4.5-VL resampler: 2x2 spatial then 2-frame temporal merging MLPs, RMSNorm")
    register("ernie4_5_vl_text", "loong_vlm.ernie4_5_vl.text:ErnieVLTextProvider",
             config="loong_vlm.ernie4_5_vl.config:ErnieVLTextConfig", engines=("megatron",),
             description="ERNIE-4.5-VL decoder: text / vision experts by token modality, shared experts, 3D RoPE")
    register("identity", "loong_vlm.qwen3_vl.model:IdentityProjector",
             config="loong_vlm.qwen3_vl.config:IdentityProjectorConfig", role="projector",
             description="no projection, for encoders that already output the foundation's width (qwen3_vit)")


@hookimpl
def loong_register_checkpoint_adapters(register):
    register("qwen2_5_vl", "loong_vlm.qwen2_5_vl.hf_adapter:Qwen25VLHFAdapter",
             description="Hugging Face <-> loong for Qwen2.5-VL (vision tower included)")
    register("qwen3_vl", "loong_vlm.qwen3_vl.hf_adapter:Qwen3VLHFAdapter",
             description="Hugging Face <-> loong for Qwen3-VL (vision tower and deepstack mergers included)")
    register("internvl", "loong_vlm.internvl.hf_adapter:InternVLHFAdapter",
             description="Hugging Face <-> loong for InternVL (vision tower, projector, any text family)")
    register("kimi_k25", "loong_vlm.kimi_k25.hf_adapter:KimiK25HFAdapter",
             description="Hugging Face <-> loong for Kimi-K2.5 (MoonViT, projector, DeepSeek-V3 decoder)")
    register("ernie4_5_vl", "loong_vlm.ernie4_5_vl.hf_adapter:Ernie45VLHFAdapter",
             description="Hugging Face <-> loong for ERNIE-4.5-VL (ViT, resampler, modality-isolated MoE decoder)")
    register("qwen3_vl_moe", "loong_vlm.qwen3_vl.moe_hf_adapter:Qwen3VLMoeHFAdapter",
             description="Hugging Face <-> loong for Qwen3-VL-MoE (stacked experts, vision tower included)")


@hookimpl
def loong_register_datasets(register):
    register("digits_vqa", "loong_vlm.data.digits:DigitsVQADataModule",
             config="loong_vlm.data.config:DigitsVQAConfig",
             description="scikit-learn's handwritten digits asked 'Which digit is this?' (bundled, offline)")
    register("llava", "loong_vlm.data.llava:LlavaDataModule", config="loong_vlm.data.config:LlavaConfig",
             description="LLaVA-style JSON/JSONL conversations with images and video frames, dynamic resolution")


@hookimpl
def loong_register_cli_commands(register):
    register("eval vqa", "loong_vlm.cli.eval_vqa_cmd:add_parser",
             description="exact-match accuracy of a trained VLM's greedy answers (digits_vqa / llava runs)")


@hookimpl
def loong_config_search_path():
    return "pkg://loong_vlm.conf"
