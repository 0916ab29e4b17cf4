"""The data home: where loraplex keeps generated models, the registry, caches and the usage ledger."""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "LORAPLEX_HOME"


def data_home() -> Path:
    """`$LORAPLEX_HOME`, else `~/.local/share/loraplex`."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser()
    return Path.home() / ".local" / "share" / "loraplex"
