"""Typed, validated engine configuration, passed down whole."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from adapters.base_model import BaseModelError, base_model_spec
from engine.dtype import Dtype, cpu_flags
from engine.lora_budget import MAX_AUTO_CPU_LORAS, MAX_AUTO_LORAS, LoraSizes, dtype_bytes, size_loras, slot_bytes

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
    max_loras: int | None = Field(
        default=None, ge=1, description="Adapters resident in engine slots, the most distinct adapters a batch runs "
        f"(default: as many slots as lora_slots_gib holds, at most {MAX_AUTO_LORAS})."
    )
    max_cpu_loras: int | None = Field(
        default=None, ge=1, description="Adapters kept in CPU memory by the engine (default: as many as "
        f"lora_cpu_gib holds, at least max_loras, at most {MAX_AUTO_CPU_LORAS})."
    )
    max_lora_rank: int = Field(default=64, description="Largest LoRA rank the engine accepts.")
    lora_slots_gib: float = Field(
        default=0.5, gt=0, description="Memory that sizes max_loras when it is not given: engine slots are "
        "preallocated at max_lora_rank for every projection of every layer, in the serving dtype (default: 0.5)."
    )
    lora_cpu_gib: float = Field(
        default=2.0, gt=0, description="Memory that sizes max_cpu_loras when it is not given, each adapter counted "
        "at max_lora_rank (default: 2.0)."
    )
    kv_cache_gib: float = Field(default=1.0, gt=0, le=1024, description="KV-cache size in GiB.")
    seed: int = Field(default=0, description="Engine seed; requests may still set their own.")

    @model_validator(mode="before")
    @classmethod
    def _sized_from_the_checkpoint(cls, data: object) -> object:
        """max_loras / max_cpu_loras not given: sized from the checkpoint's shapes. A checkpoint that cannot be read
        leaves them None, which `_cross_field` reports beside any other problem."""
        if not isinstance(data, dict) or (data.get("max_loras") is not None
                                          and data.get("max_cpu_loras") is not None):
            return data
        try:
            sizes = _lora_sizes(data)
        except (BaseModelError, KeyError, TypeError, ValueError):
            return data
        return {**data, "max_loras": sizes.max_loras, "max_cpu_loras": sizes.max_cpu_loras}

    @model_validator(mode="after")
    def _cross_field(self) -> EngineConfig:
        problems = []
        if self.max_lora_rank not in SUPPORTED_LORA_RANKS:
            problems.append(f"max_lora_rank must be one of {SUPPORTED_LORA_RANKS}, got {self.max_lora_rank}")
        if self.max_loras is None or self.max_cpu_loras is None:
            problems.append(f"max_loras and max_cpu_loras, when not given, are sized from the checkpoint: "
                            f"{_unreadable(self.model)}")
        elif self.max_cpu_loras < self.max_loras:
            problems.append(
                f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _lora_sizes(data: dict) -> LoraSizes:
    """The slot counts of raw config `data`, from its checkpoint and the fields' defaults for what it lacks."""
    fields = EngineConfig.model_fields
    value = lambda name: data[name] if data.get(name) is not None else fields[name].default  # noqa: E731
    spec = base_model_spec(Path(data["model"]))
    one_slot = slot_bytes(spec, int(value("max_lora_rank")), dtype_bytes(value("dtype"), cpu_flags()))
    return size_loras(one_slot, float(value("lora_slots_gib")), float(value("lora_cpu_gib")), data.get("max_loras"),
                      data.get("max_cpu_loras"))


def _unreadable(model: str) -> str:
    try:
        base_model_spec(Path(model))
    except BaseModelError as e:
        return str(e)
    return f"{model} was not readable when the config was made"
