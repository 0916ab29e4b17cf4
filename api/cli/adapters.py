"""`loraplex adapters ...`: publish and manage adapter versions in the registry."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from botocore.exceptions import BotoCoreError, ClientError

from adapters.base_model import BaseModelError, base_model_spec
from adapters.demo.assets import DemoConfig, ensure_demo_assets
from adapters.home import demo_home
from adapters.identity import STABLE, ModelRef, parse_model_ref, version_label
from adapters.manifest import Manifest
from adapters.registry import Registry, RegistryConfig
from adapters.rollouts import RolloutStore
from adapters.validation import AdapterValidationError
from api.cli.flags import add_config_arguments, config_from_args
from api.cli.rollouts import (
    abort_rollout,
    add_rollout_parsers,
    promote_candidate,
    set_fallback,
    show_report,
    start_rollout,
)
from engine.config import SUPPORTED_LORA_RANKS, EngineConfig

EXIT_ERROR = 2


def add_adapters_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    fields = RegistryConfig.model_fields
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--store", default=None, metavar="URI", help=fields["store_uri"].description)
    common.add_argument("--index", default=None, metavar="PATH|URL", help=fields["index_url"].description)
    common.add_argument("--base-model", default=None, metavar="DIR", type=Path,
                        help="Llama-family checkpoint that pushed adapters must fit (default: the embedded demo "
                             "model chosen by --demo).")
    add_config_arguments(common, DemoConfig, skip={"demo_dtype"})
    common.add_argument("--max-lora-rank", type=int, choices=SUPPORTED_LORA_RANKS,
                        default=EngineConfig.model_fields["max_lora_rank"].default, metavar="R",
                        help="Largest LoRA rank a push accepts (default: %(default)s).")
    common.add_argument("--max-adapter-bytes", type=int, default=fields["max_adapter_bytes"].default, metavar="N",
                        help=f"{fields['max_adapter_bytes'].description} (default: %(default)s)")

    parser = subparsers.add_parser(
        "adapters", help="Publish and manage versioned LoRA adapters.",
        description="Publish LoRA adapters to the registry and manage their versions and aliases. A bare NAME "
        "means its `stable` alias: a name's first version becomes stable when it is pushed; a later push never "
        "changes what serves until it is promoted (push --promote, promote) or rolled out (push --canary, "
        "rollout).")
    actions = parser.add_subparsers(dest="adapters_command", required=True, metavar="ACTION")
    push = actions.add_parser("push", parents=[common], help="Validate a PEFT folder and publish it as a new version.")
    push.add_argument("path", type=Path, metavar="PATH", help="PEFT LoRA folder (adapter_config.json + safetensors).")
    push.add_argument("--name", required=True, help="Adapter name.")
    push.add_argument("--description", default="", help="Free text shown in listings.")
    _add_goes_live(push)
    compose = actions.add_parser("compose", parents=[common], help="Publish a weighted mixture of published "
                                 "adapters as a new version of NAME (exact: ranks stacked; the manifest records "
                                 "the components).")
    compose.add_argument("name", metavar="NAME", help="Adapter name the mixture is published under.")
    compose.add_argument("--from", dest="parts", action="append", required=True, metavar="REF=WEIGHT",
                         help="A component and its weight, e.g. sql-helper@2=0.7 (NAME alone: its stable "
                         "version); at least two.")
    compose.add_argument("--description", default="", help="Free text shown in listings.")
    _add_goes_live(compose)
    listing = actions.add_parser("list", parents=[common], help="List adapters, versions and aliases.")
    listing.add_argument("--json", action="store_true", help="Print JSON.")
    show = actions.add_parser("show", parents=[common], help="Show one version: NAME, NAME@V or NAME:ALIAS.")
    show.add_argument("ref", metavar="NAME[@V|:ALIAS]")
    show.add_argument("--json", action="store_true", help="Print JSON.")
    promote = actions.add_parser("promote", parents=[common], help="Point an alias at a version; promoting "
                                 "stable ends NAME's rollout, and a bare NAME promotes its rollout's candidate.")
    promote.add_argument("ref", metavar="NAME@V|NAME")
    promote.add_argument("--alias", default=STABLE, help="Alias to move (default: %(default)s).")
    rollback = actions.add_parser("rollback", parents=[common], help="Move an alias back to its previous version.")
    rollback.add_argument("name", metavar="NAME")
    rollback.add_argument("--alias", default=STABLE, help="Alias to move back (default: %(default)s).")
    delete = actions.add_parser("delete", parents=[common], help="Delete a version no alias points at.")
    delete.add_argument("ref", metavar="NAME@V")
    add_rollout_parsers(actions, common)
    return parser


def _add_goes_live(action: argparse.ArgumentParser) -> None:
    goes_live = action.add_mutually_exclusive_group()
    goes_live.add_argument("--promote", action="store_true", help="Also make the new version NAME's stable "
                           "(ends NAME's rollout). Without it (or --canary) a name that has a stable version keeps "
                           "serving it.")
    goes_live.add_argument("--canary", type=float, default=None, metavar="P", help="Also start a canary: P%% of "
                           "bare NAME's requests go to the new version (see `rollout`; default guard).")


def run_adapters(args: argparse.Namespace) -> int:
    """Runs one action; returns the exit code. Failures print `error: ...` with every problem and return 2."""
    try:
        registry = _open_registry(args)
        try:
            return _ACTIONS[args.adapters_command](registry, args)
        finally:
            registry.close()
    except AdapterValidationError as e:
        return _fail(f"adapter {e.name!r} is not valid:", e.problems)
    except BaseModelError as e:
        return _fail("the base model is not usable:", e.problems)
    except (ValueError, LookupError, OSError, BotoCoreError, ClientError) as e:
        return _fail(str(e), [])


def _fail(message: str, problems: list[str]) -> int:
    lines = [f"error: {message}"] + [f"  - {problem}" for problem in problems]
    print("\n".join(lines), file=sys.stderr)
    return EXIT_ERROR


def _open_registry(args: argparse.Namespace) -> Registry:
    config = RegistryConfig(store_uri=args.store, index_url=args.index, max_adapter_bytes=args.max_adapter_bytes)
    base = None
    if args.adapters_command in ("push", "compose"):
        base_dir = args.base_model
        if base_dir is None:
            base_dir = ensure_demo_assets(demo_home(), config_from_args(DemoConfig, args)).model_dir
        base = base_model_spec(base_dir)
    return Registry.from_config(config, base, args.max_lora_rank)


def _versioned(ref: str) -> tuple[str, int]:
    parsed = parse_model_ref(ref)
    if parsed.version is None:
        raise ValueError(f"expected NAME@VERSION, got {ref!r}")
    return parsed.name, parsed.version


def _push(registry: Registry, args: argparse.Namespace) -> int:
    return _published(registry, args, *registry.push_with_status(args.path, args.name, args.description))


def _weighted(part: str) -> tuple[ModelRef, float]:
    ref, sep, weight = part.rpartition("=")
    try:
        if not sep:
            raise ValueError
        return parse_model_ref(ref), float(weight)
    except ValueError as e:
        raise ValueError(f"--from expects REF=WEIGHT (e.g. sql-helper@2=0.7), got {part!r}") from e


def _compose(registry: Registry, args: argparse.Namespace) -> int:
    parts = [_weighted(part) for part in args.parts]
    manifest, created = registry.compose(args.name, parts, args.description)
    # The versions each part resolved to (a folder pushed before with the same content has no lineage).
    named = ([(version_label(p.name, p.version), p.weight) for p in manifest.lineage.components] if manifest.lineage
             else [(str(ref), weight) for ref, weight in parts])
    mix = " + ".join(f"{weight:g} x {label}" for label, weight in named)
    print(f"mixture: {mix} (rank {manifest.rank})")
    return _published(registry, args, manifest, created)


def _published(registry: Registry, args: argparse.Namespace, manifest: Manifest, created: bool) -> int:
    """Reports a push and takes it live when asked (--promote, --canary)."""
    if created:
        print(f"pushed {manifest.label} (content {manifest.content_hash[:12]}, {manifest.size_bytes} bytes)")
    else:
        print(f"{manifest.label} already has this content; nothing pushed")
    if args.promote:
        registry.promote(manifest.name, manifest.version)
    elif args.canary is not None:
        rollout = RolloutStore(registry.index).start(manifest.name, manifest.version, args.canary)
        print(f"rollout {rollout.id}: {args.canary:g}% of {manifest.name} -> {rollout.candidate_label} (canary), "
              f"stable {rollout.stable_label}")
    stable = registry.index.alias_target(manifest.name, STABLE)
    print(f"{manifest.name}:stable -> {version_label(manifest.name, stable)}")
    return 0


def _list(registry: Registry, args: argparse.Namespace) -> int:
    summaries = registry.list()
    if args.json:
        print(json.dumps([s.model_dump(mode="json") for s in summaries], indent=2))
        return 0
    rows = [("NAME", "VERSIONS", "ALIASES", "DESCRIPTION")]
    for s in summaries:
        rows.append((s.name, ",".join(str(m.version) for m in s.versions),
                     ",".join(f"{alias}={version}" for alias, version in s.aliases.items()), s.description))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3])
    return 0


def _show(registry: Registry, args: argparse.Namespace) -> int:
    detail = registry.show(parse_model_ref(args.ref))
    if args.json:
        print(detail.model_dump_json(indent=2))
        return 0
    m = detail.manifest
    print(m.label)
    for key, value in (
        ("description", m.description or detail.description),
        ("content_hash", m.content_hash),
        ("base_model", m.base_model_id),
        ("peft_type", m.peft_type),
        ("rank", m.rank),
        ("alpha", m.alpha),
        ("target_modules", ", ".join(m.target_modules)),
        ("size_bytes", m.size_bytes),
        ("created_at", m.created_at),
        ("versions", ", ".join(map(str, detail.versions))),
        ("aliases", ", ".join(f"{alias}={version}" for alias, version in detail.aliases.items())),
    ):
        print(f"  {key}: {value}")
    print("  files:")
    for file in m.files:
        print(f"    {file.path}  {file.size} bytes  sha256 {file.sha256}")
    return 0


def _promote(registry: Registry, args: argparse.Namespace) -> int:
    parsed = parse_model_ref(args.ref)
    if parsed.version is None and parsed.alias is None and args.alias == STABLE:
        return promote_candidate(registry, parsed.name)
    name, version = _versioned(args.ref)
    manifest = registry.promote(name, version, args.alias)
    print(f"{name}:{args.alias} -> {manifest.label}")
    return 0


def _rollback(registry: Registry, args: argparse.Namespace) -> int:
    manifest = registry.rollback(args.name, args.alias)
    print(f"{args.name}:{args.alias} -> {manifest.label}")
    return 0


def _delete(registry: Registry, args: argparse.Namespace) -> int:
    name, version = _versioned(args.ref)
    registry.delete(name, version)
    print(f"deleted {name}@{version}")
    return 0


_ACTIONS = {"push": _push, "compose": _compose, "list": _list, "show": _show, "promote": _promote,
            "rollback": _rollback, "delete": _delete,
            "rollout": lambda registry, args: start_rollout(registry, args, _versioned), "abort": abort_rollout, "report": show_report, "fallback": set_fallback}
