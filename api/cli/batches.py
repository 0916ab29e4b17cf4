"""`loraplex batches list|show|cancel`: batches in the batch store, read beside a running server."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from api.batch.serving import batch_object
from api.batch.store import UNFINISHED, BatchStore, StoreError, default_store_path

EXIT_OK, EXIT_FAILED = 0, 1
BAR_WIDTH = 30
WATCH_EVERY_S = 1.0


def progress_bar(finished: int, total: int, width: int = BAR_WIDTH) -> str:
    """`[#########.....................]  12/40  30%`; an empty batch shows an empty bar at 0%."""
    fraction = finished / total if total else 0.0
    filled = min(width, int(fraction * width))
    return f"[{'#' * filled}{'.' * (width - filled)}] {finished:>{len(str(total))}}/{total} {fraction:4.0%}"


def add_batches_parser(subparsers: argparse._SubParsersAction) -> None:
    batches = subparsers.add_parser("batches", help="List, show and cancel batches.",
                                    description="Batches in the batch store (the server's, under $LORAPLEX_HOME "
                                    "unless --store names another). Safe while the server runs; a cancel is "
                                    "picked up by the server within a second.")
    sub = batches.add_subparsers(dest="batches_command", required=True)
    for name, help_text in (("list", "Batches, newest first, with their progress."),
                            ("show", "One batch: status, counts, files; --watch follows it to the end."),
                            ("cancel", "Cancel a batch: lines not started are dropped, running ones finish.")):
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.add_argument("--store", type=Path, default=None,
                         help="Batch store file (default: batches.sqlite under $LORAPLEX_HOME).")
        cmd.add_argument("--json", action="store_true", help="Print the OpenAI batch object(s) as JSON.")
        if name == "list":
            cmd.add_argument("--tenant", default=None, help="Only this tenant's batches.")
            cmd.add_argument("--limit", type=int, default=20, help="How many (default: %(default)s).")
        else:
            cmd.add_argument("batch_id", help="The batch's id (batch_...).")
        if name == "show":
            cmd.add_argument("--watch", action="store_true", help="Redraw the progress bar until the batch ends.")
        cmd.set_defaults(batches_handler={"list": _list, "show": _show, "cancel": _cancel}[name])


def run_batches(args: argparse.Namespace) -> int:
    try:
        store = BatchStore(args.store or default_store_path())
    except StoreError as e:
        print(f"loraplex: {e}", file=sys.stderr)
        return EXIT_FAILED
    try:
        return args.batches_handler(args, store)
    finally:
        store.close()


def _summary(store: BatchStore, row: dict) -> str:
    counts = store.counts(row["id"])
    total = sum(counts.values())
    finished = total - counts["pending"]
    return (f"{row['id']}  {row['tenant']:<12} {row['status']:<11} {row['endpoint']:<21} "
            f"{progress_bar(finished, total)}  failed {counts['failed']}")


def _list(args: argparse.Namespace, store: BatchStore) -> int:
    rows = store.batches(args.tenant, None, args.limit)
    if args.json:
        print(json.dumps([batch_object(r, store.counts(r["id"])).model_dump() for r in rows], indent=2))
    elif not rows:
        print("no batches")
    for row in rows if not args.json else []:
        print(_summary(store, row))
    return EXIT_OK


def _show(args: argparse.Namespace, store: BatchStore) -> int:
    row = store.batch(args.batch_id)
    if row is None:
        print(f"loraplex: no batch {args.batch_id}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(batch_object(row, store.counts(row["id"])).model_dump(), indent=2))
        return EXIT_OK
    while True:
        line = _summary(store, row)
        if not args.watch or row["status"] not in UNFINISHED:
            break
        print("\r" + line, end="", flush=True)
        time.sleep(WATCH_EVERY_S)
        row = store.batch(args.batch_id)
    print(("\r" if args.watch else "") + line)
    batch = batch_object(row, store.counts(row["id"]))
    for name in ("input_file_id", "output_file_id", "error_file_id"):
        if getattr(batch, name):
            print(f"  {name}: {getattr(batch, name)}")
    for error in (batch.errors.data if batch.errors else []):
        print(f"  line {error.line}: {error.code}: {error.message}" if error.line else f"  {error.code}: "
              f"{error.message}")
    return EXIT_OK


def _cancel(args: argparse.Namespace, store: BatchStore) -> int:
    row = store.batch(args.batch_id)
    if row is None:
        print(f"loraplex: no batch {args.batch_id}", file=sys.stderr)
        return EXIT_FAILED
    if not store.set_status(args.batch_id, "cancelling", "cancelling_at", only_from=("validating", "in_progress")):
        print(f"loraplex: batch {args.batch_id} is {row['status']}; only a validating or running batch can be "
              "cancelled", file=sys.stderr)
        return EXIT_FAILED
    print(f"{args.batch_id} cancelling")
    return EXIT_OK
