"""`loraplex keys create` and `loraplex usage`: issue API keys into a tenants file, report the usage ledger."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

from api.ops.usage import parse_time
from api.tenancy.config import ConfigError, parse_tenancy_config, read_yaml
from api.tenancy.keys import generate_key, hash_key
from api.tenancy.ledger import LedgerError, UsageLedger, default_ledger_path

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def add_tenant_parsers(subparsers: argparse._SubParsersAction) -> None:
    keys = subparsers.add_parser("keys", help="Manage API keys in a tenants file.")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser(
        "create", help="Generate an API key for a tenant (or an admin or metrics key) and store its hash.",
        description="Generate an API key, append its SHA-256 hash to the tenant's key_hashes (or to "
        "admin_key_hashes with --admin, metrics_key_hashes with --metrics) and rewrite the tenants file "
        "atomically. The key is printed once on stdout and cannot be shown again. The file is rewritten by PyYAML: "
        "its comments and formatting are lost. The server reads the new key when it next loads the file.")
    who = create.add_mutually_exclusive_group(required=True)
    who.add_argument("--tenant", help="Tenant to issue the key to.")
    who.add_argument("--admin", action="store_true", help="Issue an admin key instead.")
    who.add_argument("--metrics", action="store_true", help="Issue a metrics key (reads /metrics only), for a "
                     "Prometheus scraper.")
    create.add_argument("--config", required=True, type=Path, help="Tenants YAML file to update.")
    create.set_defaults(tenant_handler=_keys_create)

    usage = subparsers.add_parser(
        "usage", help="Requests, tokens, price and compute cost per tenant, model and version.",
        description="Summarise the usage ledger. Safe to run while the server writes it.")
    usage.add_argument("--ledger", default=None, metavar="PATH|URL",
                       help="Ledger: a SQLite file, or the postgresql:// DSN replicas write to (default: "
                       "usage.sqlite under $LORAPLEX_HOME, else ~/.local/share/loraplex).")
    usage.add_argument("--tenant", default=None, help="Only this tenant.")
    usage.add_argument("--model", default=None, help="Only this base model id or adapter name.")
    usage.add_argument("--since", default=None,
                       help="Start, inclusive: ISO 8601 (UTC unless it names an offset) or an age like 24h, 7d.")
    usage.add_argument("--until", default=None, help="End, exclusive; same forms as --since.")
    usage.add_argument("--json", action="store_true", help="Print JSON rows instead of a table.")
    usage.set_defaults(tenant_handler=_usage)


def run_tenant_command(args: argparse.Namespace) -> int:
    return args.tenant_handler(args)


def _fail(message: str, code: int) -> int:
    print(f"loraplex: {message}", file=sys.stderr)
    return code


def _keys_create(args: argparse.Namespace) -> int:
    path: Path = args.config.resolve()
    try:
        raw = read_yaml(path.read_text(), str(path))
        config = parse_tenancy_config(raw)
    except OSError as e:
        return _fail(f"cannot read {path}: {e.strerror or e}", EXIT_FAILED)
    except ConfigError as e:
        return _fail(f"invalid tenants file {path}:\n{e}", EXIT_USAGE)
    key = generate_key()
    if args.admin or args.metrics:
        raw.setdefault("admin_key_hashes" if args.admin else "metrics_key_hashes", []).append(hash_key(key))
    else:
        names = [t.name for t in config.tenants]
        if args.tenant not in names:
            return _fail(f"unknown tenant {args.tenant!r} in {path} (tenants: {', '.join(names)})", EXIT_USAGE)
        entry = raw["tenants"][names.index(args.tenant)]
        entry["key_hashes"] = [*(entry.get("key_hashes") or []), hash_key(key)]
    try:
        parse_tenancy_config(raw)
        _write_atomically(path, yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
    except ConfigError as e:
        return _fail(f"refusing to write an invalid tenants file:\n{e}", EXIT_FAILED)
    except OSError as e:
        return _fail(f"cannot write {path}: {e.strerror or e}", EXIT_FAILED)
    who = "admin" if args.admin else "metrics" if args.metrics else f"tenant {args.tenant!r}"
    print(key, flush=True)
    print(f"loraplex: new API key for {who} above; store it now, it cannot be shown again. "
          f"Its hash was added to {path}.", file=sys.stderr)
    return EXIT_OK


def _write_atomically(path: Path, text: str) -> None:
    """Readers see the old file or the new one, never half of one."""
    mode = path.stat().st_mode & 0o777
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _usage(args: argparse.Namespace) -> int:
    now = time.time()
    try:
        since = parse_time(args.since, now) if args.since else None
        until = parse_time(args.until, now) if args.until else None
    except ValueError as e:
        return _fail(f"usage: {e}", EXIT_USAGE)
    path = args.ledger or default_ledger_path()
    try:
        with UsageLedger.reader(path) as ledger:
            rows = ledger.summary(tenant=args.tenant, model=args.model, since=since, until=until)
    except LedgerError as e:
        return _fail(str(e), EXIT_FAILED)
    if args.json:
        print(json.dumps(rows, indent=2))
    elif rows:
        print(format_usage_table(rows))
    else:
        print("no usage recorded for these filters")
    return EXIT_OK


_TABLE = (("tenant", "TENANT", "<"), ("model", "MODEL", "<"), ("version", "VERSION", "<"),
          ("requests", "REQUESTS", ">"), ("prompt_tokens", "PROMPT TOKENS", ">"),
          ("completion_tokens", "COMPLETION TOKENS", ">"), ("price_usd", "PRICE USD", ">"),
          ("cost_usd", "COST USD", ">"))


def format_usage_table(rows: list[dict]) -> str:
    """Aligned columns and a TOTAL line; USD to six decimals, since one request costs fractions of a cent."""
    total: dict = {"tenant": "TOTAL", "model": None, "version": None}
    for key in ("requests", "prompt_tokens", "completion_tokens", "price_usd", "cost_usd"):
        total[key] = sum(r[key] for r in rows)
    cells = [[title for _, title, _ in _TABLE]]
    for row in [*rows, total]:
        cells.append([_cell(row, key) for key, _, _ in _TABLE])
    widths = [max(len(line[i]) for line in cells) for i in range(len(_TABLE))]
    lines = ["  ".join(f"{text:{align}{w}}" for text, (_, _, align), w in zip(line, _TABLE, widths)).rstrip()
             for line in cells]
    return "\n".join(lines)


def _cell(row: dict, key: str) -> str:
    value = row[key]
    if value is None:
        return ""
    if key.endswith("_usd"):
        return f"{value:.6f}"
    if key == "version":
        return value or "-"
    return str(value)
