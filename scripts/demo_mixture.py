"""How often a mixture of two SmolLM2 demo adapters shows both their styles, by weights (issue #30, item 4).

Each weighting of the pair (default pirate + uppercase) is built with `adapters/compose.py` (exact rank stacking)
and asked the held-out questions greedily with transformers + peft (float32, the server's outputs are the same
tokens); an answer counts when `shows_both` of `adapters/demo/styles.py` holds. Writes JSON to --out.

    python scripts/demo_mixture.py --out docs/results
    python scripts/demo_mixture.py --pair pirate,json-answer --weights 1.0,1.0 0.8,1.2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.compose import Component, compose  # noqa: E402
from adapters.demo.assets import DemoConfig, ensure_demo_assets  # noqa: E402
from adapters.demo.questions import held_out_questions  # noqa: E402
from adapters.demo.styles import shows_both, shows_within, style  # noqa: E402
from adapters.home import demo_home  # noqa: E402

WEIGHTINGS = ((1.0, 1.0), (0.8, 0.8), (1.0, 0.6), (0.6, 1.0), (0.7, 0.7), (0.5, 0.5), (1.5, 0.5), (2.0, 0.6),
              (1.6, 0.9))
MAX_TOKENS = 48


def answers(model, tokenizer, questions: list[str]) -> list[str]:
    import torch

    out = []
    for question in questions:
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                             add_generation_prompt=True)
        ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
        with torch.no_grad():
            generated = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False)
        out.append(tokenizer.decode(generated[0, ids.shape[1]:], skip_special_tokens=True))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--questions", type=int, default=None, help="First N held-out questions (default: all).")
    parser.add_argument("--pair", default="pirate,uppercase", metavar="FIRST,SECOND",
                        help="The two demo styles to mix (default: %(default)s).")
    parser.add_argument("--weights", nargs="+", default=None, metavar="FIRST,SECOND",
                        help="Weightings to try, e.g. 1.5,0.6 2.0,0.8 (default: the nine of the first run).")
    args = parser.parse_args()

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assets = ensure_demo_assets(demo_home(), DemoConfig(demo="smollm2"))
    tokenizer = AutoTokenizer.from_pretrained(assets.model_dir)
    questions = held_out_questions(args.questions)
    first, second = (style(name) for name in args.pair.split(","))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        weightings = WEIGHTINGS if args.weights is None else [tuple(map(float, w.split(","))) for w in args.weights]
        for first_w, second_w in weightings:
            started = time.monotonic()
            folder = compose([Component(first.name, "", first_w, assets.adapter_dirs[first.name]),
                              Component(second.name, "", second_w, assets.adapter_dirs[second.name])],
                             Path(tmp) / f"mix-{first_w}-{second_w}")
            base = AutoModelForCausalLM.from_pretrained(assets.model_dir, dtype=torch.float32)
            model = PeftModel.from_pretrained(base, folder).eval()
            texts = answers(model, tokenizer, questions)
            both = [shows_both(first, second, t) for t in texts]
            row = {"pair": [first.name, second.name], "weights": [first_w, second_w],
                   "rates": {s.name: sum(shows_within(s, t) for t in texts) / len(texts) for s in (first, second)},
                   "both_rate": sum(both) / len(texts), "example": texts[0],
                   "both_examples": [t for t, b in zip(texts, both) if b][:3], "seconds": time.monotonic() - started}
            rows.append(row)
            print(f"{first.name} {first_w} + {second.name} {second_w}: both {row['both_rate']:.2f} "
                  f"({row['rates']}): {texts[0][:100]!r}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"demo-mixture-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps({"questions": len(questions), "max_tokens": MAX_TOKENS, "rows": rows}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
