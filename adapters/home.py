"""The data home: where loraplex keeps generated models, the registry, caches and the usage ledger."""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "LORAPLEX_HOME"
DEMO_HOME_ENV = "LORAPLEX_DEMO_HOME"


def data_home() -> Path:
    """`$LORAPLEX_HOME`, else `~/.local/share/loraplex`."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser()
    return Path.home() / ".local" / "share" / "loraplex"


def demo_home() -> Path:
    """Where the embedded demo model and adapters are generated: `$LORAPLEX_DEMO_HOME`, else the data home.

    A container image generates them at build time into a folder of its own, so they are there whatever
    volume is mounted on the data home."""
    if os.environ.get(DEMO_HOME_ENV):
        return Path(os.environ[DEMO_HOME_ENV]).expanduser()
    return data_home()
