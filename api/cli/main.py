"""`loraplex` command line: `serve`, `adapters ...`, `keys create`, `usage` and `batches ...`."""

from __future__ import annotations

import argparse
import logging
import os
import sys

# Before anything imports transformers or vLLM: loraplex never downloads from a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from api.cli.adapters import add_adapters_parser, run_adapters  # noqa: E402
from api.cli.batches import add_batches_parser, run_batches  # noqa: E402
from api.cli.serve import add_serve_parser, serve  # noqa: E402
from api.cli.tenants import add_tenant_parsers, run_tenant_command  # noqa: E402
from api.observability.requestlog import REQUEST_LOGGER, JsonFormatter  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loraplex", description="Multi-tenant LoRA serving on vLLM.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(sub)
    add_adapters_parser(sub)
    add_tenant_parsers(sub)
    add_batches_parser(sub)
    return parser


def _json_request_log() -> None:
    """One pure JSON line per request on stderr, apart from the human-readable log."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    request_log = logging.getLogger(REQUEST_LOGGER)
    request_log.addHandler(handler)
    request_log.setLevel(logging.INFO)
    request_log.propagate = False


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _json_request_log()
    if args.command == "serve":
        serve(args)
    elif args.command == "adapters":
        sys.exit(run_adapters(args))
    elif args.command == "batches":
        sys.exit(run_batches(args))
    else:
        sys.exit(run_tenant_command(args))


if __name__ == "__main__":
    main()
