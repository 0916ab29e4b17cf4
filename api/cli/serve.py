"""`loraplex serve`: build the engine, registry, tenants and HTTP server from flags, then serve until SIGTERM."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from adapters.base_model import BaseModelError, base_model_spec
from adapters.demo.assets import DemoAssets, DemoConfig, ensure_demo_assets
from adapters.demo.smollm2 import GgufNotFoundError
from adapters.home import demo_home
from adapters.identity import parse_model_ref
from adapters.registry import AdapterNotFound, Registry
from adapters.sql import DB_ERRORS
from adapters.validation import AdapterValidationError
from api.cli.flags import add_config_arguments, config_from_args
from api.config import FLAG_SECTIONS, LoraplexConfig, ServingOptions
from api.generation.virtual_model_table import GraphError, VirtualModelTable
from api.grpc.front import GrpcFront
from api.lifecycle import DrainingServer, http_config
from api.sagemaker.environment import MODEL_DIR, ModelArtifacts, bound_port, model_artifacts
from api.server.build import build_server
from api.tenancy.config import ConfigError, TenancyConfig, load_tenancy_config
from api.tenancy.ledger import LedgerError
from api.tenancy.limits_backend import LimitsUnavailable
from engine.cluster.config import ClusterConfig


def add_serve_parser(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="Serve the base model and LoRA adapters over the OpenAI API.",
        description="Serve a base model and LoRA adapters over the OpenAI API. Without --model, serves the "
        "embedded default (--demo): SmolLM2-135M-Instruct and four demo adapters, built once under "
        "$LORAPLEX_DEMO_HOME, else $LORAPLEX_HOME (default ~/.local/share/loraplex); --demo tiny serves a tiny "
        f"random Llama instead. When {MODEL_DIR}/config.json exists (a SageMaker "
        f"model artefact), that checkpoint is the default instead; adapter folders in {MODEL_DIR}/adapters/NAME/ "
        "are published like --adapter.",
    )
    serve.add_argument("--model", default=None,
                       help=f"Path of a local Hugging Face Llama-family checkpoint (default: {MODEL_DIR} when it holds "
                       "one, else the embedded demo model chosen by --demo).")
    serve.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH",
                       help="Publish the PEFT LoRA adapter folder PATH to the registry as NAME at start "
                       "(a new version only if its content changed), and serve it (repeatable).")
    serve.add_argument("--pin", action="append", default=[], metavar="NAME",
                       help="Keep adapter NAME (its stable version) loaded in the engine's CPU tier and on "
                       "disk; never evicted (repeatable). Loaded at start; with --replicas, by every replica at "
                       "its start.")
    serve.add_argument("--adapter-replicas", action="append", default=[], metavar="NAME=N",
                       dest="adapter_replicas_flags",
                       help="With --replicas: N replicas hold adapter NAME (or NAME:ALIAS) from their start, "
                       "preloaded and never evicted, and its requests go to the least loaded of them "
                       "(repeatable).")
    add_config_arguments(serve, DemoConfig, skip=set())
    skips = {"engine": {"model"}, "cluster": {"adapter_replicas"}}
    for section, config_cls in FLAG_SECTIONS.items():
        add_config_arguments(serve, config_cls, skip=skips.get(section, set()))


def parse_adapter_replicas_flag(value: str) -> tuple[str, int]:
    """`NAME=N` from the command line."""
    ref, sep, count = value.partition("=")
    if not sep or not ref or not count.strip().isdigit():
        raise ValueError(f"expected NAME=N with N a whole number, got {value!r}")
    return ref, int(count)


def parse_adapter_flag(value: str) -> tuple[str, Path]:
    """`NAME=PATH` from the command line."""
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"expected NAME=PATH, got {value!r}")
    return name, Path(path)


def startup_model(flag_model: str | None, flags: list[tuple[str, Path]],
                  artifacts: ModelArtifacts) -> tuple[str | None, list[tuple[str, Path]]]:
    """The checkpoint to serve and the adapters to publish at start, given a SageMaker host's artefacts: --model,
    else the artefacts' checkpoint, else None (the embedded default); the artefacts' adapters, then --adapter's."""
    model = flag_model
    if model is None and artifacts.model_dir is not None:
        model = str(artifacts.model_dir)
    return model, list(artifacts.adapters) + flags


def _publish_startup_adapters(registry: Registry, flags: list[tuple[str, Path]]) -> list[str]:
    """Pushes the demo and --adapter folders; unchanged content keeps its version. Every problem at once."""
    lines, problems = [], []
    for name, path in flags:
        try:
            manifest, created = registry.push_with_status(path, name)
        except AdapterValidationError as e:
            problems.append(str(e))
            continue
        lines.append(f"{manifest.label}{' (new)' if created else ''}")
    if problems:
        raise SystemExit("invalid adapters:\n  - " + "\n  - ".join(problems))
    return lines


def _embedded_default(args: argparse.Namespace) -> DemoAssets:
    """The demo chosen by --demo, built under the demo home on its first use."""
    try:
        config = config_from_args(DemoConfig, args)
    except ValidationError as e:
        raise SystemExit(f"invalid configuration:\n{e}") from e
    try:
        return ensure_demo_assets(demo_home(), config)
    except GgufNotFoundError as e:
        raise SystemExit(f"--demo {config.demo}: {e}; or serve the tiny demo: --demo tiny") from e


def demo_chat_defaults(options: ServingOptions, demo: DemoAssets | None) -> ServingOptions:
    """The demo's chat template and tool-call parser where the flags set neither."""
    if demo is None or options.chat_template is not None or options.tool_call_parser is not None:
        return options
    return options.model_copy(update={"chat_template": str(demo.chat_template) if demo.chat_template else None,
                                      "tool_call_parser": demo.tool_call_parser})


def _tenancy(path: str | None) -> TenancyConfig:
    if path is None:
        print("[loraplex] no --config: serving OPEN, one tenant 'default', no API keys, admin API unguarded",
              file=sys.stderr, flush=True)
        return TenancyConfig.open_default()
    try:
        return load_tenancy_config(path)
    except ConfigError as e:
        raise SystemExit(f"invalid tenants config {path}:\n  - " + "\n  - ".join(e.problems)) from e


def check_held_adapters(registry: Registry, config: LoraplexConfig) -> None:
    """Every adapter --pin and --adapter-replicas name is one this registry serves, checked before any engine
    starts (a replica that cannot load one would fail its start over and over); every problem at once."""
    problems = []
    for flag, refs in (("--pin", config.pins), ("--adapter-replicas", tuple(config.cluster.adapter_replicas))):
        for ref in refs:
            try:
                registry.resolve(parse_model_ref(ref))
            except (ValueError, AdapterNotFound) as e:
                problems.append(f"{flag} {ref}: {e}")
    if problems:
        raise SystemExit("adapters to hold that cannot be served:\n  - " + "\n  - ".join(problems))


def check_virtual_models(tenancy: TenancyConfig, registry: Registry, base_model_id: str, path: str | None) -> None:
    """The tenants file's virtual models against the registry, before the engine starts; every problem at once."""
    try:
        VirtualModelTable(base_model_id, registry, tenancy.virtual_models)
    except GraphError as e:
        raise SystemExit(f"invalid virtual models in {path}:\n  - " + "\n  - ".join(e.problems)) from e


def cluster_config(args: argparse.Namespace, tenancy: TenancyConfig) -> ClusterConfig:
    """The flags when --replicas is given, else the tenants file's `cluster:` section, else off. Other scale-out
    flags beside the file's section without --replicas are refused by name: the section would set them."""
    if args.replicas is not None or tenancy.cluster is None:
        try:
            targets = dict(parse_adapter_replicas_flag(v) for v in args.adapter_replicas_flags)
        except ValueError as e:
            raise SystemExit(f"--adapter-replicas: {e}") from e
        return config_from_args(ClusterConfig, args, adapter_replicas=targets)
    given = [name for name, field in ClusterConfig.model_fields.items()
             if hasattr(args, name) and getattr(args, name) != field.default]
    given += ["adapter_replicas"] if args.adapter_replicas_flags else []
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise SystemExit(f"{flags}: the tenants file's cluster: section sets scale-out when --replicas is not "
                         "given; set these there, or give --replicas to use the flags instead")
    return tenancy.cluster


def serve_config(args: argparse.Namespace, model: str, demo: DemoAssets | None,
                 port: int | None) -> LoraplexConfig:
    """The one configuration, from the flags and the tenants file; every problem of a section at once."""
    try:
        sections = {name: config_from_args(cls, args) for name, cls in FLAG_SECTIONS.items()
                    if name not in ("server", "engine", "serving", "cluster")}
        server = config_from_args(FLAG_SECTIONS["server"], args, **({} if port is None else {"port": port}))
        engine = config_from_args(FLAG_SECTIONS["engine"], args, model=model)
        serving = demo_chat_defaults(config_from_args(ServingOptions, args), demo)
    except ValidationError as e:
        raise SystemExit(f"invalid configuration:\n{e}") from e
    if not Path(model).is_dir():
        raise SystemExit(f"--model: {model} is not a directory")
    if serving.chat_template is not None and not Path(serving.chat_template).is_file():
        raise SystemExit(f"--chat-template: {serving.chat_template} is not a file")
    tenancy = _tenancy(serving.config)
    try:
        return LoraplexConfig(server=server, engine=engine, serving=serving, tenancy=tenancy,
                              cluster=cluster_config(args, tenancy), pins=tuple(args.pin), **sections)
    except ValidationError as e:
        raise SystemExit(f"invalid configuration:\n{e}") from e


def serve(args: argparse.Namespace) -> None:
    # vLLM loads here, not at import: `loraplex adapters ...` and `keys ...` start without it.
    from api.app import create_app
    from engine.async_engine import LoraplexEngine, model_id_of

    try:
        flags = [parse_adapter_flag(v) for v in args.adapter]
    except ValueError as e:
        raise SystemExit(f"--adapter: {e}") from e
    model, flags = startup_model(args.model, flags, model_artifacts(MODEL_DIR))
    demo = None
    if model is None:
        demo = _embedded_default(args)
        model = str(demo.model_dir)
        flags = list(demo.adapter_dirs.items()) + flags
    try:
        port = bound_port(os.environ)
    except ValueError as e:
        raise SystemExit(str(e)) from e
    config = serve_config(args, model, demo, port)
    try:
        base = base_model_spec(Path(model))
    except BaseModelError as e:
        raise SystemExit(f"--model: {e}") from e
    try:
        registry = Registry.from_config(config.registry, base, config.engine.max_lora_rank)
    except DB_ERRORS as e:
        raise SystemExit(f"--index-url: cannot open the registry index: {e}") from e
    published = _publish_startup_adapters(registry, flags)
    check_virtual_models(config.tenancy, registry, base.model_id, config.serving.config)
    check_held_adapters(registry, config)
    if model_id_of(config.engine) != base.model_id:
        raise SystemExit(f"model id mismatch: engine {model_id_of(config.engine)!r}, registry base {base.model_id!r}")
    try:
        if config.cluster.enabled:
            # Ray loads only in scale-out mode.
            from api.cluster.serve import build_cluster_server

            server = build_cluster_server(registry, config)
        else:
            server = build_server(LoraplexEngine(config.engine), registry, config)
    except LedgerError as e:
        raise SystemExit(f"--ledger-url: {e}") from e
    except LimitsUnavailable as e:
        raise SystemExit(f"--limits-url: {e}") from e
    print(f"[loraplex] serving {server.engine.model_id}; registry {config.registry.resolved_store_uri()}; "
          f"{config.engine.max_loras} adapter slots, {config.engine.max_cpu_loras} adapters in CPU memory; "
          f"published at start: {', '.join(published) or '(none)'}", file=sys.stderr, flush=True)
    grpc_front = None
    if config.server.grpc_port is not None:
        grpc_front = GrpcFront(server, config.server.host, config.server.grpc_port)
    http = http_config(create_app(server, grpc_front), config.input_limits, config.server.host, config.server.port,
                       config.server.log_level, keep_alive_s=config.server.keep_alive_s)
    DrainingServer(http, server.lifecycle, config.serving.drain_timeout_s).run()
