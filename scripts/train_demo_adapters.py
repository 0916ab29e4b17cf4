"""Trains the SmolLM2 demo adapters (adapters/demo/trained/NAME) and measures what they do.

    python scripts/train_demo_adapters.py                 # base answers, four adapters, evaluation
    python scripts/train_demo_adapters.py --eval-only     # evaluate the adapters already in --out

The data is made here: the base model's own greedy answers (first sentence) to generated questions
(adapters/demo/questions.py), rewritten by each style's rule (adapters/demo/styles.py). The tool-calling adapter
(`tool-caller`) learns, with the demo's tools in the prompt (adapters/demo/tool_questions.py, rendered by the demo's
tool template), to answer a question a tool fits with that call in the hermes format, and any other question with
the base model's own answer. Each adapter is a PEFT LoRA trained with a fixed seed on one thread, so the same
command on the same software gives the same files. The evaluation asks the held-out questions (topics no training
question mentions) of the base model and of each adapter, greedy, and counts in how many answers each style shows;
and asks the held-out tool questions (cities, amounts and phrasings no training question uses) of the base model
and the tool-caller, and counts right, valid and spurious calls. It writes adapters/demo/trained/EVALUATION.json.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from adapters.demo.assets import SMOLLM2_TOOL_TEMPLATE  # noqa: E402
from adapters.demo.questions import held_out_questions, training_questions  # noqa: E402
from adapters.demo.smollm2 import MODEL_ID, TRAINED_ADAPTERS, convert_smollm2, packaged_gguf  # noqa: E402
from adapters.demo.styles import STYLES, behaviour_rates, style  # noqa: E402
from adapters.demo.tool_questions import ADAPTER as TOOL_ADAPTER  # noqa: E402
from adapters.demo.tool_questions import (  # noqa: E402
    ToolCase,
    held_out_cases,
    tool_call_rates,
    training_cases,
    unfit_call_text,
)
from adapters.home import data_home  # noqa: E402
from api.openai.tool_parser import parse_hermes  # noqa: E402

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
END_OF_TURN = "<|im_end|>"


@dataclass(frozen=True)
class TrainSpec:
    rank: int
    alpha: int
    targets: tuple[str, ...]
    steps: int
    learning_rate: float = 1e-3
    batch_size: int = 8


SPECS = {
    "pirate": TrainSpec(rank=16, alpha=32, targets=("q_proj", "v_proj"), steps=100),
    "uppercase": TrainSpec(rank=8, alpha=16, targets=ATTENTION + MLP, steps=200),
    "json-answer": TrainSpec(rank=8, alpha=16, targets=ATTENTION, steps=100),
    TOOL_ADAPTER: TrainSpec(rank=8, alpha=16, targets=ATTENTION, steps=120),
}
Example = tuple[list[int], int]  # prompt and target token ids, and where the target starts


def say(message: str) -> None:
    print(f"[train] {message}", file=sys.stderr, flush=True)


def first_sentence(text: str) -> str | None:
    """The answer's first sentence, or None when it has none that ends within the text."""
    text = text.strip()
    for i, char in enumerate(text):
        if char in ".!?" and (i + 1 == len(text) or text[i + 1] in " \n"):
            return text[: i + 1] if i >= 10 else None
    return None


def chat_prompt(tokenizer, question: str, tools: list[dict] | None = None) -> list[int]:
    """The token ids loraplex's chat route sends for one user message (api/openai/chat.py); with tools, as the
    demo server renders them (its --chat-template)."""
    template = {"tools": tools, "chat_template": SMOLLM2_TOOL_TEMPLATE.read_text()} if tools else {}
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True, **template)
    return tokenizer.encode(text, add_special_tokens=False)


def greedy_answers(model, tokenizer, questions: list[str], max_new_tokens: int, batch_size: int = 16) -> list[str]:
    """Greedy answers, batched with left padding, decoded without special tokens."""
    return greedy_replies(model, tokenizer, [chat_prompt(tokenizer, q) for q in questions], max_new_tokens,
                          batch_size)


def greedy_replies(model, tokenizer, all_prompts: list[list[int]], max_new_tokens: int,
                   batch_size: int = 16) -> list[str]:
    """Greedy replies to prompts (token ids), batched with left padding, decoded without special tokens."""
    import torch

    answers = []
    for start in range(0, len(all_prompts), batch_size):
        prompts = all_prompts[start:start + batch_size]
        width = max(map(len, prompts))
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        answers += [tokenizer.decode(row[width:], skip_special_tokens=True).strip() for row in out]
        say(f"  answered {len(answers)}/{len(all_prompts)}")
    return answers


def base_answers(model_dir: Path, work: Path, seed: int, count: int) -> list[tuple[str, str]]:
    """(question, first sentence of the base model's greedy answer), cached in the work folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = work / f"base-answers-seed{seed}-n{count}.json"
    if cache.is_file():
        return [tuple(pair) for pair in json.loads(cache.read_text())]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    questions = training_questions(seed)[:count]
    say(f"base model answers {len(questions)} generated questions")
    answers = greedy_answers(model, tokenizer, questions, max_new_tokens=48)
    pairs = [(q, s) for q, a in zip(questions, answers) if (s := first_sentence(a)) is not None]
    cache.write_text(json.dumps(pairs, indent=1, ensure_ascii=False) + "\n")
    return pairs


def encode(tokenizer, question: str, target: str, tools: list[dict] | None = None) -> Example:
    """Prompt and target token ids, and where the target starts (the loss covers the target only)."""
    prompt = chat_prompt(tokenizer, question, tools)
    return prompt + tokenizer.encode(target + END_OF_TURN, add_special_tokens=False), len(prompt)


def style_examples(tokenizer, name: str, pairs: list[tuple[str, str]]) -> list[Example]:
    return [encode(tokenizer, q, style(name).rewrite(a)) for q, a in pairs]


def tool_examples(model_dir: Path, tokenizer, pairs: list[tuple[str, str]], seed: int) -> list[Example]:
    """A call where a tool fits; elsewhere the base model's own answer (first sentence), asked without tools."""
    import torch
    from transformers import AutoModelForCausalLM

    answers = dict(pairs)
    cases = training_cases(seed, list(answers))
    unanswered = sorted({c.question for c in cases if c.call is None and c.question not in answers})
    if unanswered:
        say(f"base model answers {len(unanswered)} tool questions whose tool is not offered")
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        for question, answer in zip(unanswered, greedy_answers(model, tokenizer, unanswered, max_new_tokens=48)):
            answers[question] = first_sentence(answer) or answer.strip()
    return [encode(tokenizer, c.question, c.target() or answers[c.question], c.tools) for c in cases]


def train_one(model_dir: Path, name: str, spec: TrainSpec, examples: list[Example], pad_id: int, seed: int,
              out: Path) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, target_modules=list(spec.targets), lora_dropout=0.0,
                        bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    inner = model.get_base_model()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=spec.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / spec.steps)
    rng = random.Random(seed)
    order: list[int] = []
    started, losses = time.perf_counter(), []
    model.train()
    for step in range(spec.steps):
        if len(order) < spec.batch_size:
            order += rng.sample(range(len(examples)), len(examples))
        batch = [examples[order.pop()] for _ in range(spec.batch_size)]
        loss = _batch_loss(inner, batch, pad_id)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if step % 10 == 9 or step == spec.steps - 1:
            say(f"  {name} step {step + 1}/{spec.steps} loss {sum(losses[-10:]) / len(losses[-10:]):.3f} "
                f"({time.perf_counter() - started:.0f} s)")
    seconds = time.perf_counter() - started
    model.save_pretrained(out, safe_serialization=True)
    config_path = out / "adapter_config.json"
    adapter_config = json.loads(config_path.read_text())
    adapter_config["base_model_name_or_path"] = MODEL_ID  # not the training machine's path
    adapter_config["target_modules"] = sorted(adapter_config["target_modules"])  # PEFT writes a set's order
    config_path.write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
    (out / "README.md").unlink(missing_ok=True)  # PEFT's model card template: nothing here
    last = losses[-10:]
    return {"examples": len(examples), "seconds": round(seconds, 1), "final_loss": round(sum(last) / len(last), 4),
            **asdict(spec)}


def _batch_loss(inner, batch: list[Example], pad_id: int):
    """Mean cross-entropy over the target tokens; logits are computed only where a target token is predicted."""
    import torch

    width = max(len(ids) for ids, _ in batch)
    ids = torch.tensor([ids + [pad_id] * (width - len(ids)) for ids, _ in batch])
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in batch])
    hidden = inner.model(input_ids=ids, attention_mask=mask).last_hidden_state
    rows, cols, targets = [], [], []
    for row, (tokens, start) in enumerate(batch):
        for position in range(start, len(tokens)):
            rows.append(row)
            cols.append(position - 1)
            targets.append(tokens[position])
    logits = inner.lm_head(hidden[rows, cols])
    return torch.nn.functional.cross_entropy(logits, torch.tensor(targets))


def evaluate(model_dir: Path, adapters: Path, count: int, max_new_tokens: int) -> dict:
    """Greedy answers of the base model and each adapter to the held-out questions, and the style rates."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    questions = held_out_questions(count)
    answers: dict[str | None, list[str]] = {}
    for name in [None, *(n for n in TRAINED_ADAPTERS if n != TOOL_ADAPTER and (adapters / n).is_dir())]:
        say(f"evaluating {name or 'the base model'} on {len(questions)} held-out questions")
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        if name is not None:
            model = PeftModel.from_pretrained(model, adapters / name)
        answers[name] = greedy_answers(model.eval(), tokenizer, questions, max_new_tokens)
    rates = behaviour_rates(answers)
    return {"questions": questions, "max_new_tokens": max_new_tokens,
            "rates": {name or MODEL_ID: r for name, r in rates.items()},
            "answers": {name or MODEL_ID: a for name, a in answers.items()}}


def _calls_of(reply: str, case: ToolCase) -> list[tuple[str, dict]]:
    parsed = parse_hermes(reply, frozenset(t["function"]["name"] for t in case.tools))
    return [(c.function.name, json.loads(c.function.arguments)) for c in parsed.calls]


def evaluate_tools(model_dir: Path, adapters: Path, max_new_tokens: int) -> dict:
    """Greedy replies of the base model and the tool-caller to the held-out tool questions, parsed as the server's
    `--tool-call-parser hermes` parses them, and the rates of right, valid and spurious calls."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    cases = held_out_cases(held_out_questions())
    prompts = [chat_prompt(tokenizer, c.question, c.tools) for c in cases]
    replies, rates = {}, {}
    for name in (None, TOOL_ADAPTER):
        say(f"evaluating {name or 'the base model'} on {len(cases)} held-out tool questions")
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        if name is not None:
            model = PeftModel.from_pretrained(model, adapters / name)
        replies[name or MODEL_ID] = greedy_replies(model.eval(), tokenizer, prompts, max_new_tokens)
        calls = [_calls_of(reply, case) for reply, case in zip(replies[name or MODEL_ID], cases)]
        rates[name or MODEL_ID] = {**tool_call_rates(cases, calls),
                                   "unfit_call_text": unfit_call_text(cases, replies[name or MODEL_ID])}
    return {"questions": [{"question": c.question, "tools": [t["function"]["name"] for t in c.tools],
                           "call": c.call} for c in cases],
            "max_new_tokens": max_new_tokens, "rates": rates, "replies": replies}


def rates_table(evaluation: dict) -> str:
    names = [s.name for s in STYLES]
    lines = ["| model | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for model, rates in evaluation["rates"].items():
        lines.append(f"| {model} | " + " | ".join(f"{rates[n]:.0%}" for n in names) + " |")
    return "\n".join(lines)


def tool_rates_table(evaluation: dict) -> str:
    lines = ["| model | right calls | valid calls | spurious calls | call text where no tool fits |",
             "|---|---|---|---|---|"]
    for model, r in evaluation["rates"].items():
        lines.append(f"| {model} | {r['right_calls']:.0%} | {r['valid_calls']:.0%} | {r['spurious_calls']:.0%} | "
                     f"{r.get('unfit_call_text', 0):.0%} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "adapters" / "demo" / "trained",
                        help="where the adapters and EVALUATION.json go (default: adapters/demo/trained)")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="the converted base model and the cached base answers (default: $LORAPLEX_HOME/"
                        "train-demo-adapters)")
    parser.add_argument("--adapters", nargs="*", choices=list(SPECS), default=list(SPECS),
                        help="which adapters to train (default: all)")
    parser.add_argument("--examples", type=int, default=320, help="generated questions asked of the base model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the same files each run)")
    parser.add_argument("--eval-only", action="store_true", help="evaluate the adapters in --out, train nothing")
    parser.add_argument("--eval-questions", type=int, default=None, help="held-out questions asked (default: all)")
    parser.add_argument("--eval-max-tokens", type=int, default=64)
    return parser


def main(argv: list[str] | None = None) -> None:
    import torch

    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    work = args.work_dir or data_home() / "train-demo-adapters"
    model_dir = work / "model"
    if not (model_dir / "config.json").is_file():
        say(f"converting {packaged_gguf().name} into {model_dir}")
        convert_smollm2(packaged_gguf(), model_dir)
    report = {}
    if not args.eval_only:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        pairs = base_answers(model_dir, work, args.seed, args.examples)
        say(f"{len(pairs)} training pairs")
        for name in args.adapters:
            say(f"training {name}: {SPECS[name]}")
            examples = (tool_examples(model_dir, tokenizer, pairs, args.seed) if name == TOOL_ADAPTER
                        else style_examples(tokenizer, name, pairs))
            report[name] = train_one(model_dir, name, SPECS[name], examples, tokenizer.pad_token_id, args.seed,
                                     args.out / name)
            say(f"  {name}: {report[name]['seconds']} s")
    evaluation = evaluate(model_dir, args.out, args.eval_questions, args.eval_max_tokens)
    if (args.out / TOOL_ADAPTER).is_dir():
        evaluation["tools"] = evaluate_tools(model_dir, args.out, args.eval_max_tokens)
    previous = args.out / "EVALUATION.json"
    trained = (json.loads(previous.read_text()).get("training") or {}) if previous.is_file() else {}
    evaluation["training"] = {**trained, **report}  # adapters trained by earlier runs keep their entries
    evaluation["threads"] = args.threads
    (args.out / "EVALUATION.json").write_text(json.dumps(evaluation, indent=1, ensure_ascii=False) + "\n")
    print(rates_table(evaluation))
    if "tools" in evaluation:
        print(tool_rates_table(evaluation["tools"]))


if __name__ == "__main__":
    main()
