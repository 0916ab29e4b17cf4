"""Asks a running loraplex server one question with the base model and with each adapter (the openai client,
greedy), and prints what each answered: the transcript in docs/models.md.

    python scripts/demo_transcript.py [--base-url http://127.0.0.1:8000/v1] [--question "..."]
"""

from __future__ import annotations

import argparse

from openai import OpenAI

DEFAULT_QUESTION = "What is the capital of France?"


def transcript(client: OpenAI, question: str, max_tokens: int) -> list[tuple[str, str]]:
    """(model, answer) for the base model, then each adapter, in the order /v1/models lists them."""
    models = client.models.list().data
    base = [m.id for m in models if not (m.model_extra or {}).get("parent")]
    adapters = [m.id for m in models if (m.model_extra or {}).get("parent")]
    answers = []
    for model in base + adapters:
        response = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": question}], max_tokens=max_tokens, temperature=0)
        answers.append((response.model, response.choices[0].message.content))
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="unused", help="a tenant's key when the server has a tenants file")
    parser.add_argument("--question", action="append", help=f"(repeatable; default: {DEFAULT_QUESTION!r})")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    for question in args.question or [DEFAULT_QUESTION]:
        print(f">>> {question}")
        for model, answer in transcript(client, question, args.max_tokens):
            print(f"[{model}] {answer}")
        print()


if __name__ == "__main__":
    main()
