"""Builds a tiny Llama checkpoint with random weights and a locally trained tokenizer.

Nothing here touches a model hub: the tokenizer is trained with `tokenizers` on text generated from a
fixed seed, and the weights come from a seeded random init. The same seed gives the same files, so tests
and `loraplex serve` agree on what the model is.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]

_WORDS = (
    "the a an model adapter tenant request token stream serve batch cache engine latency budget "
    "quick brown fox jumps over lazy dog hello world weather today sunny rain cloud river mountain "
    "red green blue yellow one two three four five six seven eight nine ten "
    "what why how when where who is are was were be have has do does can will "
    "and or but if then else for while with from into onto about above below "
    "cat bird fish tree house car road city music book story poem code python data "
    "please thanks sorry yes no maybe good bad new old big small fast slow"
).split()


@dataclass(frozen=True)
class TinyLlamaSpec:
    """Shape of the generated model. Head size 64 is one the CPU attention backend supports."""

    vocab_size: int = 1024
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024
    # Wider than Llama's 0.02 so that greedy argmax has clear margins (exactness tests need them).
    initializer_range: float = 0.1
    seed: int = 1234
    model_id: str = "loraplex/tiny-llama"


# A mid-size shape for benchmarks only: LoRA rank 16 is small next to hidden 1024, as in real models, where on
# the tiny model it is large next to hidden 256. About 90 M parameters (360 MB in float32).
MID_LLAMA = TinyLlamaSpec(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                          num_key_value_heads=4, initializer_range=0.02, model_id="loraplex/mid-llama")


def _corpus(seed: int, num_lines: int = 4000) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(num_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 16))]
        sentence = " ".join(words)
        lines.append(sentence.capitalize() + rng.choice([".", "?", "!", ","]))
    lines.append("".join(chr(c) for c in range(32, 127)))
    return lines


def train_tokenizer(spec: TinyLlamaSpec):
    """A byte-level BPE tokenizer, so any text round-trips without unknown tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(spec.seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="<|im_end|>",
        unk_token="<unk>",
        pad_token="</s>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_llama(out_dir: Path, spec: TinyLlamaSpec = TinyLlamaSpec()) -> Path:
    """Write a float32 Llama checkpoint and tokenizer to `out_dir`; returns it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(spec)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "loraplex_model.json").write_text(json.dumps({"model_id": spec.model_id}) + "\n")
    return out_dir
