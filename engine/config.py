"""Typed, validated engine configuration, passed down whole."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.dtype import Dtype

# vLLM accepts only these LoRA ranks (vllm/config/lora.py: MaxLoRARanks).
SUPPORTED_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class EngineConfig(BaseModel):
    """What the vLLM engine is started with. One field per knob; the CLI is generated from these."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="Path of a local Hugging Face checkpoint (Llama family).")
    served_model_name: str | None = Field(
        default=None, description="Model id clients use for the base model (default: from the checkpoint)."
    )
    dtype: Dtype = Field(
        default="auto", description="Weights and activations dtype. auto: bfloat16 on a CPU that computes it "
        "natively (AVX512-BF16, AMX), else float32; on GPUs vLLM's choice. float32 is exact against HF."
    )
    max_model_len: int = Field(default=1024, ge=16, description="Context length: prompt plus completion.")
    max_num_seqs: int = Field(default=64, ge=1, description="Most sequences the engine batches per step.")
    max_loras: int = Field(default=4, ge=1, description="Adapters resident in engine slots per batch.")
    max_cpu_loras: int = Field(default=8, ge=1, description="Adapters kept in CPU memory by the engine.")
    max_lora_rank: int = Field(default=64, description="Largest LoRA rank the engine accepts.")
    kv_cache_gib: float = Field(default=1.0, gt=0, le=1024, description="KV-cache size in GiB.")
    seed: int = Field(default=0, description="Engine seed; requests may still set their own.")

    @model_validator(mode="after")
    def _cross_field(self) -> EngineConfig:
        problems = []
        if self.max_lora_rank not in SUPPORTED_LORA_RANKS:
            problems.append(f"max_lora_rank must be one of {SUPPORTED_LORA_RANKS}, got {self.max_lora_rank}")
        if self.max_cpu_loras < self.max_loras:
            problems.append(
                f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self
