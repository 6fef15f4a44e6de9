"""Config of the DeepSeek-V3.2 family (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass

from loong_core.config.rules import non_negative, positive
from loong_core.errors import ConfigError
from loong_llm.families.deepseek_v3.config import DeepSeekV3Config


@dataclass
class DeepSeekV32Config(DeepSeekV3Config):
    """DeepSeek-V3.2: DeepSeek-V3 plus sparse attention in every layer (megatron-core's
    ``dsa_*`` names).

    Attributes:
        dsa_indexer_n_heads: Lightning-indexer heads (HF ``index_n_heads``).
        dsa_indexer_head_dim: Indexer head width (HF ``index_head_dim``).
        dsa_indexer_topk: Keys each query attends to (HF ``index_topk``); at least the sequence
            length makes the attention dense.
        dsa_indexer_loss_coeff: Weight of the indexer's KL loss (0: the indexer does not train).
        dsa_indexer_use_sparse_loss: The KL runs over the selected keys only (DeepSeek's sparse
            stage) instead of over every earlier key.
        dsa_indexer_dense_warmup: Dense warm-up stage: the main attention stays dense and the
            indexer is fitted to its distribution over every earlier key.
    """

    dsa_indexer_n_heads: int = positive(64)
    dsa_indexer_head_dim: int = positive(128)
    dsa_indexer_topk: int = positive(2048)
    dsa_indexer_loss_coeff: float = non_negative(0.0)
    dsa_indexer_use_sparse_loss: bool = False
    dsa_indexer_dense_warmup: bool = False

    def check(self, run, path: str) -> None:
        """DeepSeek-V3 rules plus what sparse attention needs."""
        super().check(run, path)
        if not self.q_lora_rank:
            raise ConfigError(f"'{path}.q_lora_rank' must be set: the DSA indexer reads the "
                              "compressed query.")
        if self.dsa_indexer_head_dim < self.qk_pos_emb_head_dim:
            raise ConfigError(f"'{path}.dsa_indexer_head_dim' = {self.dsa_indexer_head_dim} must be "
                              f">= {path}.qk_pos_emb_head_dim = {self.qk_pos_emb_head_dim} (RoPE "
                              "rotates that many indexer channels).")
        if run.parallel.context_parallel_size > 1:
            raise ConfigError(
                "'parallel.context_parallel_size' > 1 with model 'deepseek_v32': DeepSeek sparse "
                "attention selects keys over the whole sequence and is not split over CP ranks "
                "yet; use parallel.context_parallel_size=1 (TP, PP, EP and DP work).")
