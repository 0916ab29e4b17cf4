"""`loraplex serve`: build the engine, registry, tenants and HTTP server from flags, then serve until SIGTERM."""

from __future__ import annotations

import argparse
import os
import sys
import typing
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from adapters.base_model import BaseModelError, base_model_spec
from adapters.demo.assets import DemoAssets, DemoConfig, ensure_demo_assets
from adapters.demo.smollm2 import GgufNotFoundError
from adapters.home import demo_home
from adapters.registry import Registry, RegistryConfig
from adapters.sql import DB_ERRORS
from adapters.validation import AdapterValidationError
from api.batch.config import BatchConfig
from api.cli.flags import add_config_arguments, config_from_args
from api.generation.virtual_model_table import GraphError, VirtualModelTable
from api.grpc.front import GrpcFront
from api.input_limits import InputLimits
from api.lifecycle import DrainingServer, http_config
from api.observability.drift import DriftConfig
from api.routing.config import RoutingConfig
from api.sagemaker.environment import MODEL_DIR, PORT_ENV, ModelArtifacts, bound_port, model_artifacts
from api.server import ServingOptions, TierSizes, build_server
from api.tenancy.config import ConfigError, TenancyConfig, load_tenancy_config
from api.tenancy.ledger import LedgerError
from api.tenancy.limits_backend import LimitsUnavailable
from engine.cluster.config import ClusterConfig
from engine.config import EngineConfig


class ServerConfig(BaseModel):
    """Where and how the HTTP server listens."""

    host: str = Field(default="127.0.0.1", description="Address to bind.")
    port: int = Field(default=8000, ge=0, le=65535,
                      description=f"TCP port to bind; ${PORT_ENV}, when set, overrides it.")
    log_level: typing.Literal["debug", "info", "warning", "error"] = Field(default="info",
                                                                          description="Log level.")
    grpc_port: int | None = Field(default=None, ge=0, le=65535,
                                  description="Also serve the Open Inference Protocol v2 (KServe, Triton) over gRPC "
                                  "on this port of --host (0: a free one; the log says which). Default: HTTP only.")


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
                       "disk; never evicted (repeatable). With --replicas each replica keeps it once it has "
                       "loaded it, on its first request.")
    add_config_arguments(serve, ServerConfig, skip=set())
    add_config_arguments(serve, DemoConfig, skip=set())
    add_config_arguments(serve, EngineConfig, skip={"model"})
    add_config_arguments(serve, RegistryConfig, skip=set())
    add_config_arguments(serve, ServingOptions, skip=set())
    add_config_arguments(serve, InputLimits, skip=set())
    add_config_arguments(serve, RoutingConfig, skip=set())
    add_config_arguments(serve, DriftConfig, skip=set())
    add_config_arguments(serve, BatchConfig, skip=set())
    add_config_arguments(serve, ClusterConfig, skip=set())


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


def check_virtual_models(tenancy: TenancyConfig, registry: Registry, base_model_id: str, path: str | None) -> None:
    """The tenants file's virtual models against the registry, before the engine starts; every problem at once."""
    try:
        VirtualModelTable(base_model_id, registry, tenancy.virtual_models)
    except GraphError as e:
        raise SystemExit(f"invalid virtual models in {path}:\n  - " + "\n  - ".join(e.problems)) from e


def cluster_config(args: argparse.Namespace, tenancy: TenancyConfig) -> ClusterConfig:
    """The flags when --replicas is given, else the tenants file's `cluster:` section, else off."""
    if args.replicas is not None or tenancy.cluster is None:
        return config_from_args(ClusterConfig, args)
    return tenancy.cluster


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
    try:
        server_config = config_from_args(ServerConfig, args, **({} if port is None else {"port": port}))
        engine_config = config_from_args(EngineConfig, args, model=model)
        registry_config = config_from_args(RegistryConfig, args)
        options = demo_chat_defaults(config_from_args(ServingOptions, args), demo)
        input_limits = config_from_args(InputLimits, args)
        routing = config_from_args(RoutingConfig, args)
        drift_config = config_from_args(DriftConfig, args)
        batch_config = config_from_args(BatchConfig, args)
    except ValidationError as e:
        raise SystemExit(f"invalid configuration:\n{e}") from e
    if not Path(model).is_dir():
        raise SystemExit(f"--model: {model} is not a directory")
    if options.chat_template is not None and not Path(options.chat_template).is_file():
        raise SystemExit(f"--chat-template: {options.chat_template} is not a file")
    tenancy = _tenancy(options.config)
    try:
        base = base_model_spec(Path(model))
    except BaseModelError as e:
        raise SystemExit(f"--model: {e}") from e
    try:
        cluster = cluster_config(args, tenancy)
    except ValidationError as e:
        raise SystemExit(f"invalid configuration:\n{e}") from e
    try:
        registry = Registry.from_config(registry_config, base, engine_config.max_lora_rank)
    except DB_ERRORS as e:
        raise SystemExit(f"--index-url: cannot open the registry index: {e}") from e
    published = _publish_startup_adapters(registry, flags)
    check_virtual_models(tenancy, registry, base.model_id, options.config)
    if model_id_of(engine_config) != base.model_id:
        raise SystemExit(f"model id mismatch: engine {model_id_of(engine_config)!r}, registry base {base.model_id!r}")
    if len(args.pin) >= engine_config.max_cpu_loras:
        raise SystemExit(f"--pin: {len(args.pin)} pinned adapters leave no room in max_cpu_loras "
                         f"{engine_config.max_cpu_loras}")
    try:
        if cluster.enabled:
            # Ray loads only in scale-out mode.
            from api.cluster.serve import build_cluster_server

            server = build_cluster_server(cluster, engine_config, registry_config, registry, tenancy, options,
                                          tuple(args.pin), input_limits, routing, drift_config, batch_config)
        else:
            sizes = TierSizes(engine_config.max_loras, engine_config.max_cpu_loras,
                              registry_config.resolved_disk_cache_dir(), registry_config.disk_cache_bytes)
            server = build_server(LoraplexEngine(engine_config), registry, tenancy, options, sizes,
                                  tuple(args.pin), max_running=engine_config.max_num_seqs, input_limits=input_limits,
                                  routing=routing, drift_config=drift_config, batch_config=batch_config)
    except LedgerError as e:
        raise SystemExit(f"--ledger-url: {e}") from e
    except LimitsUnavailable as e:
        raise SystemExit(f"--limits-url: {e}") from e
    engine = server.engine
    print(f"[loraplex] serving {engine.model_id}; registry {registry_config.resolved_store_uri()}; "
          f"published at start: {', '.join(published) or '(none)'}", file=sys.stderr, flush=True)
    grpc_front = None
    if server_config.grpc_port is not None:
        grpc_front = GrpcFront(server, server_config.host, server_config.grpc_port)
    config = http_config(create_app(server, grpc_front), input_limits, server_config.host, server_config.port,
                         server_config.log_level)
    DrainingServer(config, server.lifecycle, options.drain_timeout_s).run()
