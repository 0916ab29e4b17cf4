"""Paths of the deployment files, the drain arithmetic, and the command-line tools the checks run (installed by the
`test` extra)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from api.config import ServingOptions

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
K8S = DOCKER / "k8s"
DRAIN_TIMEOUT_S: float = ServingOptions.model_fields["drain_timeout_s"].default
UVICORN_CUT_S = 5.0  # api/cli/serve.py: uvicorn's timeout_graceful_shutdown after the drain
SHUTDOWN_MARGIN_S = 10.0  # engine shutdown and the ledger's last writes, measured at a few seconds


def tool(name: str) -> str:
    """A command of the test extra: beside this interpreter (the venv's bin/) first, then on PATH."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: install the test extra (pip install -e '.[test]')")
    return found
