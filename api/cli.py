"""`loraplex` command line. Flags are generated from the typed configs, so help and defaults have one source."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import typing
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from engine.config import EngineConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class ServerConfig(BaseModel):
    """Where and how the HTTP server listens."""

    host: str = Field(default="127.0.0.1", description="Address to bind.")
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port to bind.")
    log_level: typing.Literal["debug", "info", "warning", "error"] = Field(default="info",
                                                                          description="Log level.")


def add_config_arguments(parser: argparse.ArgumentParser, model: type[BaseModel], skip: set[str]) -> None:
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        flag = "--" + name.replace("_", "-")
        annotation = field.annotation
        shown = "" if "default" in (field.description or "") else " (default: %(default)s)"
        kwargs: dict = {"dest": name, "default": field.default, "help": f"{field.description}{shown}"}
        if typing.get_origin(annotation) is typing.Literal:
            kwargs["choices"] = typing.get_args(annotation)
        elif annotation in (int, float):
            kwargs["type"] = annotation
        elif annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        parser.add_argument(flag, **kwargs)


def config_from_args(config_cls: type[BaseModel], args: argparse.Namespace, **extra):
    values = {name: getattr(args, name) for name in config_cls.model_fields if hasattr(args, name)}
    return config_cls(**{**values, **extra})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loraplex", description="Multi-tenant LoRA serving on vLLM.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="Serve the base model and LoRA adapters over the OpenAI API.",
        description="Serve a base model and LoRA adapters over the OpenAI API. Without --model, serves the "
        "embedded default: a tiny Llama and demo adapters generated once under $LORAPLEX_HOME "
        "(default ~/.local/share/loraplex).",
    )
    serve.add_argument("--model", default=None,
                       help="Path of a local Hugging Face Llama-family checkpoint (default: the embedded demo model).")
    serve.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH",
                       help="Serve the PEFT LoRA adapter folder PATH as model NAME (repeatable).")
    add_config_arguments(serve, ServerConfig, skip=set())
    add_config_arguments(serve, EngineConfig, skip={"model"})
    return parser


def _load_adapters(flags: list[tuple[str, Path]], max_lora_rank: int) -> dict:
    from adapters.local import AdapterValidationError, load_local_adapter

    adapters, problems = {}, []
    for name, path in flags:
        if name in adapters:
            problems.append(f"adapter {name!r} given twice")
            continue
        try:
            adapters[name] = load_local_adapter(name, path, max_lora_rank)
        except AdapterValidationError as e:
            problems.append(str(e))
    if problems:
        raise SystemExit("invalid adapters:\n  - " + "\n  - ".join(problems))
    return adapters


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    from adapters.local import parse_adapter_flag
    from api.app import create_app
    from api.catalog import ModelCatalog
    from engine.async_engine import LoraplexEngine
    from engine.demo_assets import data_home, ensure_demo_assets

    try:
        flags = [parse_adapter_flag(v) for v in args.adapter]
    except ValueError as e:
        raise SystemExit(f"--adapter: {e}") from e
    model = args.model
    if model is None:
        demo = ensure_demo_assets(data_home())
        model = str(demo.model_dir)
        flags = list(demo.adapter_dirs.items()) + flags
    try:
        server = config_from_args(ServerConfig, args)
        engine_config = config_from_args(EngineConfig, args, model=model)
    except ValidationError as e:
        raise SystemExit(f"invalid configuration:\n{e}") from e
    if not Path(model).is_dir():
        raise SystemExit(f"--model: {model} is not a directory")
    adapters = _load_adapters(flags, engine_config.max_lora_rank)
    engine = LoraplexEngine(engine_config)
    catalog = ModelCatalog(engine.model_id, adapters)
    print(f"[loraplex] serving {engine.model_id} with adapters: {', '.join(sorted(adapters)) or '(none)'}",
          file=sys.stderr, flush=True)
    uvicorn.run(create_app(engine, catalog), host=server.host, port=server.port, log_level=server.log_level)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        serve(args)


if __name__ == "__main__":
    main()
